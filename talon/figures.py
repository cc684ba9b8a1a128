"""Traces -> Plotly figures and HTML. Pure functions: no model, no Gradio, no I/O.

Every figure is a function of ``StepTrace`` records (and, for sweeps, of result rows), so
scrubbing to an old step re-plots without re-running a model and a saved trace replays with no
model at all. All user and model text is escaped here (``html.escape`` after making control
characters visible), both in HTML and in Plotly hovers and labels, which Plotly renders as a
subset of HTML.
"""

from __future__ import annotations

import html
import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import plotly.graph_objects as go

from talon.trace import RunSummary, StepTrace

# Okabe-Ito palette: distinguishable with the common colour-vision deficiencies.
SOURCE_COLORS: dict[str, str] = {
    "root": "#6b6b6b",
    "model": "#0072B2",
    "retrieval": "#E69F00",
    "both": "#CC79A7",
    "bonus": "#009E73",
}
SOURCE_NAMES: dict[str, str] = {
    "root": "root (last committed)",
    "model": "draft model",
    "retrieval": "retrieval",
    "both": "model + retrieval",
    "bonus": "target bonus token",
}
PASS_COLOR, GATED_COLOR, PATH_COLOR, EDGE_COLOR = "#0072B2", "#D55E00", "#111111", "#b9b9b9"
STATUS_OPACITY: dict[str, float] = {"root": 1.0, "accepted": 1.0, "rejected": 0.55, "unreached": 0.3}
FONT = dict(family="Inter, 'Segoe UI', system-ui, sans-serif", size=13, color="#222")
MAX_NODE_LABELS = 64  # beyond this the tree draws no token labels (hover still has them)
MAX_MASK_HOVER = 64  # beyond this the mask heatmap hovers show ids only
WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
# Bidirectional overrides and zero-width characters can disguise text: always show them as codes.
INVISIBLE = (
    {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"}
    | {chr(c) for c in range(0x202A, 0x202F)}
    | {chr(c) for c in range(0x2066, 0x206A)}
)


# ---------------------------------------------------------------------------------------------
# Text: control characters made visible, then HTML-escaped
# ---------------------------------------------------------------------------------------------


def _visible_char(ch: str) -> str:
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)  # U+2400 control pictures: ␀ ␇ ␛ ...
    if code == 0x7F:
        return "␡"
    if ch in INVISIBLE or unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn"):
        return f"\\u{code:04x}"
    return ch


def clean_text(text: str, keep: str = "\n\t") -> str:
    """``text`` with control/invisible characters replaced by visible stand-ins (``keep`` kept)."""
    return "".join(ch if ch in keep else _visible_char(ch) for ch in text)


def visible_ws(text: str) -> str:
    """Whitespace made visible (␣ ↵ ⇥) and other control characters shown as symbols."""
    return clean_text("".join(WHITESPACE.get(ch, ch) for ch in text), keep="")


def esc(text: str) -> str:
    """Safe for HTML text and attribute values (quotes escaped); newlines and tabs kept."""
    return html.escape(clean_text(text), quote=True)


def token_label(text: str, limit: int = 0) -> str:
    """A token as a short, escaped label with visible whitespace (for hovers and tick labels)."""
    shown = visible_ws(text)
    if limit and len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return html.escape(shown, quote=True)


def token_vocab(steps: Iterable[StepTrace]) -> dict[int, str]:
    """Token id -> text, from every token the steps know the text of (tree and bonus tokens)."""
    vocab: dict[int, str] = {}
    for st in steps:
        vocab.update(zip(st.tokens, st.texts))
        vocab[st.bonus_token] = st.bonus_text
    return vocab


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}g}"


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
    source: str  # model | retrieval | both | bonus
    node: int | None


def committed_tokens(step: StepTrace) -> list[Committed]:
    """The tokens this step committed, in order: accepted drafts then the bonus token,
    cut to ``new_tokens`` (a stop condition may end the step early)."""
    out = [Committed(step.texts[n], step.sources[n], n) for n in step.accepted[1:]]
    out.append(Committed(step.bonus_text, "bonus", None))
    return out[: len(step.new_tokens)]


def _layer_width(step: StepTrace) -> int:
    counts: dict[int, int] = {}
    for d in step.depths[1:]:
        counts[d] = counts.get(d, 0) + 1
    return max(counts.values(), default=0)


# ---------------------------------------------------------------------------------------------
# Figure plumbing: traces are plain dicts, validated once by the tests, not on every render
# ---------------------------------------------------------------------------------------------

Trace = dict[str, Any]


def _figure(traces: list[Trace], layout: dict[str, Any]) -> go.Figure:
    """A figure from plain trace/layout dicts, skipping plotly's per-call validation (which
    costs ~50 ms a figure, more than a decoding step of a small model). The tests check every
    builder's output against the schema."""
    return go.Figure(data=traces, layout=layout, _validate=False)


def _axis(title: str = "", **extra: Any) -> dict[str, Any]:
    axis: dict[str, Any] = dict(gridcolor="#ececec", zerolinecolor="#d0d0d0", linecolor="#c8c8c8", automargin=True)
    if title:
        axis["title"] = dict(text=html.escape(title))
    return {**axis, **extra}


def _base_layout(title: str, height: int, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = dict(
        title=dict(
            text=html.escape(title), x=0.01, xanchor="left", y=0.98, yref="container", yanchor="top", font=dict(size=15)
        ),
        font=FONT,
        height=height,
        paper_bgcolor="white",
        plot_bgcolor="white",
        margin=dict(l=50, r=20, t=80, b=40),
        hoverlabel=dict(font=dict(family=FONT["family"], size=13), align="left", bgcolor="white"),
        autosize=True,
        template=dict(layout=dict(colorway=list(SOURCE_COLORS.values()))),
        xaxis=_axis(),
        yaxis=_axis(),
    )
    return {**layout, **extra}


def _legend_top() -> dict[str, Any]:
    """A horizontal legend between the title and the plot (never over an axis title)."""
    return dict(orientation="h", x=0, xanchor="left", y=1.02, yanchor="bottom", font=dict(size=12))


def empty_figure(message: str, height: int = 260) -> go.Figure:
    """A blank figure that says why it is blank."""
    note = dict(
        text=esc(message), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=14, color="#666")
    )
    layout = _base_layout("", height, xaxis=dict(visible=False), yaxis=dict(visible=False), annotations=[note])
    return _figure([], layout)


# ---------------------------------------------------------------------------------------------
# (1) The draft tree
# ---------------------------------------------------------------------------------------------


def tree_graph(parents: Sequence[int]) -> nx.DiGraph:
    """Parent pointers as a directed tree rooted at node 0."""
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(parents)))
    graph.add_edges_from((p, n) for n, p in enumerate(parents) if p >= 0)
    return graph


def tidy_layout(graph: nx.DiGraph, root: int = 0) -> dict[int, tuple[float, float]]:
    """Layered tidy layout: x = depth, leaves on consecutive rows (children in id order, top
    down), every parent centred on the span of its children."""
    depth = nx.shortest_path_length(graph, root)
    row: dict[int, float] = {}
    next_leaf = 0
    for node in nx.dfs_postorder_nodes(graph, root, sort_neighbors=sorted):
        kids = list(graph.successors(node))
        if kids:
            row[node] = (min(row[k] for k in kids) + max(row[k] for k in kids)) / 2
        else:
            row[node] = float(next_leaf)
            next_leaf += 1
    return {n: (float(depth[n]), -row[n]) for n in row}


def _edge_xy(pairs: Iterable[tuple[int, int]], pos: Mapping[int, tuple[float, float]]) -> tuple[list, list]:
    xs: list[float | None] = []
    ys: list[float | None] = []
    for a, b in pairs:
        xs += [pos[a][0], pos[b][0], None]
        ys += [pos[a][1], pos[b][1], None]
    return xs, ys


def tree_figure(step: StepTrace, vocab: Mapping[int, str] | None = None) -> go.Figure:
    """The draft tree of one step: layered tidy layout (x = depth), colour = source, accepted
    path in bold, rejected / unreached nodes faded, gated-out nodes crossed (⊗), and the bonus
    token as a star after the last accepted node."""
    vocab = {**token_vocab([step]), **(vocab or {})}
    n = len(step.tokens)
    bonus = n  # laid out as a virtual last child of the last accepted node
    graph = tree_graph(list(step.parents) + [step.accepted[-1]])
    pos = tidy_layout(graph)
    status = node_status(step)
    on_path = set(zip(step.accepted[:-1], step.accepted[1:]))
    edges = [(p, c) for c, p in enumerate(step.parents) if p >= 0]
    traces = [
        _edge_trace([e for e in edges if e not in on_path], pos, dict(color=EDGE_COLOR, width=1.2)),
        _edge_trace([e for e in edges if e in on_path], pos, dict(color=PATH_COLOR, width=4)),
        _edge_trace([(step.accepted[-1], bonus)], pos, dict(color=SOURCE_COLORS["bonus"], width=3, dash="dot")),
    ]
    labels = n <= MAX_NODE_LABELS
    for source in ("root", "model", "retrieval", "both"):
        nodes = [i for i in range(n) if step.sources[i] == source]
        if nodes:
            traces.append(_node_trace(step, nodes, source, status, pos, vocab, labels))
    traces.append(_bonus_trace(step, pos[bonus]))
    leaves = sum(1 for v in graph.nodes if graph.out_degree(v) == 0)
    title = f"Draft tree, step {step.step}: {n - 1} drafted, {step.accept_len} accepted + bonus"
    layout = _base_layout(
        title,
        max(340, min(1400, 30 * leaves + 150)),
        xaxis=_axis("depth (tokens ahead of the committed text)", dtick=1, zeroline=False),
        yaxis=dict(visible=False),
        legend=_legend_top(),
        margin=dict(l=20, r=20, t=110, b=20),
    )
    return _figure(traces, layout)


def _edge_trace(pairs: list[tuple[int, int]], pos: Mapping[int, tuple[float, float]], line: dict) -> Trace:
    xs, ys = _edge_xy(pairs, pos)
    return dict(type="scatter", x=xs, y=ys, mode="lines", line=line, hoverinfo="skip", showlegend=False)


def _node_trace(
    step: StepTrace,
    nodes: list[int],
    source: str,
    status: list[str],
    pos: Mapping[int, tuple[float, float]],
    vocab: Mapping[int, str],
    labels: bool,
) -> Trace:
    bold = [status[i] in ("accepted", "root") for i in nodes]
    trace: Trace = dict(
        type="scatter",
        x=[pos[i][0] for i in nodes],
        y=[pos[i][1] for i in nodes],
        mode="markers+text" if labels else "markers",
        name=SOURCE_NAMES[source],
        textposition="top center",
        textfont=dict(size=11, color="#333"),
        hovertext=[_node_hover(step, i, status[i], vocab) for i in nodes],
        hoverinfo="text",
        customdata=nodes,
        marker=dict(
            color=SOURCE_COLORS[source],
            size=[18 if b else 13 for b in bold],
            opacity=[STATUS_OPACITY[status[i]] for i in nodes],
            symbol=["circle-x" if step.gate_passed[i] is False else "circle" for i in nodes],
            line=dict(color=[PATH_COLOR if b else "white" for b in bold], width=[3 if b else 1 for b in bold]),
        ),
    )
    if labels:
        trace["text"] = [token_label(step.texts[i], 10) for i in nodes]
    return trace


def _node_hover(step: StepTrace, node: int, status: str, vocab: Mapping[int, str]) -> str:
    lines = [f"<b>{token_label(step.texts[node])}</b>  (node {node}, depth {step.depths[node]})"]
    if node == 0:
        lines.append("root: the last committed token")
    else:
        lines.append(f"source: {SOURCE_NAMES.get(step.sources[node], esc(step.sources[node]))}")
        lines.append(f"q = {_fmt(step.q_draft[node])} · path confidence c = {_fmt(step.path_conf[node])}")
        wanted = step.target_top1[step.parents[node]]
        if status != "unreached":
            lines.append(f"target's top-1 here: {token_label(vocab.get(wanted, f'#{wanted}'))}")
        lines.append(VERDICTS[status])
        if node < len(step.p_target) and step.p_target[node] is not None:
            p_accept = step.p_accept[node] if node < len(step.p_accept) else None
            lines.append(f"p_target = {_fmt(step.p_target[node])} · p_accept = {_fmt(p_accept)}")
    passed = step.gate_passed[node]
    if passed is not None:
        verdict = "expanded" if passed else "gated out (not expanded)"
        lines.append(f"gate: c {'≥' if passed else '<'} threshold {_fmt(step.gate_threshold[node])} → {verdict}")
    return "<br>".join(lines)


VERDICTS: dict[str, str] = {
    "accepted": "✔ accepted",
    "rejected": "✘ rejected by the target",
    "unreached": "not reached (an ancestor was rejected)",
}


def _bonus_trace(step: StepTrace, xy: tuple[float, float]) -> Trace:
    hover = (
        f"<b>{token_label(step.bonus_text)}</b>  bonus token<br>"
        "the target's own next token after the accepted path:<br>every step commits at least this one"
    )
    return dict(
        type="scatter",
        x=[xy[0]],
        y=[xy[1]],
        mode="markers+text",
        name=SOURCE_NAMES["bonus"],
        text=[token_label(step.bonus_text, 10)],
        textposition="top center",
        textfont=dict(size=11, color=SOURCE_COLORS["bonus"]),
        hovertext=[hover],
        hoverinfo="text",
        marker=dict(symbol="star", size=22, color=SOURCE_COLORS["bonus"], line=dict(color=PATH_COLOR, width=1.5)),
    )


# ---------------------------------------------------------------------------------------------
# (2) Confidence gates
# ---------------------------------------------------------------------------------------------


def _spread(count: int, width: float = 0.56) -> list[float]:
    """Horizontal offsets that spread ``count`` points of one layer around its depth."""
    if count <= 1:
        return [0.0] * count
    return [-width / 2 + width * i / (count - 1) for i in range(count)]


THRESHOLD_LINES = (("threshold (μ × max)", "dash", GATED_COLOR), ("layer max", "dot", "#888"))


def gate_figure(step: StepTrace) -> go.Figure:
    """Per layer, each candidate's path confidence (log scale) against the layer's threshold
    (mu x the layer's best confidence, for the adaptive tree): above it expands, below it not."""
    gated = [i for i, p in enumerate(step.gate_passed) if p is not None]
    if not gated:
        return empty_figure(
            f"Step {step.step}: no confidence gate in this tree (chain, retrieval only, or root layer only)."
        )
    traces: list[Trace] = []
    xs: dict[int, float] = {}
    for depth in sorted({step.depths[i] for i in gated}):
        layer = sorted((i for i in gated if step.depths[i] == depth), key=lambda i: -step.path_conf[i])
        xs.update({i: depth + dx for i, dx in zip(layer, _spread(len(layer)))})
        traces += _threshold_traces(step, layer[0], depth)
    traces += [
        dict(type="scatter", x=[None], y=[None], mode="lines", name=name, line=dict(color=color, dash=dash, width=2))
        for name, dash, color in THRESHOLD_LINES
    ]
    for passed, name, color, symbol in (
        (True, "expanded (c ≥ threshold)", PASS_COLOR, "circle"),
        (False, "gated out (c < threshold)", GATED_COLOR, "x"),
    ):
        nodes = [i for i in gated if step.gate_passed[i] is passed]
        traces.append(
            dict(
                type="scatter",
                x=[xs[i] for i in nodes],
                y=[max(step.path_conf[i], 1e-12) for i in nodes],
                mode="markers",
                name=name,
                marker=dict(color=color, size=11, symbol=symbol, line=dict(color="white", width=1)),
                hovertext=[_gate_hover(step, i) for i in nodes],
                hoverinfo="text",
            )
        )
    layout = _base_layout(
        f"Confidence gates, step {step.step}",
        340,
        xaxis=_axis("layer (depth)", dtick=1),
        yaxis=_axis("path confidence c (log)", type="log", exponentformat="power"),
        legend=_legend_top(),
    )
    return _figure(traces, layout)


def _threshold_traces(step: StepTrace, node: int, depth: int) -> list[Trace]:
    """Short horizontal segments at one layer's threshold and best confidence."""
    values = (step.gate_threshold[node], step.gate_layer_max[node])
    return [
        dict(
            type="scatter",
            x=[depth - 0.38, depth + 0.38],
            y=[value, value],
            mode="lines",
            line=dict(color=color, dash=dash, width=2),
            showlegend=False,
            hovertext=[f"layer {depth}: {name} = {_fmt(value)}"] * 2,
            hoverinfo="text",
        )
        for value, (name, dash, color) in zip(values, THRESHOLD_LINES)
        if value is not None and value > 0
    ]


def _gate_hover(step: StepTrace, node: int) -> str:
    passed = step.gate_passed[node]
    return (
        f"<b>{token_label(step.texts[node])}</b> (node {node}, depth {step.depths[node]})<br>"
        f"c = {_fmt(step.path_conf[node])}<br>"
        f"layer max = {_fmt(step.gate_layer_max[node])} · threshold = {_fmt(step.gate_threshold[node])}<br>"
        + ("expanded: proposes children" if passed else "gated out: too unsure to expand")
    )


# ---------------------------------------------------------------------------------------------
# (3) Tree attention mask
# ---------------------------------------------------------------------------------------------


def ancestor_mask(parents: Sequence[int]) -> list[list[bool]]:
    """(T, T) bool as nested lists: row i is True at i and at every ancestor of i."""
    rows: list[list[bool]] = []
    for node, parent in enumerate(parents):
        row = list(rows[parent]) if parent >= 0 else [False] * len(parents)
        row[node] = True
        rows.append(row)
    return rows


def mask_figure(step: StepTrace) -> go.Figure:
    """The tree attention mask of the verification forward: row = query node, column = key node;
    a node attends to itself and its ancestors (and to the whole committed prefix, not drawn)."""
    n = len(step.tokens)
    on_path = set(step.accepted)
    mask = ancestor_mask(step.parents)
    z = [[(2 if i in on_path else 1) if mask[i][j] else 0 for j in range(n)] for i in range(n)]
    heat: Trace = dict(
        type="heatmap",
        z=z,
        x=list(range(n)),
        y=list(range(n)),
        zmin=0,
        zmax=2,
        colorscale=[
            [0, "#f2f2f2"],
            [0.33, "#f2f2f2"],
            [0.34, "#8ab6d6"],
            [0.66, "#8ab6d6"],
            [0.67, "#1b4f72"],
            [1, "#1b4f72"],
        ],
        showscale=False,
        xgap=1,
        ygap=1,
    )
    if n <= MAX_MASK_HOVER:
        heat.update(
            hovertext=[[_mask_hover(step, i, j, mask[i][j]) for j in range(n)] for i in range(n)], hoverinfo="text"
        )
    else:
        heat.update(hovertemplate="query node %{y} → key node %{x}<extra></extra>")
    ticks = dict(
        tickmode="array",
        tickvals=list(range(n)),
        ticktext=[f"{i}:{token_label(step.texts[i], 8)}" for i in range(n)],
        showticklabels=n <= MAX_NODE_LABELS,
        tickfont=dict(size=9),
        showgrid=False,
    )
    layout = _base_layout(
        f"Tree attention mask, step {step.step} ({n}×{n})",
        max(320, min(760, 16 * n + 160)),
        xaxis=_axis("key node (attended to)", **ticks),
        yaxis=_axis("query node", autorange="reversed", scaleanchor="x", **ticks),
    )
    return _figure([heat], layout)


def _mask_hover(step: StepTrace, i: int, j: int, visible: bool) -> str:
    verb = "attends to" if visible else "cannot see"
    return f"node {i} {token_label(step.texts[i], 12)} {verb} node {j} {token_label(step.texts[j], 12)}"


# ---------------------------------------------------------------------------------------------
# (4) Async timeline
# ---------------------------------------------------------------------------------------------


def timeline_figure(steps: Sequence[StepTrace], selected: int | None = None, window: int = 10) -> go.Figure:
    """Drafter and verifier busy intervals of the last ``window`` steps up to ``selected``.
    Synchronous decoding alternates the two rows; asynchronous drafting overlaps them."""
    if not steps:
        return empty_figure("No steps yet.")
    end = len(steps) - 1 if selected is None else max(0, min(selected, len(steps) - 1))
    shown = steps[max(0, end - window + 1) : end + 1]
    current = steps[end].step
    traces = [
        _lane_trace(lane, [(st, a, b) for st in shown for a, b in getattr(st, attr)], color, current)
        for lane, attr, color in (
            ("drafter", "drafter_busy", SOURCE_COLORS["model"]),
            ("verifier", "verifier_busy", SOURCE_COLORS["bonus"]),
        )
    ]
    layout = _base_layout(
        f"Drafter / verifier timeline, steps {shown[0].step}–{shown[-1].step}",
        250,
        barmode="overlay",
        showlegend=False,
        margin=dict(l=70, r=20, t=50, b=40),
        xaxis=_axis("ms since the run started"),
        yaxis=_axis(categoryorder="array", categoryarray=["verifier", "drafter"]),
    )
    return _figure(traces, layout)


def _lane_trace(lane: str, bars: list[tuple[StepTrace, float, float]], color: str, current: int) -> Trace:
    now = [st.step == current for st, _, _ in bars]
    return dict(
        type="bar",
        orientation="h",
        name=lane,
        x=[(b - a) * 1e3 for _, a, b in bars],
        base=[a * 1e3 for _, a, _ in bars],
        y=[lane] * len(bars),
        marker=dict(
            color=color,
            opacity=[1.0 if c else 0.5 for c in now],
            line=dict(color=PATH_COLOR, width=[2 if c else 0 for c in now]),
        ),
        text=[f"s{st.step}" for st, _, _ in bars],
        textposition="inside",
        hovertext=[_interval_hover(lane, st, a, b) for st, a, b in bars],
        hoverinfo="text",
    )


def _interval_hover(lane: str, st: StepTrace, start: float, end: float) -> str:
    reuse = {True: "<br>pre-drafted tree reused", False: "<br>pre-drafted tree discarded", None: ""}[st.predraft_reused]
    return (
        f"step {st.step} · {lane} busy<br>{start * 1e3:.1f} → {end * 1e3:.1f} ms ({(end - start) * 1e3:.1f} ms){reuse}"
    )


# ---------------------------------------------------------------------------------------------
# Run-level figures
# ---------------------------------------------------------------------------------------------

COMMIT_SOURCES = ("bonus", "model", "retrieval", "both")


def committed_sources(step: StepTrace) -> dict[str, int]:
    """How many of this step's committed tokens came from each source (bonus included)."""
    counts = dict.fromkeys(COMMIT_SOURCES, 0)
    for tok in committed_tokens(step):
        counts[tok.source] = counts.get(tok.source, 0) + 1
    return counts


def accepted_per_step_figure(steps: Sequence[StepTrace], selected: int | None = None) -> go.Figure:
    """Committed tokens per step stacked by source, with the running mean (MAT)."""
    if not steps:
        return empty_figure("No steps yet.")
    x = [st.step for st in steps]
    per_step = [committed_sources(st) for st in steps]
    traces: list[Trace] = [
        dict(type="bar", x=x, y=[c[s] for c in per_step], name=SOURCE_NAMES[s], marker=dict(color=SOURCE_COLORS[s]))
        for s in COMMIT_SOURCES
    ]
    totals = [sum(c.values()) for c in per_step]
    running = [sum(totals[: i + 1]) / (i + 1) for i in range(len(totals))]
    traces.append(
        dict(type="scatter", x=x, y=running, mode="lines", name="running MAT", line=dict(color=PATH_COLOR, width=2))
    )
    shapes = []
    if selected is not None and 0 <= selected < len(steps):
        shapes.append(
            dict(
                type="line",
                xref="x",
                yref="paper",
                x0=x[selected],
                x1=x[selected],
                y0=0,
                y1=1,
                line=dict(color=GATED_COLOR, width=2, dash="dot"),
            )
        )
    layout = _base_layout(
        f"Tokens committed per step (MAT {running[-1]:.2f})",
        300,
        barmode="stack",
        xaxis=_axis("step"),
        yaxis=_axis("tokens", rangemode="tozero"),
        legend=_legend_top(),
        shapes=shapes,
    )
    return _figure(traces, layout)


def acceptance_by_depth(steps: Sequence[StepTrace]) -> list[tuple[int, int, int]]:
    """(depth d, steps whose tree reached depth d, steps whose accepted path reached depth d)."""
    deepest = max((max(st.depths) for st in steps), default=0)
    return [
        (d, sum(max(st.depths) >= d for st in steps), sum(st.accept_len >= d for st in steps))
        for d in range(1, deepest + 1)
    ]


def acceptance_by_depth_figure(steps: Sequence[StepTrace]) -> go.Figure:
    """Share of steps whose accepted path reaches each depth, among steps that drafted that deep."""
    rows = acceptance_by_depth(steps)
    if not rows:
        return empty_figure("No drafted tokens yet (autoregressive run, or no steps).")
    rates = [a / d if d else 0.0 for _, d, a in rows]
    bar: Trace = dict(
        type="bar",
        x=[d for d, _, _ in rows],
        y=rates,
        marker=dict(color=SOURCE_COLORS["model"]),
        text=[f"{r:.0%}" for r in rates],
        textposition="outside",
        hovertext=[f"depth {d}: accepted in {a} of {n} steps that drafted this deep" for d, n, a in rows],
        hoverinfo="text",
    )
    layout = _base_layout(
        "Acceptance by depth",
        300,
        xaxis=_axis("depth", dtick=1),
        yaxis=_axis("accepted share", range=[0, 1.15], tickformat=".0%"),
    )
    return _figure([bar], layout)


def source_share_figure(steps: Sequence[StepTrace]) -> go.Figure:
    """Which source produced the committed tokens (the bonus token is the target's own)."""
    totals = dict.fromkeys(COMMIT_SOURCES, 0)
    for st in steps:
        for source, count in committed_sources(st).items():
            totals[source] = totals.get(source, 0) + count
    keys = [s for s in COMMIT_SOURCES if totals[s]]
    if not keys:
        return empty_figure("No tokens yet.")
    pie: Trace = dict(
        type="pie",
        labels=[SOURCE_NAMES[s] for s in keys],
        values=[totals[s] for s in keys],
        marker=dict(colors=[SOURCE_COLORS[s] for s in keys]),
        hole=0.45,
        sort=False,
        textinfo="percent",
        hoverinfo="label+value+percent",
    )
    return _figure([pie], _base_layout("Committed tokens by source", 300))


def step_end_times(steps: Sequence[StepTrace]) -> list[float]:
    """Seconds since the run started at which each step finished (from the timeline when
    recorded, else from the sum of the phase timings)."""
    ends: list[float] = []
    clock = 0.0
    for st in steps:
        marks = [b for _, b in list(st.drafter_busy) + list(st.verifier_busy)]
        clock = max(marks) if marks else clock + st.draft_s + st.verify_s + st.other_s
        ends.append(clock)
    return ends


def throughput_figure(steps: Sequence[StepTrace]) -> go.Figure:
    """Tokens per second: per step (bars) and since the run started (line)."""
    if not steps:
        return empty_figure("No steps yet.")
    ends = step_end_times(steps)
    counts = [len(st.new_tokens) for st in steps]
    starts = [0.0] + ends[:-1]
    per_step = [c / (e - s) if e > s else 0.0 for c, s, e in zip(counts, starts, ends)]
    overall = [sum(counts[: i + 1]) / e if e > 0 else 0.0 for i, e in enumerate(ends)]
    x = [st.step for st in steps]
    traces: list[Trace] = [
        dict(type="bar", x=x, y=per_step, name="this step", marker=dict(color="#9ecae1")),
        dict(type="scatter", x=x, y=overall, mode="lines", name="since start", line=dict(color=PATH_COLOR, width=2)),
    ]
    layout = _base_layout(
        f"Tokens per second ({overall[-1]:.1f} overall)",
        300,
        xaxis=_axis("step"),
        yaxis=_axis("tokens / s", rangemode="tozero"),
        legend=_legend_top(),
    )
    return _figure(traces, layout)


def compare_figure(runs: Sequence[tuple[str, Sequence[StepTrace]]]) -> go.Figure:
    """Runs side by side: tokens committed per step (left), committed tokens over time (right)."""
    traces: list[Trace] = []
    for (label, steps), color in zip(runs, (SOURCE_COLORS["model"], GATED_COLOR, SOURCE_COLORS["bonus"])):
        counts = [len(st.new_tokens) for st in steps]
        cumulative = [sum(counts[: i + 1]) for i in range(len(counts))]
        name = esc(label)
        traces.append(
            dict(
                type="scatter",
                x=[st.step for st in steps],
                y=counts,
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line=dict(color=color),
            )
        )
        traces.append(
            dict(
                type="scatter",
                x=step_end_times(steps),
                y=cumulative,
                mode="lines",
                name=name,
                legendgroup=name,
                showlegend=False,
                line=dict(color=color, width=3),
                xaxis="x2",
                yaxis="y2",
            )
        )
    layout = _base_layout(
        "Compare: tokens per step (left) and committed tokens over time (right)",
        330,
        xaxis=_axis("step", domain=[0, 0.45]),
        yaxis=_axis("tokens per step", rangemode="tozero"),
        xaxis2=_axis("seconds", domain=[0.55, 1], anchor="y2"),
        yaxis2=_axis("committed tokens", rangemode="tozero", anchor="x2"),
        legend=_legend_top(),
    )
    return _figure(traces, layout)


# ---------------------------------------------------------------------------------------------
# Threshold explorer: mu x N heatmaps
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepRow:
    """One (mu, budget) measurement of a sweep; a metric is None where it was not measured."""

    suite: str
    method: str
    mu: float
    budget: int
    mat: float | None
    tokens_per_second: float | None
    speedup_vs_ar: float | None = None


SWEEP_METRICS: dict[str, tuple[str, str]] = {  # metric -> (title, colour-bar label)
    "mat": ("MAT (tokens per target forward)", "MAT"),
    "tokens_per_second": ("tokens per second", "tok/s"),
    "speedup_vs_ar": ("speedup vs autoregressive", "×AR"),
}


def sweep_grid(rows: Sequence[SweepRow], metric: str) -> tuple[list[float], list[int], list[list[float | None]]]:
    """(mus, budgets, z[mu][budget]): the mean of ``metric`` per cell, None where unmeasured."""
    cells: dict[tuple[float, int], list[float]] = {}
    for row in rows:
        value = getattr(row, metric)
        if value is not None and math.isfinite(value):
            cells.setdefault((row.mu, row.budget), []).append(value)
    mus = sorted({r.mu for r in rows})
    budgets = sorted({r.budget for r in rows})
    z = [[_mean(cells.get((m, b))) for b in budgets] for m in mus]
    return mus, budgets, z


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None


def sweep_heatmap(rows: Sequence[SweepRow], metric: str, title: str = "") -> go.Figure:
    """A mu (rows) x budget N (columns) heatmap of one metric, every cell labelled."""
    if not rows:
        return empty_figure("No sweep results yet: run a sweep or load a results.json.")
    mus, budgets, z = sweep_grid(rows, metric)
    label, short = SWEEP_METRICS.get(metric, (metric, metric))
    heat: Trace = dict(
        type="heatmap",
        z=z,
        x=[str(b) for b in budgets],
        y=[f"{m:g}" for m in mus],
        text=[["" if v is None else f"{v:.2f}" for v in row] for row in z],
        texttemplate="%{text}",
        colorscale="Viridis",
        colorbar=dict(title=dict(text=esc(short)), thickness=14),
        hovertemplate="μ = %{y}, N = %{x}<br>" + esc(label) + " = %{z:.3f}<extra></extra>",
    )
    layout = _base_layout(
        title or label,
        max(280, 48 * len(mus) + 150),
        xaxis=_axis("budget N", type="category"),
        yaxis=_axis("gate μ", type="category"),
    )
    return _figure([heat], layout)


# ---------------------------------------------------------------------------------------------
# HTML: streamed text with provenance, step caption, run summary
# ---------------------------------------------------------------------------------------------


def _token_title(st: StepTrace, tok: Committed) -> str:
    if tok.node is None:
        return f"step {st.step} · target bonus token (its own choice after the accepted drafts)"
    parts = [
        f"step {st.step}",
        f"{SOURCE_NAMES.get(tok.source, tok.source)} draft, depth {st.depths[tok.node]}",
        f"q {_fmt(st.q_draft[tok.node])}",
        f"c {_fmt(st.path_conf[tok.node])}",
    ]
    if tok.node < len(st.p_target) and st.p_target[tok.node] is not None:
        parts.append(f"p_target {_fmt(st.p_target[tok.node])}")
    return " · ".join(parts)


def _step_html(st: StepTrace, selected: bool) -> str:
    spans = [
        f'<span class="tk src-{esc(tok.source)}" title="{esc(_token_title(st, tok))}">{esc(tok.text)}</span>'
        for tok in committed_tokens(st)
    ]
    cls = "step sel" if selected else "step"
    parity = "odd" if st.step % 2 else "even"
    return f'<span class="{cls} {parity}" data-step="{st.step}">{"".join(spans)}</span>'


def text_html(
    steps: Sequence[StepTrace], upto: int | None = None, highlight: int | None = None, status: str = ""
) -> str:
    """The generated text, one span per token coloured by provenance, steps delimited.

    upto: show steps[0..upto] only (step-through); highlight: index of the step to emphasise."""
    shown = steps if upto is None else steps[: upto + 1]
    body = "".join(_step_html(st, i == highlight) for i, st in enumerate(shown))
    note = f'<div class="talon-status">{esc(status)}</div>' if status else ""
    placeholder = '<span class="talon-placeholder">The generated text appears here, token by token.</span>'
    return f'<div class="talon-text">{body or placeholder}</div>{note}'


def step_caption_html(steps: Sequence[StepTrace], index: int) -> str:
    """Plain-language account of one step: what was drafted, what the target accepted."""
    if not steps:
        return '<div class="talon-caption">No step to show yet.</div>'
    st = steps[index]
    tokens = committed_tokens(st)
    committed = "".join(f'<span class="tk src-{esc(t.source)}">{esc(t.text)}</span>' for t in tokens)
    retrieval = f", retrieval match {st.match_len} tokens" if st.match_len else ""
    return (
        f'<div class="talon-caption"><b>Step {st.step}</b> ({index + 1} of {len(steps)}): drafted '
        f"{len(st.tokens) - 1} nodes (depth {max(st.depths)}, widest layer {_layer_width(st)}{retrieval}); "
        f"the target accepted {st.accept_len} and added its bonus token → {len(tokens)} committed: "
        f'<span class="talon-committed">{committed}</span> · draft {st.draft_s * 1e3:.0f} ms, '
        f"verify {st.verify_s * 1e3:.0f} ms</div>"
    )


def summary_html(
    summary: RunSummary | None, steps: Sequence[StepTrace], ar: RunSummary | None = None, status: str = ""
) -> str:
    """Run summary: MAT, tokens/s, time split, and the speedup over autoregressive if measured."""
    if summary is None and not steps:
        return f'<div class="talon-summary">{esc(status) or "Press Run to start."}</div>'
    tokens = sum(len(st.new_tokens) for st in steps)
    mat = tokens / len(steps) if steps else 0.0
    seconds = summary.seconds if summary else (step_end_times(steps)[-1] if steps else 0.0)
    tps = tokens / seconds if seconds > 0 else 0.0
    cells = [
        ("MAT", f"{mat:.2f}"),
        ("tokens/s", f"{tps:.1f}"),
        ("tokens", str(tokens)),
        ("steps", str(len(steps))),
        ("seconds", f"{seconds:.2f}"),
    ]
    if ar is not None and ar.tokens_per_second > 0:
        cells.append(("speedup vs AR", f"{tps / ar.tokens_per_second:.2f}×"))
        cells.append(("AR tokens/s", f"{ar.tokens_per_second:.1f}"))
    stats = "".join(
        f'<div class="stat"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>' for k, v in cells
    )
    detail = _summary_detail(summary, steps) if summary else ""
    note = f'<div class="talon-status">{esc(status)}</div>' if status else ""
    return f'<div class="talon-summary"><div class="stats">{stats}</div>{detail}{note}</div>'


def _summary_detail(summary: RunSummary, steps: Sequence[StepTrace]) -> str:
    draft_s = sum(st.draft_s for st in steps)
    verify_s = sum(st.verify_s for st in steps)
    other_s = sum(st.other_s for st in steps)
    total = max(draft_s + verify_s + other_s, 1e-9)
    parts = [
        f"target {esc(_short(summary.target))} · draft {esc(_short(summary.draft))}"
        f" · {esc(summary.dtype)} on {esc(summary.device)}",
        f"time: draft {draft_s / total:.0%} · verify {verify_s / total:.0%} · other {other_s / total:.0%}",
        f"stopped: {esc(summary.stop_reason or '–')}",
    ]
    return '<div class="detail">' + "<br>".join(parts) + "</div>"


def _short(name: str) -> str:
    """The last two path components of a model name (local paths are long)."""
    return "/".join(name.rstrip("/").split("/")[-2:]) if name else "–"
