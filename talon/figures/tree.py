"""The draft tree of one step: layered tidy layout (x = depth), colour = source, accepted path in
bold, rejected and unreached nodes faded, gated-out nodes crossed, the bonus token as a star."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import networkx as nx
import plotly.graph_objects as go

from talon.figures.common import (
    EDGE_COLOR,
    MAX_NODE_LABELS,
    PATH_COLOR,
    SOURCE_COLORS,
    SOURCE_NAMES,
    STATUS_OPACITY,
    Trace,
    axis_style,
    base_layout,
    legend_top,
    make_figure,
    node_status,
)
from talon.figures.text import esc, fmt_number, token_label, token_vocab
from talon.trace import StepTrace
from talon.tree import TRACE_SOURCES

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
        _edge_trace([(step.accepted[-1], bonus)], pos, dict(color=SOURCE_COLORS[step.bonus_kind], width=3, dash="dot")),
    ]
    labels = n <= MAX_NODE_LABELS
    for source in TRACE_SOURCES:
        nodes = [i for i in range(n) if step.sources[i] == source]
        if nodes:
            traces.append(_node_trace(step, nodes, source, status, pos, vocab, labels))
            traces.append(_legend_key(SOURCE_NAMES[source], source, SOURCE_COLORS[source], "circle"))
    if any(passed is False for passed in step.gate_passed):
        traces.append(_legend_key(GATED_NAME, "gated", "#888888", "circle-x"))
    traces.append(_bonus_trace(step, pos[bonus], vocab))
    leaves = sum(1 for v in graph.nodes if graph.out_degree(v) == 0)
    rows = [y for _, y in pos.values()]
    title = f"Draft tree, step {step.step}: {n - 1} drafted, {step.accept_len} accepted + bonus"
    layout = base_layout(
        title,
        max(340, min(1400, 30 * leaves + 150)),
        xaxis=axis_style("depth (tokens ahead of the committed text)", dtick=1, zeroline=False),
        # room above the top row for its labels (autorange pads for markers only, and a label
        # cut there ran into the legend)
        yaxis=dict(visible=False, range=[min(rows) - 0.5, max(rows) + 0.9]),
        legend=legend_top(),
        margin=dict(l=20, r=20, t=110, b=20),
    )
    return make_figure(traces, layout)


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
        legendgroup=source,
        showlegend=False,  # the legend draws a plain key (_legend_key), not the first node's marker
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


GATED_NAME = "gated out (⊗, not expanded)"


def _legend_key(name: str, group: str, color: str, symbol: str) -> Trace:
    """A legend entry with no points: a node trace's own entry would take the marker of its
    first node (faded, or crossed when the gate cut it)."""
    return dict(type="scatter", x=[None], y=[None], mode="markers", name=name, legendgroup=group,
                hoverinfo="skip", marker=dict(color=color, size=13, symbol=symbol, line=dict(color="white", width=1)))


def _node_hover(step: StepTrace, node: int, status: str, vocab: Mapping[int, str]) -> str:
    where = f"node {node}, depth {step.depths[node]}"
    if node < len(step.positions):
        where += f", position {step.positions[node]}"
    lines = [f"<b>{token_label(step.texts[node])}</b>  ({where})"]
    if node == 0:
        lines.append("root: the last committed token")
    else:
        lines.append(f"source: {SOURCE_NAMES.get(step.sources[node], esc(step.sources[node]))}")
        lines.append(f"q = {fmt_number(step.q_draft[node])} · path confidence c = {fmt_number(step.path_conf[node])}")
        wanted = step.target_top1[step.parents[node]]
        if status != "unreached":
            lines.append(f"target's top-1 here: {token_label(vocab.get(wanted, f'#{wanted}'))}")
        lines.append(VERDICTS[status])
        if node < len(step.p_target) and step.p_target[node] is not None:
            p_accept = step.p_accept[node] if node < len(step.p_accept) else None
            lines.append(f"p_target = {fmt_number(step.p_target[node])} · p_accept = {fmt_number(p_accept)}")
    passed = step.gate_passed[node]
    if passed is not None:
        verdict = "expanded" if passed else "gated out (not expanded)"
        lines.append(f"gate: c {'≥' if passed else '<'} threshold {fmt_number(step.gate_threshold[node])} → {verdict}")
    if status != "unreached" and node < len(step.target_topk_ids):
        lines.append("target's next-token top 5 after it: " + topk_line(step, node, vocab))
    return "<br>".join(lines)


def topk_line(step: StepTrace, node: int, vocab: Mapping[int, str]) -> str:
    """The target's top 5 after ``node``, as 'tok' 0.62 · 'tok' 0.21 ... (hover text)."""
    pairs = zip(step.target_topk_ids[node], step.target_topk_probs[node])
    return " · ".join(f"{token_label(vocab.get(t, f'#{t}'), 8)} {p:.2f}" for t, p in pairs)


VERDICTS: dict[str, str] = {
    "accepted": "✔ accepted",
    "rejected": "✘ rejected by the target",
    "unreached": "not reached (an ancestor was rejected)",
}


BONUS_HOVER: dict[str, str] = {
    "bonus": "bonus token: every draft on the path was accepted, so the target<br>"
    "adds one more token of its own, a free draw after the last of them",
    "resampled": "resampled: the target rejected the draft(s) after the last accepted node<br>"
    "and puts its own token in their place (under sampling, drawn from<br>"
    "what the rejected drafts left of its distribution)",
}
BONUS_SYMBOLS: dict[str, str] = {"bonus": "star", "resampled": "diamond"}


def _bonus_trace(step: StepTrace, xy: tuple[float, float], vocab: Mapping[int, str]) -> Trace:
    kind = step.bonus_kind
    hover = f"<b>{token_label(step.bonus_text)}</b>  {BONUS_HOVER[kind]}<br>every step commits at least this one"
    if step.residual_topk:
        left = " · ".join(f"{token_label(vocab.get(t, f'#{t}'), 8)} {p:.2f}" for t, p in step.residual_topk)
        hover += f"<br>residual top 5: {left}"
    return dict(
        type="scatter",
        x=[xy[0]],
        y=[xy[1]],
        mode="markers+text",
        name=SOURCE_NAMES[kind],
        text=[token_label(step.bonus_text, 10)],
        textposition="top center",
        textfont=dict(size=11, color=SOURCE_COLORS[kind]),
        hovertext=[hover],
        hoverinfo="text",
        marker=dict(symbol=BONUS_SYMBOLS[kind], size=22 if kind == "bonus" else 18, color=SOURCE_COLORS[kind],
                    line=dict(color=PATH_COLOR, width=1.5)),
    )
