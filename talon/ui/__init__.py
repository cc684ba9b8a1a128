"""The Gradio app: layout, then wiring. Figures come from ``talon.figures`` (pure functions of
traces); models come from one cached loader; per-session data lives in ``gr.State``.

Tabs: Decode (one run, streamed, with a step slider and a step-through mode), Compare (two
configurations on one prompt), Threshold explorer (a draft atlas of the prompt, recorded once,
replayed exactly for every knob with no model; real-run mu x N sweeps and ``talon.bench --sweep``
results.json folded below). A run's trace downloads as JSON and replays with no model.

The package, one job per module:

* ``controls``: the run controls (``Controls``) validated into a RunConfig, ``user_error``;
* ``backend``: the cached model loader and presets, ZeroGPU, out-of-memory, ``DeviceRun``;
  ``pair``: the one model pair a server holds; ``launch``: serving the app;
* ``session``: per-session data kept in ``gr.State``, and Stop;
* ``stream``: when a streamed UI update is due;
* ``files``: trace downloads and upload paths (the trace format itself is ``talon.trace``);
* ``words``: the header and the figures' explanations; ``panel``: the control panel shared by
  every tab, and how a tab wires a model run;
* one module per tab, each with its view, handlers and ``build_<tab>_tab(panel, settings)``:
  ``decode_view`` (with ``walk_view``, the guided walk), ``compare_view``, ``explorer_view``
  (its model is ``talon.atlas.explorer``, free of Gradio; ``explorer_io``, recording and atlas files;
  ``measure_view``, the real-run grid below it), ``serving_view``;
* ``layout``: the page, the tabs, and the events that span them (``build_ui``).

``app.py`` needs only what is re-exported here.
"""

from __future__ import annotations

from talon.trace import MAX_UPLOAD_BYTES
from talon.ui.backend import warm_up
from talon.ui.layout import build_ui, theme
from talon.ui.panel import queue_limits

__all__ = ["MAX_UPLOAD_BYTES", "build_ui", "queue_limits", "theme", "warm_up"]
