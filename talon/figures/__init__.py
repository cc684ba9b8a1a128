"""Traces -> Plotly figures and HTML. Pure functions: no model, no Gradio, no I/O (but ``export``).

Every figure is a function of ``StepTrace`` records (and, for sweeps, of result rows), so
scrubbing to an old step re-plots without re-running a model and a saved trace replays with no
model at all. All user and model text is escaped here (``html.escape`` after making control
characters visible), both in HTML and in Plotly hovers and labels, which Plotly renders as a
subset of HTML.

The package, one job per module:

* ``text``: control characters made visible, then HTML-escaped (``esc``, ``token_label``);
* ``common``: the palette, node status and committed tokens of a step, Plotly plumbing;
* ``tree``: the draft tree of one step;
* ``gates``, ``mask``, ``timeline``: the other per-step figures (confidence gates, tree attention mask, the
  timeline with plain decoding on the same clock);
* ``payoff``: plain decoding's rate beside every speed (measured, or from the cost curve), a step's verdict;
* ``run``: run-level figures (tokens per step, acceptance by depth, sources, tokens/s);
* ``sweep``: figures over several runs: Compare and the mu x N heatmaps;
* ``atlas``: the atlas explorer: heatmaps and a Pareto chart of replayed configurations, their score;
* ``markup``: HTML: the streamed text, the step caption, the run summary;
* ``cost``: the cost view (measured cost curves, the run's steps, goodput by tree size);
* ``adaptive``: the adaptive draft-length rules: one rule's lengths against the oracle, every rule's best;
* ``accept``: the acceptance rule drawn for one node (p, q, what was kept; the textbook rule's bridge);
* ``predict``: HTML: a question whose verdict shows once an answer is pressed (the walk's, the exercises);
* ``glossary``: each term a newcomer meets, defined at its first use in a text (``define``);
* ``inspect``: HTML: the node inspector (the target's top 5 at a node, verdict, position);
* ``walk``: HTML: the guided walk's seven stops through one step (one a question), with that step's numbers;
* ``lessons``: the lessons' figures and words (of ``talon.lessons`` results);
* ``opening``: which step of a run the page opens on (``opening_step``), and the bundled recording;
* ``export``: a run and the lessons as one offline HTML file (it reads the app's stylesheet).

Every public name of the figure modules is re-exported here, so ``from talon import figures as F; F.tree_figure(...)``
works.
"""

from __future__ import annotations

from talon.figures.accept import RULE_WORDS, acceptance_figure
from talon.figures.adaptive import (
    RULE_SOURCES,
    length_lesson_figure,
    length_lesson_words,
    lengths_figure,
    rules_table_html,
)
from talon.figures.atlas import (
    ATLAS_METRICS,
    KNOB_NAMES,
    atlas_grid,
    atlas_heatmap,
    atlas_score_html,
    best_words,
    config_words,
    coverage_words,
    pareto_figure,
)
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
from talon.figures.cost import cost_figure, expected_rate
from talon.figures.gates import THRESHOLD_LINES, gate_figure
from talon.figures.glossary import GLOSSARY, LEAD_WORDS, define, fold, undefined, words_shown
from talon.figures.inspect import (
    NEAR_TIE_LOGITS,
    default_node,
    near_tie,
    node_choices,
    node_inspector_html,
    node_inspector_html_empty,
)
from talon.figures.markup import (
    model_skipped_most,
    step_caption_html,
    summary_html,
    text_html,
)
from talon.figures.mask import mask_figure, mask_row_label
from talon.figures.payoff import PlainRate, parting_words, plain_rate, step_verdict, verify_at
from talon.figures.predict import Choice, predict_html
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
from talon.figures.sweep import (
    SWEEP_METRICS,
    MeasuredCell,
    compare_figure,
    sweep_grid,
    sweep_heatmap,
)
from talon.figures.text import (
    INVISIBLE,
    WHITESPACE,
    clean_text,
    esc,
    short_text,
    token_label,
    token_vocab,
    visible_ws,
)
from talon.figures.timeline import timeline_figure
from talon.figures.tree import (
    BONUS_SYMBOLS,
    VERDICTS,
    tidy_layout,
    topk_line,
    tree_figure,
    tree_graph,
)
from talon.figures.walk import WALK, WalkStop, walk_html

__all__ = [
    "RULE_SOURCES",
    "length_lesson_figure",
    "length_lesson_words",
    "lengths_figure",
    "rules_table_html",
    "GLOSSARY",
    "define",
    "fold",
    "words_shown",
    "LEAD_WORDS",
    "undefined",
    "RULE_WORDS",
    "acceptance_figure",
    "ATLAS_METRICS",
    "BONUS_SYMBOLS",
    "COMMIT_SOURCES",
    "EDGE_COLOR",
    "FONT",
    "GATED_COLOR",
    "INVISIBLE",
    "KNOB_NAMES",
    "MAX_MASK_HOVER",
    "MAX_NODE_LABELS",
    "NEAR_TIE_LOGITS",
    "PASS_COLOR",
    "PATH_COLOR",
    "SOURCE_COLORS",
    "SOURCE_NAMES",
    "STATUS_OPACITY",
    "SWEEP_METRICS",
    "THRESHOLD_LINES",
    "VERDICTS",
    "WALK",
    "WHITESPACE",
    "Committed",
    "MeasuredCell",
    "PlainRate",
    "Trace",
    "WalkStop",
    "acceptance_by_depth",
    "acceptance_by_depth_figure",
    "accepted_per_step_figure",
    "atlas_grid",
    "atlas_heatmap",
    "atlas_score_html",
    "best_words",
    "clean_text",
    "committed_sources",
    "committed_tokens",
    "compare_figure",
    "config_words",
    "cost_figure",
    "coverage_words",
    "default_node",
    "empty_figure",
    "esc",
    "expected_rate",
    "gate_figure",
    "mask_figure",
    "mask_row_label",
    "model_skipped_most",
    "near_tie",
    "node_choices",
    "node_inspector_html",
    "node_inspector_html_empty",
    "node_status",
    "pareto_figure",
    "plain_rate",
    "parting_words",
    "predict_html",
    "Choice",
    "source_share_figure",
    "step_caption_html",
    "step_end_times",
    "step_verdict",
    "summary_html",
    "sweep_grid",
    "sweep_heatmap",
    "text_html",
    "throughput_figure",
    "tidy_layout",
    "timeline_figure",
    "short_text",
    "token_label",
    "token_vocab",
    "topk_line",
    "tree_figure",
    "tree_graph",
    "verify_at",
    "visible_ws",
    "walk_html",
]
