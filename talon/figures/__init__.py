"""Traces -> Plotly figures and HTML. Pure functions: no model, no Gradio, no I/O.

Every figure is a function of ``StepTrace`` records (and, for sweeps, of result rows), so
scrubbing to an old step re-plots without re-running a model and a saved trace replays with no
model at all. All user and model text is escaped here (``html.escape`` after making control
characters visible), both in HTML and in Plotly hovers and labels, which Plotly renders as a
subset of HTML.

The package, one job per module:

* ``text``: control characters made visible, then HTML-escaped (``esc``, ``token_label``);
* ``common``: the palette, node status and committed tokens of a step, Plotly plumbing;
* ``tree``: the draft tree of one step;
* ``step``: the other per-step figures: confidence gates, attention mask, timeline;
* ``run``: run-level figures (tokens per step, acceptance by depth, sources, tokens/s);
* ``sweep``: figures over several runs: Compare and the mu x N heatmaps;
* ``markup``: HTML: the streamed text, the step caption, the run summary.

Every public name is re-exported here, so ``from talon import figures as F; F.tree_figure(...)``
works.
"""

from __future__ import annotations

from talon.figures.common import (
    EDGE_COLOR,
    FONT,
    GATED_COLOR,
    MAX_MASK_HOVER,
    MAX_NODE_LABELS,
    PASS_COLOR,
    PATH_COLOR,
    SOURCE_COLORS,
    SOURCE_NAMES,
    STATUS_OPACITY,
    Committed,
    Trace,
    committed_tokens,
    empty_figure,
    node_status,
)
from talon.figures.markup import (
    step_caption_html,
    summary_html,
    text_html,
)
from talon.figures.run import (
    COMMIT_SOURCES,
    acceptance_by_depth,
    acceptance_by_depth_figure,
    accepted_per_step_figure,
    committed_sources,
    source_share_figure,
    step_end_times,
    throughput_figure,
)
from talon.figures.step import (
    THRESHOLD_LINES,
    ancestor_mask,
    gate_figure,
    mask_figure,
    timeline_figure,
)
from talon.figures.sweep import (
    SWEEP_METRICS,
    SweepRow,
    compare_figure,
    sweep_grid,
    sweep_heatmap,
)
from talon.figures.text import (
    INVISIBLE,
    WHITESPACE,
    clean_text,
    esc,
    token_label,
    token_vocab,
    visible_ws,
)
from talon.figures.tree import (
    VERDICTS,
    tidy_layout,
    tree_figure,
    tree_graph,
)

__all__ = [
    "COMMIT_SOURCES",
    "EDGE_COLOR",
    "FONT",
    "GATED_COLOR",
    "INVISIBLE",
    "MAX_MASK_HOVER",
    "MAX_NODE_LABELS",
    "PASS_COLOR",
    "PATH_COLOR",
    "SOURCE_COLORS",
    "SOURCE_NAMES",
    "STATUS_OPACITY",
    "SWEEP_METRICS",
    "THRESHOLD_LINES",
    "VERDICTS",
    "WHITESPACE",
    "Committed",
    "SweepRow",
    "Trace",
    "acceptance_by_depth",
    "acceptance_by_depth_figure",
    "accepted_per_step_figure",
    "ancestor_mask",
    "clean_text",
    "committed_sources",
    "committed_tokens",
    "compare_figure",
    "empty_figure",
    "esc",
    "gate_figure",
    "mask_figure",
    "node_status",
    "source_share_figure",
    "step_caption_html",
    "step_end_times",
    "summary_html",
    "sweep_grid",
    "sweep_heatmap",
    "text_html",
    "throughput_figure",
    "tidy_layout",
    "timeline_figure",
    "token_label",
    "token_vocab",
    "tree_figure",
    "tree_graph",
    "visible_ws",
]
