"""The Gradio app: layout, then wiring. Figures come from ``talon.figures`` (pure functions of
traces); runs, presets and controls come from the server's facade (``talon.server.facade``, which
holds one model pair); per-session data lives in ``gr.State``.

Tabs: Decode (one run, streamed, with a step slider and a step-through mode), Compare (two
configurations on one prompt), Threshold explorer (a draft atlas of the prompt, recorded once,
replayed exactly for every knob with no model; real-run mu x N sweeps and ``talon.bench --sweep``
results.json folded below), Lessons (the papers' claims replayed on bundled atlases) and Serve it
(the controls as vLLM and SGLang flags). A run's trace downloads as JSON and replays with no model.

The views, one module per tab, each with its view, handlers and a ``build_<tab>_tab`` function:
``decode_tab`` (its view ``decode_view`` and handlers ``decode_handlers``; ``walk_panel``, the
guided walk), ``compare_tab``, ``explorer_tab`` (its model is ``talon.atlas.explorer``, free
of Gradio; ``measure_panel``, the real-run grid below it),
``lessons_tab`` and ``serve_tab``; around them ``layout`` (the page and the events that span the
tabs), ``panel`` (the control panel every tab shares), ``session`` (per-session data in
``gr.State``, and Stop), ``stream`` (when a streamed update is due), ``files`` (downloads and
uploads) and ``words`` (the header and the figures' explanations). Every run, preset and control
comes from the server through ``talon.server.facade``; no view imports torch, the engine or the
models (``tests/test_layers.py``).

``app.py`` needs only what is re-exported here.
"""

from __future__ import annotations

from talon.server.facade import initial_preset, warm_up
from talon.trace import MAX_UPLOAD_BYTES
from talon.ui.door import door_for
from talon.ui.layout import build_ui, theme
from talon.ui.panel import queue_limits

__all__ = ["MAX_UPLOAD_BYTES", "build_ui", "door_for", "initial_preset", "queue_limits", "theme", "warm_up"]
