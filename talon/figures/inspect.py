"""The node inspector: for one node of one step, what the target wanted instead.

A node is decided by the target's distribution after its parent: the table shows that
distribution's top 5 with the drafted token marked, the verdict, the node's position id and,
under sampling, the acceptance probability and (after a rejection) the residual the target's
own token was drawn from. A second table shows what the target would write after the node.
Near-ties, two tokens whose logits differ by less than a bf16 rounding step, are flagged: they
are where a bf16 run and a float32 run can pick different tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from talon.figures.common import SOURCE_NAMES, node_status
from talon.figures.text import esc, fmt_number, short_text, token_label, token_vocab
from talon.trace import StepTrace

NEAR_TIE_LOGITS = 0.125  # one bf16 rounding step for logits of magnitude 16 to 32

VERDICT_WORDS: dict[str, str] = {
    "root": "the root: the last committed token, verified as node 0",
    "accepted": "accepted: the target agreed",
    "rejected": "rejected: the target chose otherwise",
    "unreached": "not reached: an ancestor was rejected, so the target never judged it",
}


def node_inspector_html_empty() -> str:
    return '<div class="talon-inspector">Run or replay to inspect the nodes of a step.</div>'


def node_choices(step: StepTrace) -> list[tuple[str, int]]:
    """Dropdown entries (label, node id) for every node of the step, in id order."""
    status = node_status(step)
    # a dropdown shows its labels as text (escaped by the page): visible whitespace, no HTML entities
    return [(f"{i} · {short_text(step.texts[i], 14)} · {status[i]}", i) for i in range(len(step.tokens))]


def default_node(step: StepTrace) -> int:
    """The most telling node: the first rejected one (the target's correction), else the last
    accepted one (what followed it was the bonus)."""
    status = node_status(step)
    rejected = [i for i, s in enumerate(status) if s == "rejected"]
    return rejected[0] if rejected else step.accepted[-1]


def near_tie(p1: float, p2: float) -> bool:
    """Are the two most likely tokens closer than a bf16 rounding step in logit?"""
    return p1 > 0 and p2 > 0 and math.log(p1 / p2) < NEAR_TIE_LOGITS


def node_inspector_html(step: StepTrace, node: int, vocab: Mapping[int, str] | None = None) -> str:
    """The full table for ``node`` of ``step`` (escaped HTML)."""
    if not 0 <= node < len(step.tokens):
        return '<div class="talon-inspector">Pick a node of this step.</div>'
    vocab = {**token_vocab([step]), **(vocab or {})}
    status = node_status(step)[node]
    facts = [
        f"<b>node {node}</b> {_tok(step.texts[node])}",
        SOURCE_NAMES.get(step.sources[node], esc(step.sources[node])),
        f"depth {step.depths[node]}",
    ]
    if node < len(step.positions):
        facts.append(f"position id {step.positions[node]}")
    if node:
        facts.append(f"q {fmt_number(step.q_draft[node])} · c {fmt_number(step.path_conf[node])}")
    if node < len(step.p_accept_est):
        facts.append(f"calibrated P(accepted) {fmt_number(step.p_accept_est[node])}")
    parts = [" · ".join(facts), f'<div class="verdict v-{status}">{VERDICT_WORDS[status]}</div>']
    if node and node < len(step.p_target) and step.p_target[node] is not None:
        p_accept = step.p_accept[node] if node < len(step.p_accept) else None
        parts.append(
            f"<div>sampling: the target's probability of this token p = {fmt_number(step.p_target[node])}; "
            f"acceptance probability {fmt_number(p_accept)} (p renormalised after the siblings tried before it "
            "were rejected)</div>"
        )
    parent = step.parents[node]
    if node and status != "unreached" and parent < len(step.target_topk_ids):
        parts.append(_table(step, parent, vocab, "What the target wanted here (its top 5 after the parent)",
                            mark=step.tokens[node]))
    if status in ("root", "accepted") and node < len(step.target_topk_ids):
        parts.append(_table(step, node, vocab, "What the target would write next (its top 5 after this node)",
                            mark=step.bonus_token if node == step.accepted[-1] else None))
        if node == step.accepted[-1]:
            parts.append(_last_token_note(step, vocab))
    if not step.target_topk_ids:
        parts.append("<div>This trace has no top-5 record (recorded by an older version).</div>")
    return f'<div class="talon-inspector">{"".join(parts)}</div>'


def _tok(text: str) -> str:
    return f'<code class="tok">{token_label(text, 40)}</code>'


def _table(step: StepTrace, at: int, vocab: Mapping[int, str], title: str, mark: int | None) -> str:
    ids, probs = step.target_topk_ids[at], step.target_topk_probs[at]
    rows = []
    for rank, (token, p) in enumerate(zip(ids, probs), 1):
        cls = ' class="mark"' if token == mark else ""
        rows.append(f"<tr{cls}><td>{rank}</td><td>{_tok(vocab.get(token, f'#{token}'))}</td>"
                    f"<td>{p:.4f}</td><td>{token}</td></tr>")
    notes = []
    if mark is not None and mark not in ids:
        notes.append(f"the marked token {_tok(vocab.get(mark, f'#{mark}'))} is not in the target's top 5")
    if len(probs) > 1 and near_tie(probs[0], probs[1]):
        gap = math.log(probs[0] / probs[1])
        notes.append(f"near-tie: the top two differ by {gap:.3f} in logit, less than a bf16 rounding step; "
                     "a bf16 and a float32 run may choose differently here")
    note = "".join(f'<div class="note">{n}</div>' for n in notes)
    return (f"<div class=\"tbl\"><div class=\"ttl\">{title}</div><table><thead><tr><th>#</th><th>token</th>"
            f"<th>p</th><th>id</th></tr></thead><tbody>{''.join(rows)}</tbody></table>{note}</div>")


def _last_token_note(step: StepTrace, vocab: Mapping[int, str]) -> str:
    token = _tok(step.bonus_text)
    if step.bonus_kind == "resampled":
        text = (f"The step ended here: the draft after this node was rejected and the target put {token} in "
                "its place (resampled).")
        if step.residual_topk:
            left = ", ".join(f"{_tok(vocab.get(t, f'#{t}'))} {p:.3f}" for t, p in step.residual_topk)
            text += f" Under sampling it was drawn from the residual, the target's distribution with the " \
                    f"rejected drafts removed; its top 5: {left}."
    else:
        text = f"The whole path to this leaf was accepted, so the target added {token} of its own (bonus)."
    return f'<div class="note">{text}</div>'
