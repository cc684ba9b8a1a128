"""The acceptance rule, drawn for one node: the target's p and the draft's q after the node's
parent, what the target kept, and under sampling the chance each tried sibling had.

The textbook rule (Leviathan et al. 2023; Chen et al. 2023) keeps a draft x *sampled from q* with
probability min(1, p(x) / q(x)) and, on a rejection, draws from the residual max(0, p - q),
renormalised. Talon's drafts are not sampled: they are fixed (the draft's top-k, retrieval's
continuation), so for each one q is all on x, min(1, p(x) / 1) = p(x), and the residual is p
with x removed and renormalised: Talon's rule (``talon.core.accept.accept_sampling``), tried on
the siblings in order. Under greedy decoding a draft is kept when it is the target's top token.
"""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from talon.figures.common import (
    GATED_COLOR,
    PASS_COLOR,
    SOURCE_COLORS,
    Trace,
    axis_style,
    base_layout,
    empty_figure,
    make_figure,
    node_status,
)
from talon.figures.text import token_label, token_vocab
from talon.trace import StepTrace

RULE_WORDS = (
    "Textbook rule: a draft x sampled from q is kept with probability min(1, p(x)/q(x)); on a rejection the "
    "target draws from max(0, p − q), renormalised. Talon's drafts are fixed, not sampled (q is all on x), so "
    "the rule becomes: keep x with probability p(x), else remove x from p, renormalise, try the next sibling. "
    "Under greedy decoding a draft is kept when it is the target's top token."
)


def acceptance_figure(step: StepTrace, node: int, sampled: bool | None = None,
                      vocab: Mapping[int, str] | None = None) -> go.Figure:
    """For ``node`` (not the root): bars of the target's p (its top 5 after the parent, and each
    drafted sibling's p where it was tried) and the draft's q for the siblings, the kept token
    marked; under sampling, each tried sibling's chance of being kept (p of what was left).
    ``sampled`` None: read from the step (a sampled step records each tried node's chance)."""
    if sampled is None:
        sampled = any(p is not None for p in step.p_accept)
    if not 0 < node < len(step.tokens):
        return empty_figure("Pick a drafted node (not the root) to see how the target decided it.")
    vocab = {**token_vocab([step]), **(vocab or {})}
    parent = step.parents[node]
    siblings = [c for c in range(1, len(step.tokens)) if step.parents[c] == parent]
    p_top = dict(zip(step.target_topk_ids[parent], step.target_topk_probs[parent])) if step.target_topk_ids else {}
    for c in siblings:
        if sampled and step.p_target and step.p_target[c] is not None:
            p_top.setdefault(step.tokens[c], step.p_target[c])
    tokens = list(dict.fromkeys([*(step.tokens[c] for c in siblings), *p_top]))
    labels = [token_label(vocab.get(t, f"⟨{t}⟩"), 12) for t in tokens]
    labels = [f"{label} ({t})" if labels.count(label) > 1 else label for label, t in zip(labels, tokens)]
    status = node_status(step)
    kept = {step.tokens[c] for c in siblings if status[c] == "accepted"}
    q = {step.tokens[c]: step.q_draft[c] for c in siblings}
    traces: list[Trace] = [
        dict(type="bar", name="target p", x=labels, y=[p_top.get(t) for t in tokens],
             marker=dict(color=[SOURCE_COLORS["bonus"] if t in kept else "#9a9a9a" for t in tokens]),
             hovertext=[f"target p = {p_top[t]:.3f}" if t in p_top else "not among the target's top 5"
                        for t in tokens], hoverinfo="text+x"),
        dict(type="bar", name="draft q", x=labels, y=[q.get(t) for t in tokens],
             marker=dict(color=SOURCE_COLORS["model"], opacity=0.75)),
    ]
    if sampled and step.p_accept:
        chance = {step.tokens[c]: step.p_accept[c] for c in siblings if step.p_accept[c] is not None}
        traces.append(dict(type="bar", name="chance kept (p of what was left)", x=labels,
                           y=[chance.get(t) for t in tokens],
                           marker=dict(color=[PASS_COLOR if t in kept else GATED_COLOR for t in tokens],
                                       pattern=dict(shape="/"))))
    words = ("kept " + ", ".join(token_label(vocab.get(t, f"⟨{t}⟩"), 12) for t in kept) if kept else
             "none kept, the target drew its own" if sampled else "none kept, the target wrote its own")
    layout = base_layout(f"Node {node}'s siblings, {'sampled' if sampled else 'greedy'}: {words}",
                         300, barmode="group", margin=dict(l=60, r=20, t=60, b=60),
                         xaxis=axis_style("tokens after the parent"), yaxis=axis_style("probability", range=[0, 1]))
    return make_figure(traces, layout)
