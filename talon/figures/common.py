"""What every figure shares: the palette, how a step's nodes and committed tokens are read
(``node_status``, ``committed_tokens``), and the Plotly plumbing (figures from plain dicts,
axes, layout, legend, ``empty_figure``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from talon.figures.text import esc, escape
from talon.trace import StepTrace

# Okabe-Ito palette: distinguishable with the common colour-vision deficiencies.
SOURCE_COLORS: dict[str, str] = {
    "root": "#6b6b6b",
    "model": "#0072B2",
    "head": "#0072B2",  # an EAGLE-3 head drafts where a draft model would: never both in one run
    "mtp": "#332288",  # the target's own MTP layer: its own hue (Tol's indigo), apart from a draft model's blue
    "retrieval": "#E69F00",
    "both": "#CC79A7",
    "bonus": "#009E73",
    "resampled": "#56B4E9",
}
SOURCE_NAMES: dict[str, str] = {
    "root": "root (last committed)",
    "model": "draft model",
    "head": "EAGLE-3 head",
    "mtp": "MTP layer",
    "retrieval": "retrieval",
    "both": "model + retrieval",
    "bonus": "target bonus token",
    "resampled": "target token after a rejection",
}
PASS_COLOR, GATED_COLOR, PATH_COLOR, EDGE_COLOR = "#0072B2", "#D55E00", "#111111", "#b9b9b9"
STATUS_OPACITY: dict[str, float] = {"root": 1.0, "accepted": 1.0, "rejected": 0.55, "unreached": 0.3}
FONT = dict(family="Inter, 'Segoe UI', system-ui, sans-serif", size=13, color="#222")
MAX_NODE_LABELS = 64  # beyond this the tree draws no token labels (hover still has them)
MAX_MASK_HOVER = 64  # beyond this the mask heatmap hovers show ids only


# ---------------------------------------------------------------------------------------------
# One step: node status, committed tokens
# ---------------------------------------------------------------------------------------------


def node_status(step: StepTrace) -> list[str]:
    """Per node: root, accepted, rejected (the target checked it and chose otherwise) or
    unreached (an ancestor was rejected, so the target never considered it)."""
    accepted = set(step.accepted)
    status = []
    for node, parent in enumerate(step.parents):
        if node == 0:
            status.append("root")
        elif node in accepted:
            status.append("accepted")
        elif parent in accepted:
            status.append("rejected")
        else:
            status.append("unreached")
    return status


@dataclass(frozen=True)
class Committed:
    """One committed token: its text, where it came from, and the tree node it was (or None)."""

    text: str
    source: str  # model | retrieval | both | bonus | resampled
    node: int | None


def committed_tokens(step: StepTrace) -> list[Committed]:
    """The tokens this step committed, in order: accepted drafts then the target's own token
    (a bonus after a full path, or resampled after a rejection), cut to ``new_tokens`` (a stop
    condition may end the step early)."""
    out = [Committed(step.texts[n], step.sources[n], n) for n in step.accepted[1:]]
    out.append(Committed(step.bonus_text, step.bonus_kind, None))
    return out[: len(step.new_tokens)]


# ---------------------------------------------------------------------------------------------
# Figure plumbing: traces are plain dicts, validated once by the tests, not on every render
# ---------------------------------------------------------------------------------------------

Trace = dict[str, Any]


def make_figure(traces: list[Trace], layout: dict[str, Any]) -> go.Figure:
    """A figure from plain trace/layout dicts, skipping plotly's per-call validation (which
    costs ~50 ms a figure, more than a decoding step of a small model). The tests check every
    builder's output against the schema."""
    return go.Figure(data=traces, layout=layout, _validate=False)


def axis_style(title: str = "", **extra: Any) -> dict[str, Any]:
    axis: dict[str, Any] = dict(gridcolor="#ececec", zerolinecolor="#d0d0d0", linecolor="#c8c8c8", automargin=True)
    if title:
        axis["title"] = dict(text=escape(title))
    return {**axis, **extra}


def base_layout(title: str, height: int, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = dict(
        title=dict(
            text=escape(title), x=0.01, xanchor="left", y=0.98, yref="container", yanchor="top", font=dict(size=15)
        ),
        font=FONT,
        height=height,
        paper_bgcolor="white",
        plot_bgcolor="white",
        margin=dict(l=50, r=20, t=80, b=40),
        hoverlabel=dict(font=dict(family=FONT["family"], size=13), align="left", bgcolor="white"),
        autosize=True,
        uirevision="talon",  # a constant: the user's zoom and pan survive every update of this plot
        template=dict(layout=dict(colorway=list(SOURCE_COLORS.values()))),
        xaxis=axis_style(),
        yaxis=axis_style(),
    )
    return {**layout, **extra}


def legend_top() -> dict[str, Any]:
    """A horizontal legend between the title and the plot (never over an axis title)."""
    return dict(orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom", font=dict(size=12))


def empty_figure(message: str, height: int = 260) -> go.Figure:
    """A blank figure that says why it is blank."""
    note = dict(
        text=esc(message), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=14, color="#666")
    )
    layout = base_layout("", height, xaxis=dict(visible=False), yaxis=dict(visible=False), annotations=[note])
    return make_figure([], layout)
