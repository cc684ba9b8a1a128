"""The Gradio app: layout, then wiring. Figures come from ``talon.figures`` (pure functions of
traces); models come from one cached loader; per-session data lives in ``gr.State``.

Tabs: Decode (one run, streamed, with a step slider and a step-through mode), Compare (two
configurations on one prompt), Threshold explorer (a draft atlas of the prompt, recorded once,
replayed exactly for every knob with no model; real-run mu x N sweeps and ``talon.bench --sweep``
results.json folded below). A run's trace downloads as JSON and replays with no model.

The package, one job per module:

* ``controls``: the run controls (``Controls``, from the knob table) into a RunConfig, ``user_error``;
* the way of one request, one job each, in the order it descends (no module imports one above
  it: ``tests/test_layers.py``): ``actions`` (a user action's runs and their shared stream,
  ``DeviceAction``, ``DeviceRun``), ``device`` (the one device call, ZeroGPU, the Stop flags,
  ``Learned``), ``request`` (validated once: ``plan_run``, ``check_job``, ``Job``; ``open_run``),
  ``models`` (the presets, the pair held, the memory guard, out-of-memory), ``pair`` (the slot
  that releases before it loads); ``launch``: serving the app;
* ``session``: per-session data kept in ``gr.State``, and Stop;
* ``stream``: when a streamed UI update is due;
* ``files``: trace downloads and upload paths (the trace format itself is ``talon.trace``);
* ``words``: the header and the figures' explanations; ``panel``: the control panel shared by
  every tab, and how a tab wires a model run;
* one module per tab, each with its view, handlers and ``build_<tab>_tab(panel, settings)``:
  ``decode_view`` (its layout and wiring in ``decode_tab``; ``walk_view``, the guided walk),
  ``compare_view``, ``explorer_view`` (its layout in ``explorer_tab``, its words in
  ``explorer_words``; its model is ``talon.atlas.explorer``, free of Gradio; ``explorer_io``,
  recording and atlas files; ``measure_view``, the real-run grid below it), ``serving_view``;
* ``layout``: the page, the tabs, and the events that span them (``build_ui``).

``app.py`` needs only what is re-exported here.
"""

from __future__ import annotations

from talon.trace import MAX_UPLOAD_BYTES
from talon.ui.models import warm_up
from talon.ui.layout import build_ui, theme
from talon.ui.panel import queue_limits

__all__ = ["MAX_UPLOAD_BYTES", "build_ui", "queue_limits", "theme", "warm_up"]
