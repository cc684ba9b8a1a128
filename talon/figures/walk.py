"""The guided walk through one step: seven stops (the draft tree, the gate, the attention mask, a
question (which path will the target keep?), verification, the step's cost, the run), each
pointing at one figure (``WalkStop.focus``, an element id that ``static/talon.js`` highlights)
and explaining one idea with that step's numbers. Pure functions of the traces: the walk works
on a recording with no model loaded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from talon.figures.common import committed_tokens, node_status
from talon.figures.glossary import define, fold
from talon.figures.payoff import plain_rate, step_verdict, verify_at
from talon.figures.predict import Choice, predict_html
from talon.figures.text import esc, token_label
from talon.trace import RunSummary, StepTrace


@dataclass(frozen=True)
class WalkStop:
    key: str
    title: str
    focus: str  # element id of the figure this stop is about
    explain: Callable[[RunSummary | None, Sequence[StepTrace], int], str]  # -> HTML


def _tok(st: StepTrace, node: int) -> str:
    return f"<code>{token_label(st.texts[node], 24)}</code>"


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.0f} ms"


def _children(st: StepTrace) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in st.tokens]
    for node, parent in enumerate(st.parents[1:], start=1):
        kids[parent].append(node)
    return kids


def _tree(summary: RunSummary | None, steps: Sequence[StepTrace], i: int) -> str:
    st = steps[i]
    n = len(st.tokens) - 1
    if n == 0:
        return (f"At step {i} nothing was drafted ({esc(st.model_skipped or st.tree_stop or 'no proposal')}): "
                "the target wrote one token alone, as plain decoding does. Pick a step with a tree on the slider.")
    by_source = {s: st.sources[1:].count(s) for s in ("model", "head", "mtp", "retrieval", "both")}
    whence = {"model": "the draft model", "head": "the EAGLE-3 head", "mtp": "the target's MTP layer",
              "both": "both sources"}
    kinds = ", ".join(f"{v} from {whence.get(k, k)}" for k, v in by_source.items() if v)
    kids = _children(st)
    fork = max(range(len(kids)), key=lambda node: len(kids[node]))
    branch = ""
    if len(kids[fork]) >= 2:
        where = "the last committed token" if fork == 0 else _tok(st, fork)
        options = ", ".join(_tok(st, c) for c in kids[fork][:4])
        branch = (f" The tree branches where the drafter was unsure: after {where} it offers "
                  f"{len(kids[fork])} alternatives ({options}).")
    return (f"At step {i} the drafter proposed <b>{n} tokens</b> ({kinds}), up to {max(st.depths)} ahead of the "
            f"text.{branch} Each path is a guess at how the text goes on; the target will check them all at once.")


def _gates(summary: RunSummary | None, steps: Sequence[StepTrace], i: int) -> str:
    st = steps[i]
    mu = ((summary.config if summary else {}).get("tree") or {}).get("mu")
    gated = [node for node, passed in enumerate(st.gate_passed) if passed is False]
    rule = (f"A node grows children only if its path confidence c (the product of q along its path) is at least "
            f"μ{f' = {mu:g}' if isinstance(mu, (int, float)) else ''} times the best c of its layer (the dashed line).")
    if not gated:
        return (f"{rule} At step {i} no node fell below its line: this tree stopped for another reason "
                f"({esc(st.tree_stop or '–')}).")
    node = gated[0]
    threshold = st.gate_threshold[node]
    return (f"{rule} At step {i} the gate cut <b>{len(gated)} node{'s' if len(gated) > 1 else ''}</b> (⊗): for "
            f"example {_tok(st, node)} had c = {st.path_conf[node]:.3f}, under its layer's line at "
            f"{threshold:.3f}, so the budget went to likelier branches instead.")


def _mask(summary: RunSummary | None, steps: Sequence[StepTrace], i: int) -> str:
    st = steps[i]
    n = len(st.tokens)
    kids = _children(st)
    fork = max(range(n), key=lambda node: len(kids[node]))
    siblings = ""
    if len(kids[fork]) >= 2 and st.positions:
        a, b = kids[fork][:2]
        siblings = (f" Siblings {_tok(st, a)} and {_tok(st, b)} share position id {st.positions[a]}: they are "
                    "alternatives for the same place, and only the mask keeps them from seeing each other.")
    return (f"The target checks all {n} nodes of step {i} in <b>one forward pass</b>. Row i of the mask shows what "
            f"node i may attend to: itself and its ancestors (plus all committed text), so each branch reads as "
            f"its own continuation.{siblings}")


def _paths(st: StepTrace) -> list[list[int]]:
    """Every root-to-leaf path of the tree (node ids, the root left out), likeliest leaf first."""
    kids = _children(st)
    paths = []
    for leaf in (n for n in range(1, len(st.tokens)) if not kids[n]):
        path, node = [], leaf
        while node:
            path.append(node)
            node = st.parents[node]
        paths.append(path[::-1])
    return sorted(paths, key=lambda p: -st.path_conf[p[-1]])


def _path_label(st: StepTrace, path: list[int], shown: int = 5) -> str:
    more = " …" if len(path) > shown else ""
    return " ".join(_tok(st, node) for node in path[:shown]) + more


def _predict(summary: RunSummary | None, steps: Sequence[StepTrace], i: int) -> str:
    st = steps[i]
    paths = _paths(st)
    if not paths:
        return (f"At step {i} nothing was drafted, so there is nothing to predict: the target writes one token "
                "alone. Pick a step with a tree on the slider and come back.")
    kept = st.accepted[1:]
    right = [p for p in paths if kept and kept[-1] in p][:1]
    wrong = [p for p in paths if not (kept and kept[-1] in p)][:3 - len(right)]
    choices = sorted(right + wrong, key=paths.index)
    options = [Choice(_path_label(st, p), p in right) for p in choices]
    options.append(Choice("None of them: it turns down the first token of every path", not kept))
    bonus = f"<code>{token_label(st.bonus_text, 24)}</code>"
    answer = (f"It kept <b>{len(kept)}</b> drafted token{'s' if len(kept) != 1 else ''} "
              f"({' '.join(_tok(st, node) for node in kept)}), then wrote its own {bonus}. "
              if kept else f"It kept none of the drafted tokens and wrote its own {bonus}. ")
    question = (f"Before the target checks step {i}: <b>which path will it keep?</b> It keeps a drafted token "
                "only where it agrees with it, from the first token down; the tree's colours and the text stay "
                "hidden until you answer.")
    return predict_html(question, options, answer + "The next stop shows how it decided.", hides_figures=True)


def _verify(summary: RunSummary | None, steps: Sequence[StepTrace], i: int) -> str:
    st = steps[i]
    accepted = [_tok(st, node) for node in st.accepted[1:]]
    committed = committed_tokens(st)
    bonus = f"<code>{token_label(st.bonus_text, 24)}</code>"
    path = (f"The target agreed with <b>{len(accepted)}</b> drafted token{'s' if len(accepted) != 1 else ''} "
            f"({' '.join(accepted)}). " if accepted else "The target agreed with none of the drafted tokens. ")
    if st.bonus_kind == "resampled":
        rejected = [node for node, s in enumerate(node_status(st)) if s == "rejected"]
        which = f" (it turned down {', '.join(_tok(st, node) for node in rejected[:3])})" if rejected else ""
        end = f"Then it rejected the next guess{which} and wrote its own token {bonus} in its place (◆)."
    else:
        end = f"The path was accepted to its end, so the target adds its own next token {bonus} for free (★)."
    return (f"{path}{end} Step {i} commits <b>{len(committed)} tokens</b> for one target forward; plain decoding "
            "commits one. With greedy decoding the text is exactly what the target alone would write; with "
            "sampling each token is drawn from exactly the target's own distribution (the node inspector draws "
            "the rule).")


def _cost(summary: RunSummary | None, steps: Sequence[StepTrace], i: int) -> str:
    st = steps[i]
    curves = summary.cost_model if summary else {}
    one, tree = verify_at(curves, 1), verify_at(curves, len(st.tokens))
    tokens = len(st.new_tokens)
    spent = st.draft_s + st.verify_s + st.other_s
    why_one = (f" Why a tree costs about one forward: a forward reads every weight once, and at one sequence that "
               f"reading, not the arithmetic, sets its time; on this host verifying 1 node takes {_ms(one)} and "
               f"{len(st.tokens)} nodes {_ms(tree)}." if one and tree and len(st.tokens) > 1 else "")
    verdict = step_verdict(st, plain_rate(summary))
    plain = ""
    if verdict is not None:
        won, alone = verdict
        plain = (f" Plain decoding would take about {_ms(alone)} for these {tokens} tokens, so this step "
                 + ("<b>won</b>." if won else
                    f"<b>lost</b>: {_ms(st.draft_s)} of drafting bought only {tokens - 1} drafted token"
                    f"{'s' if tokens != 2 else ''}, less than it cost. Steps that win pay for the ones that lose "
                    "(the whole run: the last stop)."))
    stop = {"cost": "the cost model stopped the tree: one more layer would cost more time than it is expected "
                    "to save", "budget": "the tree used its whole budget", "depth": "it reached the maximum depth",
            "min_conf": "its paths fell below the minimum confidence", "skipped": "the draft model was skipped"}
    why = stop.get(st.tree_stop, "")
    cost_aware = ((summary.config if summary else {}).get("tree") or {}).get("cost_aware", False)
    planning = (f"Trees are not free on a CPU: verifying more nodes costs more, so Talon grows a tree only while it "
                f"pays{f'; here {why}' if why else ''}." if cost_aware else
                "Trees are not free on a CPU: the cost view plots what verifying n nodes and drafting a layer cost "
                "on this host, with this run's steps on the curves. This run had cost-aware planning off; with it "
                "on, Talon stops a tree when its next layer would not pay, and skips the draft model when retrieval "
                "alone is faster.")
    return (f"Step {i} spent {_ms(st.draft_s)} drafting and {_ms(st.verify_s)} verifying {len(st.tokens)} nodes "
            f"({_ms(spent)} in all) for {tokens} tokens.{plain}{why_one} {planning}")


def _run(summary: RunSummary | None, steps: Sequence[StepTrace], i: int) -> str:
    tokens = sum(len(st.new_tokens) for st in steps)
    mat = tokens / len(steps) if steps else 0.0
    sources = {s: 0 for s in ("model", "head", "mtp", "retrieval", "both", "target")}
    for st in steps:
        for tok in committed_tokens(st):
            sources[tok.source if tok.source in sources else "target"] += 1
    share = ", ".join(f"{v} {k}" for k, v in sources.items() if v)
    speed = f" at {summary.tokens_per_second:.1f} tokens/s" if summary and summary.tokens_per_second else ""
    plain = plain_rate(summary)
    if speed and plain is not None:
        ratio = summary.tokens_per_second / plain.tokens_per_s
        speed += (f", {ratio:.2f}x plain decoding's {plain.tokens_per_s:.1f} tokens/s ({plain.source})"
                  + ("" if ratio >= 1 else ": on this host its trees cost more than they saved"))
    return (f"The whole run: {len(steps)} target forwards wrote {tokens} tokens{speed}, a mean of <b>{mat:.2f} "
            f"tokens per step</b> (MAT; plain decoding has 1). Committed tokens by source: {esc(share)}. Now press "
            "<b>Run</b> to decode live with the controls on the left, or move the sliders and see the trees change.")


WALK: tuple[WalkStop, ...] = (
    WalkStop("tree", "The draft tree", "talon-tree", _tree),
    WalkStop("gates", "The confidence gate", "talon-gates", _gates),
    WalkStop("mask", "One forward for the whole tree", "talon-mask", _mask),
    WalkStop("predict", "Predict, then check", "talon-tree", _predict),
    WalkStop("verify", "Verification, the accepted path and the bonus", "talon-text", _verify),
    WalkStop("cost", "What the step cost", "talon-cost", _cost),
    WalkStop("run", "The run as a whole", "talon-per-step", _run),
)


def walk_html(stop: int, summary: RunSummary | None, steps: Sequence[StepTrace], index: int) -> str:
    """The walk's card at ``stop`` for step ``index`` (``data-focus`` names the figure to light up)."""
    if not steps:
        return '<div class="talon-walk-card">Nothing to walk through yet: run a prompt or replay a trace.</div>'
    stop = max(0, min(stop, len(WALK) - 1))
    index = max(0, min(index, len(steps) - 1))
    s = WALK[stop]
    body = s.explain(summary, steps, index)
    return define(f'<div class="talon-walk-card" data-focus="{s.focus}" data-stop="{stop}">'
                  f'<div class="talon-walk-head">{stop + 1} / {len(WALK)} · {esc(s.title)}</div>'
                  f'<div class="talon-walk-body">{body if s.key == "predict" else fold(body)}</div></div>')
