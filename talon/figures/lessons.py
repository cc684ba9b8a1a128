"""The lessons' figures and words (pure functions of ``talon.lessons`` results): the static depth
dilemma against the adaptive tree, the acceptance funnel, the three drafters side by side, and
the text coloured by the source that carried each step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from talon.figures.common import (
    GATED_COLOR,
    PATH_COLOR,
    SOURCE_COLORS,
    Trace,
    axis_style,
    base_layout,
    legend_top,
    make_figure,
)
from talon.figures.predict import Choice, predict_html
from talon.figures.text import esc
from talon.lessons.adaptive import CONF_BINS, DEPTHS, EAGLE3_SHAPE, AdaptiveLesson
from talon.lessons.asynchrony import AsyncBound, AsyncLesson
from talon.lessons.exercises import Exercise
from talon.lessons.head import DEEP, ROLES, HeadVsModel
from talon.lessons.hybrid import COMPARED, HybridLesson, RetrievalExample, carried_shares
from talon.lessons.mtp import NAMES as DRAFTER_NAMES
from talon.lessons.mtp import DrafterLineup

CARRIER_COLORS = {**SOURCE_COLORS, "none": "#9a9a9a"}
HEAD_VS_MODEL_COLOR = "#D55E00"  # Okabe-Ito vermillion
# the MTP lesson's drafters: the MTP layer its own indigo, the head vermillion (as above), the draft model blue
LINEUP_COLORS = {"mtp": SOURCE_COLORS["mtp"], "head": HEAD_VS_MODEL_COLOR, "draft": SOURCE_COLORS["model"]}
CARRIER_NAMES = {"model": "draft model", "retrieval": "retrieval", "both": "both", "none": "bonus token only"}


def depth_figure(lesson: AdaptiveLesson) -> go.Figure:
    """The static tree at every depth (equal budget) against the adaptive tree, in MAT (left) and
    in tokens/s predicted by the recording host's costs (right: each layer costs a draft forward)."""
    depths = list(DEPTHS)
    traces: list[Trace] = []
    panels = [("MAT", lesson.static_mat, lesson.adaptive_mat, lesson.best_depth, "", "y", ".2f")]
    if lesson.static_rate:
        panels.append(("tok/s", lesson.static_rate, lesson.adaptive_rate, lesson.fastest_depth, "2", "y2", ".1f"))
    for unit, static, adaptive, best, axis, yaxis, fmt in panels:
        first = not axis
        traces += [
            dict(type="scatter", x=depths, y=[static[d] for d in depths], mode="lines+markers", xaxis=f"x{axis}",
                 yaxis=yaxis, name=f"static tree (EAGLE's shape, K = {lesson.widths[0]}, k = {lesson.widths[1]})",
                 line=dict(color=SOURCE_COLORS["model"], width=2), showlegend=first, legendgroup="static",
                 hovertemplate=f"static, depth %{{x}}: {unit} %{{y:{fmt}}}<extra></extra>"),
            dict(type="scatter", x=[depths[0], depths[-1]], y=[adaptive] * 2, mode="lines", xaxis=f"x{axis}",
                 yaxis=yaxis, name="TALON adaptive tree", line=dict(color=GATED_COLOR, width=2, dash="dash"),
                 showlegend=first, legendgroup="adaptive",
                 hovertemplate=f"adaptive: {unit} %{{y:{fmt}}}<extra></extra>"),
            dict(type="scatter", x=[best], y=[static[best]], mode="markers", name="best depth (hindsight)",
                 xaxis=f"x{axis}", yaxis=yaxis, marker=dict(color=PATH_COLOR, size=12, symbol="star"),
                 showlegend=first, legendgroup="best",
                 hovertemplate=f"best static depth %{{x}}: {unit} %{{y:{fmt}}}<extra></extra>"),
        ]
    layout = base_layout(f"Static depth or adaptive, N = {lesson.budget}", 360,
                         xaxis=axis_style("static tree depth", dtick=1, domain=[0, 0.45]),
                         yaxis=axis_style("MAT (tokens per target forward)"),
                         xaxis2=axis_style("static tree depth", dtick=1, domain=[0.57, 1], anchor="y2"),
                         yaxis2=axis_style("tokens/s (predicted)", anchor="x2"),
                         legend=legend_top())
    return make_figure(traces, layout)


def calibration_figure(bins: dict[int, tuple[int, int]]) -> go.Figure:
    """Share of drafted nodes the target accepted, by path confidence (tenths), with the diagonal
    a perfectly calibrated drafter would follow: why gating on confidence spends the budget well."""
    mids = [(b + 0.5) / CONF_BINS for b in bins]
    rates = [100 * a / d if d else 0.0 for a, d in bins.values()]
    traces: list[Trace] = [
        dict(type="scatter", x=[0, 1], y=[0, 100], mode="lines", name="accepted as often as confident",
             line=dict(color="#9a9a9a", dash="dot"), hoverinfo="skip"),
        dict(type="scatter", x=mids, y=rates, mode="lines+markers", name="lesson prompts (adaptive tree)",
             marker=dict(color=SOURCE_COLORS["model"], size=[6 + min(14, d ** 0.5 / 2) for _, d in bins.values()]),
             line=dict(color=SOURCE_COLORS["model"]), customdata=[[a, d] for a, d in bins.values()],
             hovertemplate="path confidence %{x:.2f}: %{y:.0f} % accepted (%{customdata[0]} of "
                           "%{customdata[1]} drafted nodes)<extra></extra>"),
    ]
    layout = base_layout("Acceptance against confidence (all lesson prompts)", 340,
                         xaxis=axis_style("path confidence c (product of q along the path)", range=[0, 1]),
                         yaxis=axis_style("% of drafted nodes accepted", range=[0, 105]), legend=legend_top())
    return make_figure(traces, layout)


def _accepted(group: Sequence[tuple[int, int]]) -> float:
    return 100 * sum(a for a, _ in group) / max(sum(d for _, d in group), 1)


def calibration_words(bins: dict[int, tuple[int, int]]) -> str:
    """What the calibration figure shows, with its numbers."""
    low = [bins[b] for b in bins if b < 3]
    high = [bins[b] for b in bins if b >= 7]
    if not low or not high:
        return ""
    drafted = sum(d for _, d in low)
    share = 100 * drafted / max(sum(d for _, d in bins.values()), 1)
    return (f"The target accepted {_accepted(high):.0f} % of the nodes drafted with path confidence 0.7 or more and "
            f"{_accepted(low):.0f} % of those under 0.3, which were {share:.0f} % of all drafted nodes. Acceptance "
            "follows "
            "confidence, so a gate on confidence keeps the nodes likely to be accepted and cuts the rest.")


def funnel_figure(ranks: dict[int, float], depths: dict[int, float]) -> go.Figure:
    """Accepted adaptive nodes by sibling rank and by depth (shares)."""
    traces: list[Trace] = [
        dict(type="bar", x=[f"#{r}" for r in ranks], y=[100 * v for v in ranks.values()], name="by sibling rank",
             marker=dict(color=SOURCE_COLORS["model"]), xaxis="x", yaxis="y",
             hovertemplate="child %{x} among its siblings: %{y:.0f} % of accepted nodes<extra></extra>"),
        dict(type="bar", x=[str(d) for d in depths], y=[100 * v for v in depths.values()], name="by depth",
             marker=dict(color=SOURCE_COLORS["both"]), xaxis="x2", yaxis="y2",
             hovertemplate="depth %{x}: %{y:.0f} % of accepted nodes<extra></extra>"),
    ]
    layout = base_layout("The acceptance funnel (all lesson prompts)", 340,
                         xaxis=axis_style("sibling rank", domain=[0, 0.45]),
                         yaxis=axis_style("% of accepted nodes"),
                         xaxis2=axis_style("depth", domain=[0.55, 1], anchor="y2"),
                         yaxis2=axis_style("", anchor="x2"), showlegend=False)
    return make_figure(traces, layout)


def drafters_figure(lesson: HybridLesson) -> go.Figure:
    """Predicted tokens/s of each drafter, MAT on each bar."""
    names = {"model": f"{lesson.slot} alone", "retrieval": "retrieval alone", "hybrid": "hybrid"}
    colors = {"model": SOURCE_COLORS["model"], "retrieval": SOURCE_COLORS["retrieval"], "hybrid": SOURCE_COLORS["both"]}
    traces: list[Trace] = [
        dict(type="bar", x=[names[d] for d in COMPARED], y=[lesson.tokens_per_s[d] for d in COMPARED],
             marker=dict(color=[colors[d] for d in COMPARED]), text=[f"MAT {lesson.mat[d]:.2f}" for d in COMPARED],
             textposition="outside", hovertemplate="%{x}: %{y:.2f} tok/s predicted<extra></extra>"),
    ]
    top = max(lesson.tokens_per_s.values()) or 1.0
    layout = base_layout("Each drafter on this prompt (predicted tokens/s, MAT on the bars)", 300,
                         yaxis=axis_style("tokens/s (predicted)", range=[0, 1.25 * top]), showlegend=False)
    return make_figure(traces, layout)


def carried_text_html(lesson: HybridLesson) -> str:
    """The hybrid's text, each step's tokens coloured by the source that carried the step."""
    spans, names = [], {**CARRIER_NAMES, "model": lesson.slot}
    for i, (who, text) in enumerate(zip(lesson.carried, lesson.step_texts)):
        color = CARRIER_COLORS[who]
        spans.append(f'<span class="lesson-step" title="step {i}: {esc(names[who])}" '
                     f'style="border-bottom: 3px solid {color}; background: {color}22">{esc(text)}</span>')
    legend = " ".join(f'<span style="border-bottom: 3px solid {CARRIER_COLORS[k]}">{esc(v)}</span>'
                      for k, v in names.items())
    return (f'<div class="talon-lesson-text"><div class="legend">Each step\'s tokens, underlined by the source '
            f'that carried it: {legend}</div><pre>{"".join(spans)}</pre></div>')


def retrieval_html(example: RetrievalExample | None, text: Callable[[list[int]], str]) -> str:
    """How retrieval drafted its best step on this prompt: the end of the text, the same tokens
    earlier, and what followed them there (``text``: token ids to text)."""
    if example is None:
        return ('<div class="talon-retrieval">Retrieval carried no step on this prompt: the end of the text never '
                "repeated what came before for long enough.</div>")
    match = f'<mark class="match">{esc(text(example.match))}</mark>'
    proposed = f'<mark class="next">{esc(text(example.proposed))}</mark>'
    return (f'<div class="talon-retrieval"><div class="legend">How retrieval drafted step {example.step}: '
            f'{RETRIEVAL_WORDS}</div>'
            f'<div><span class="what">the text so far ends</span> …{esc(text(example.now_before))}{match} ▸ ?</div>'
            f'<div><span class="what">the same tokens before</span> …{esc(text(example.before))}{match}{proposed} …'
            f'</div><div><span class="what">retrieval proposes</span> {proposed}: the target kept {example.kept} of '
            f"these {len(example.proposed)} tokens.</div></div>")


def adaptive_words(lesson: AdaptiveLesson, suites: Sequence[AdaptiveLesson] = ()) -> str:
    """Two or three sentences with this prompt's numbers."""
    best, eagle = lesson.best_depth, lesson.static_mat[EAGLE3_SHAPE["max_depth"]]
    shallow = lesson.static_mat[2]
    return (f"On this prompt, with N = {lesson.budget} nodes, TALON's adaptive tree accepts "
            f"{lesson.adaptive_mat:.2f} tokens per step with no depth chosen in advance: "
            f"{lesson.adaptive_mat / lesson.best_static_mat:.2f}x the best static depth chosen with hindsight. "
            "That is " + _verdict(lesson)
            + f" A static tree accepts {shallow:.2f} at depth 2 and {lesson.best_static_mat:.2f} at its best depth, "
            f"{best}; "
            + ("EAGLE-3's shape (depth 8) gets " if lesson.widths == (10, 10) else
               f"EAGLE-3's depth 8 (K = {lesson.widths[0]}, k = {lesson.widths[1]}: as wide as this atlas holds) gets ")
            + f"{eagle:.2f}. " + _dilemma(suites) + _coverage(lesson.coverage))


TIE = 0.02  # within this share of each other, two MATs are called a tie


def _verdict(lesson: AdaptiveLesson) -> str:
    """Win, tie or loss against the best static depth, in words, with the reason where it is a tie."""
    ratio = lesson.adaptive_mat / lesson.best_static_mat
    if ratio > 1 + TIE:
        return "a win: it goes deep where the drafter is sure and wide where it is not, on each step."
    if ratio < 1 - TIE:
        return "a loss here: the best fixed depth, known only in hindsight, fits this prompt better."
    top = lesson.funnel_rank.get(1, 0) / max(sum(lesson.funnel_rank.values()), 1)
    return (f"a tie: {100 * top:.0f} % of the accepted nodes were their parent's top child, so a narrow deep "
            "tree catches what the adaptive one catches.")


def _coverage(share: float) -> str:
    if share >= 1.0:
        return ""
    return (f" (This atlas answered {100 * share:.1f} % of the draft requests these trees make, so the numbers are "
            "lower bounds; the lesson atlases are recorded to answer all of them: scripts/record_lessons.py.)")


def _dilemma(lessons: Sequence[AdaptiveLesson]) -> str:
    """How much one fixed depth for every prompt loses against each prompt's own best depth: in
    MAT, then in tokens/s (where every layer costs a draft forward)."""
    if len(lessons) < 2:
        return ""
    mat = _fixed_loss(lessons, lambda x: x.static_mat)
    words = (f"Over the {len(lessons)} lesson prompts, in MAT the best single depth is {mat.depth}: it loses "
             f"{100 * mat.mean:.1f} % on average against each prompt's own best depth, {100 * mat.worst:.1f} % at "
             "worst. ")
    if mat.mean < TIE:
        words += ("In MAT, then, no depth dilemma shows: the static tree keeps its N likeliest nodes, so a deep cap "
                  "costs it nothing. ")
    else:
        words += "That gap is the static depth dilemma, in accepted tokens. "
    rates = [x for x in lessons if x.static_rate]
    if len(rates) < 2:
        return words
    fast = _fixed_loss(rates, lambda x: x.static_rate)
    best = sorted({x.fastest_depth for x in rates})
    adaptive = [x.adaptive_rate / x.static_rate[x.fastest_depth] for x in rates]
    words += (f"In time it is another story: each layer costs a draft forward, and the fastest depth per prompt "
              f"ranges over {', '.join(map(str, best))}; the best single depth, {fast.depth}, loses "
              f"{100 * fast.mean:.1f} % of tokens/s on average and {100 * fast.worst:.1f} % at worst. ")
    if fast.mean < TIE:
        return words + "So here one fixed depth does about as well as each prompt's own, even in time."
    return words + (f"That is the depth dilemma; the adaptive tree gets {min(adaptive):.2f}x to {max(adaptive):.2f}x "
                    "each prompt's fastest depth without choosing one in advance.")


@dataclass(frozen=True)
class FixedLoss:
    depth: int  # the one depth that loses least over all prompts
    mean: float  # its mean share lost against each prompt's own best depth
    worst: float


def _fixed_loss(lessons: Sequence[AdaptiveLesson], metric: Callable[[AdaptiveLesson], dict[int, float]]) -> FixedLoss:
    loss = {d: [1 - metric(x)[d] / max(metric(x).values()) for x in lessons] for d in DEPTHS}
    fixed = min(DEPTHS, key=lambda d: (sum(loss[d]), -d))
    return FixedLoss(fixed, sum(loss[fixed]) / len(lessons), max(loss[fixed]))


RETRIEVAL_WORDS = ("Retrieval finds the longest end of the text so far that occurred before (in the prompt or the "
                   "output) and proposes what followed it there: no model, nearly free.")


def hybrid_words(lesson: HybridLesson) -> str:
    shares = carried_shares(lesson)
    verdict = {
        "retrieval": "here retrieval alone is fastest: the text repeats what came before, and its guesses cost "
                     "nothing.",
        "model": f"here the {lesson.slot} alone is fastest: the text repeats too little for retrieval's guesses to "
                 "pay for the grafts.",
        "hybrid": f"here the hybrid is fastest: retrieval carries the steps where the text repeats, the {lesson.slot} "
                  "the rest.",
    }.get(lesson.best, "")
    best = {"model": f"the {lesson.slot} alone", "retrieval": "retrieval alone"}.get(lesson.best, lesson.best)
    return (f"The {lesson.slot} alone accepts {lesson.mat['model']:.2f} tokens per step here, retrieval alone "
            f"{lesson.mat['retrieval']:.2f}, the hybrid {lesson.mat['hybrid']:.2f}; predicted fastest: "
            f"{best} ({lesson.tokens_per_s[lesson.best]:.2f} tok/s). Of the hybrid's tokens, "
            f"{100 * shares['retrieval']:.0f} % came on steps retrieval carried and {100 * shares['model']:.0f} % on "
            f"steps the {lesson.slot} carried: {verdict}")


def async_figure(lesson: AsyncLesson) -> go.Figure:
    """Per cost curve: the step time split (draft, verify, bookkeeping) with async off, and the
    bound with async on (drafting hidden behind verification)."""
    bounds = (lesson.host, lesson.gpu)
    x = ["this host: async off", "this host: on (bound)", "H100 graphs: off", "H100 graphs: on (bound)"]
    rows = [(b, False) for b in bounds[:1]] + [(bounds[0], True)] + [(bounds[1], False), (bounds[1], True)]
    per_token = [(1e3 / b.tokens) if b.tokens else 0.0 for b, _ in rows]
    draft = [(0.0 if hidden else b.draft_s) * k for (b, hidden), k in zip(rows, per_token)]
    verify = [b.verify_s * k for (b, _), k in zip(rows, per_token)]
    other = [b.other_s * k for (b, _), k in zip(rows, per_token)]
    labels = [f"{(b.async_rate if hidden else b.sync_rate):.1f} tok/s" for b, hidden in rows]
    traces: list[Trace] = [
        dict(type="bar", x=x, y=verify, name="verify", marker=dict(color=SOURCE_COLORS["bonus"])),
        dict(type="bar", x=x, y=draft, name="draft (not hidden)", marker=dict(color=SOURCE_COLORS["model"])),
        dict(type="bar", x=x, y=other, name="bookkeeping", marker=dict(color="#9a9a9a"), text=labels,
             textposition="outside"),
    ]
    top = max(d + v + o for d, v, o in zip(draft, verify, other)) or 1.0
    layout = base_layout("Milliseconds per token, async off and on (bound)", 340, barmode="stack",
                         yaxis=axis_style("ms per token", range=[0, 1.25 * top]), legend=legend_top())
    return make_figure(traces, layout)


def async_words(lesson: AsyncLesson, measured: AsyncBound | None = None) -> str:
    host, gpu = lesson.host, lesson.gpu
    run = "" if measured is None or not measured.sync_s else (
        f" On the Decode tab's run (measured times, {measured.tokens} tokens), drafting took "
        f"{100 * measured.draft_s / measured.sync_s:.0f} % of the step time: hidden, at most {measured.gain:.2f}x.")
    if lesson.reads_features:
        return (f"Here drafting takes {100 * host.draft_s / host.sync_s:.0f} % of each step under this host's "
                "curves, but this atlas's drafter (an EAGLE-3 head or an MTP layer) drafts from the target's "
                "feature of the last committed token, which only the verification gives: it cannot draft the next "
                "tree while the target verifies, so there is nothing to hide and the bound is 1.00x." + run)
    return (f"Here drafting takes {100 * host.draft_s / host.sync_s:.0f} % of each step under this host's curves: "
            f"hidden behind verification, the run would go from {host.sync_rate:.1f} to at most "
            f"{host.async_rate:.1f} tok/s ({host.gain:.2f}x). On a 2-core CPU the draft and the target share the "
            f"same cores, so that bound is not reached. Under an H100's measured curves (CUDA graphs at the 7B "
            f"preset's shapes: a draft forward a third of a verification) drafting takes "
            f"{100 * gpu.draft_s / gpu.sync_s:.0f} % and the bound is {gpu.gain:.2f}x; Talon's pre-drafts run "
            f"eagerly on their thread, so it does not reach it either, and async stays off by default." + run)


def exercises_html(tasks: Sequence[Exercise]) -> str:
    """Each exercise as a question whose answer shows once a choice is pressed."""
    return "".join(predict_html(f"<b>{i}.</b> {esc(t.question)}",
                                [Choice(esc(c), k == t.right) for k, c in enumerate(t.choices)], esc(t.answer))
                   for i, t in enumerate(tasks, start=1))


def head_figure(lesson: HeadVsModel) -> go.Figure:
    """MAT of the head and of the draft model, alone and with retrieval (predicted tokens/s on the bars)."""
    roles = list(ROLES)
    traces: list[Trace] = []
    # the two slots side by side: the head in the palette's vermillion (in one run it shares the model's blue)
    slots = (("EAGLE-3 head", HEAD_VS_MODEL_COLOR), ("draft model", SOURCE_COLORS["model"]))
    for i, (name, color) in enumerate(slots):
        kinds = [ROLES[r][i] for r in roles]
        traces.append(dict(type="bar", name=name, x=roles, y=[lesson.mat[k] for k in kinds], marker=dict(color=color),
                           text=[f"{lesson.tokens_per_s[k]:.1f} tok/s" for k in kinds], textposition="outside",
                           hovertemplate=name + " %{x}: MAT %{y:.2f}, %{text} predicted<extra></extra>"))
    top = max(lesson.mat.values()) or 1.0
    layout = base_layout(f"A head against a draft model on this prompt (N = {lesson.budget}; MAT, tok/s on the bars)",
                         300, barmode="group", yaxis=axis_style("MAT (tokens per target forward)",
                                                                range=[0, 1.25 * top]))
    return make_figure(traces, layout)


def head_words(lesson: HeadVsModel) -> str:
    """The comparison in words, every figure from the two replays."""
    mat, deep = lesson.mat, lesson.deep_share
    alone, grafted = lesson.ratio("alone"), lesson.ratio("with retrieval")
    lead = ("the head keeps more" if alone > 1.02 else "the draft model keeps more" if alone < 0.98
            else "they keep about as many")
    head_ms, model_ms = lesson.draft_ms
    cost = (": the head, one layer on the target's features, drafts for less" if head_ms < 0.9 * model_ms else
            ": the head drafts for more here" if head_ms > 1.1 * model_ms else ": about equal, so tokens/s follow MAT")
    return (f"On this prompt at N = {lesson.budget}, {lead}: the EAGLE-3 head {mat['eagle3']:.2f} tokens per step, "
            f"the draft model {mat['model']:.2f} ({alone:.2f}x); with retrieval grafted in, {mat['eagle3-hybrid']:.2f} "
            f"against {mat['hybrid']:.2f} ({grafted:.2f}x). "
            f"{100 * deep['eagle3']:.0f} % of the head's steps kept {DEEP} or more drafted tokens, "
            f"{100 * deep['model']:.0f} % of the draft model's. A draft forward of one node costs {head_ms:.1f} ms "
            f"on the head's atlas and {model_ms:.1f} ms on the draft model's (each atlas's own cost curves){cost}. "
            f"Predicted tokens/s: head {lesson.tokens_per_s['eagle3']:.1f}, draft model "
            f"{lesson.tokens_per_s['model']:.1f} ({lesson.tokens} tokens of the target's text).")


def mtp_lineup_figure(lesson: DrafterLineup) -> go.Figure:
    """Per depth, how often each drafter's token is accepted once the depth above it was (MAT and
    predicted tokens/s in the legend)."""
    traces: list[Trace] = []
    for kind in lesson.kinds:
        rates = lesson.depth_accept[kind]
        name = f"{DRAFTER_NAMES[kind]}: MAT {lesson.mat[kind]:.2f}, {lesson.tokens_per_s[kind]:.1f} tok/s"
        traces.append(dict(type="scatter", mode="lines+markers", name=name, x=list(range(1, len(rates) + 1)),
                           y=[None if r is None else 100 * r for r in rates], line=dict(color=LINEUP_COLORS[kind]),
                           hovertemplate=DRAFTER_NAMES[kind] + " depth %{x}: %{y:.0f} % accepted<extra></extra>"))
    layout = base_layout(f"Accepted at each depth, once the depth above was (N = {lesson.budget}, each drafter alone)",
                         320, xaxis=axis_style("depth (drafted tokens ahead)", dtick=1),
                         yaxis=axis_style("accepted (%)", range=[0, 105]))
    return make_figure(traces, layout)


def _deep_rate(rates: Sequence[float | None]) -> float | None:
    """The mean acceptance from depth 3 on, where defined."""
    deep = [r for r in rates[2:] if r is not None]
    return sum(deep) / len(deep) if deep else None


def mtp_lineup_words(lesson: DrafterLineup) -> str:
    """The lineup in words, every figure from the replays."""
    ranked = sorted(lesson.kinds, key=lambda k: -lesson.mat[k])
    order = ", then ".join(f"the {DRAFTER_NAMES[k]} ({lesson.mat[k]:.2f})" for k in ranked)
    parts = [f"On this prompt at N = {lesson.budget}, tokens kept per step: {order}."]
    for kind in lesson.kinds:
        first, deep = lesson.depth_accept[kind][0], _deep_rate(lesson.depth_accept[kind])
        if first is None:
            continue
        trend = ("" if deep is None else f", {100 * deep:.0f} % from depth 3 on"
                 + (" (it falls as the draft goes deeper)" if deep < first - 0.05 else
                    " (it holds as the draft goes deeper)" if deep <= first + 0.05 else " (it rises deeper)"))
        reuse = " - one block fed its own output at every depth" if kind == "mtp" else ""
        parts.append(f"The {DRAFTER_NAMES[kind]}'s first token is accepted {100 * first:.0f} % of the steps"
                     f"{trend}{reuse}.")
    costs = ", ".join(f"{DRAFTER_NAMES[k]} {lesson.draft_ms[k]:.1f} ms" for k in lesson.kinds)
    fastest = max(lesson.kinds, key=lambda k: lesson.tokens_per_s[k])
    parts.append(f"A draft forward of one node costs {costs} (each atlas's own cost curves); predicted tokens/s "
                 f"favour the {DRAFTER_NAMES[fastest]} ({lesson.tokens_per_s[fastest]:.1f}; {lesson.tokens} tokens of "
                 "the target's text).")
    return " ".join(parts)
