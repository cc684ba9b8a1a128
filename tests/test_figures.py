"""Figure builders on synthetic StepTraces: structure, colours, gates, mask, and escaping of
hostile text in hovers, labels and HTML. No model, no Gradio."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
import pytest

from talon import figures as F
from talon.figures.lessons import async_figure, depth_figure, drafters_figure, funnel_figure
from talon.figures.tree import GATED_NAME
from talon.lessons.adaptive import AdaptiveLesson
from talon.lessons.asynchrony import AsyncBound, AsyncLesson
from talon.lessons.hybrid import HybridLesson
from talon.trace import RunSummary, StepTrace
from tests.steps import RAW_BAD, hostile_steps, make_step, parse, run_steps, sampled_step


def node_traces(fig: go.Figure) -> list:
    return [t for t in fig.data if t.customdata is not None]


def all_figures(st: StepTrace, steps: list[StepTrace]) -> dict[str, go.Figure]:
    rows = [F.MeasuredCell("s", "m", mu, b, 1.0 + mu + b / 10, 10.0 * b) for mu in (0.05, 0.1) for b in (8, 16)]
    return {
        "tree": F.tree_figure(st, F.token_vocab(steps)),
        "gates": F.gate_figure(st),
        "mask": F.mask_figure(st),
        "timeline": F.timeline_figure(steps, 2),
        "timeline_plain": F.timeline_figure(steps, 2, plain=F.PlainRate(0.004, False)),
        "acceptance_greedy": F.acceptance_figure(st, 3, False, F.token_vocab(steps)),
        "acceptance_sampled": F.acceptance_figure(sampled_step(st), 4, True, F.token_vocab(steps)),
        "per_step": F.accepted_per_step_figure(steps, 1),
        "by_depth": F.acceptance_by_depth_figure(steps),
        "sources": F.source_share_figure(steps),
        "speed": F.throughput_figure(steps),
        "compare": F.compare_figure([("A <i>", steps), ("B", steps[:2])]),
        "sweep": F.sweep_heatmap(rows, "mat"),
        "empty": F.empty_figure("nothing <here>"),
        "lesson_depth": depth_figure(AdaptiveLesson("qa", "p", 16, {d: 1.0 + d / 10 for d in range(1, 9)}, 1.8, 1.9)),
        "lesson_funnel": funnel_figure({1: 0.9, 2: 0.1}, {1: 0.6, 2: 0.4}),
        "lesson_drafters": drafters_figure(HybridLesson("qa", "p", {"model": 2.0, "retrieval": 1.2, "hybrid": 2.1},
                                                        {"model": 9.0, "retrieval": 6.0, "hybrid": 9.5})),
        "lesson_async": async_figure(AsyncLesson("qa", "p", AsyncBound("host", 10, 1.0, 3.0, 0.1, 1.0),
                                                 AsyncBound("gpu <b>", 10, 0.1, 0.3, 0.01, 0.1))),
    }


@pytest.mark.parametrize("name", list(all_figures(make_step(), run_steps())))
def test_every_figure_passes_plotly_validation(name: str) -> None:
    """Builders skip validation for speed; the schema check happens here instead."""
    fig = all_figures(make_step(), run_steps())[name]
    go.Figure(fig.to_dict())  # raises ValueError on any invalid property


def test_tree_has_every_node_and_the_bonus() -> None:
    st = make_step()
    fig = F.tree_figure(st)
    ids = sorted(i for t in node_traces(fig) for i in t.customdata)
    assert ids == list(range(len(st.tokens)))
    bonus = [t for t in fig.data if t.name == F.SOURCE_NAMES["bonus"]]
    assert len(bonus) == 1 and bonus[0].marker.symbol == "star"
    assert "b&lt;" in bonus[0].text[0]


def test_tree_colours_nodes_by_source() -> None:
    st = make_step()
    for trace in node_traces(F.tree_figure(st)):
        sources = {st.sources[i] for i in trace.customdata}
        assert len(sources) == 1
        (source,) = sources
        assert trace.marker.color == F.SOURCE_COLORS[source]
        assert trace.name == F.SOURCE_NAMES[source]


def test_tree_marks_accepted_rejected_and_gated_nodes() -> None:
    st = make_step()
    assert F.node_status(st) == [
        "root",
        "accepted",
        "accepted",
        "rejected",
        "rejected",
        "rejected",
        "unreached",
        "unreached",
    ]
    for trace in node_traces(F.tree_figure(st)):
        for k, node in enumerate(trace.customdata):
            bold = node in st.accepted
            assert trace.marker.line.width[k] == (3 if bold else 1)
            assert trace.marker.symbol[k] == ("circle-x" if st.gate_passed[node] is False else "circle")
            assert trace.marker.opacity[k] == F.STATUS_OPACITY[F.node_status(st)[node]]


def test_tree_legend_keys_are_plain_not_the_first_nodes_marker() -> None:
    st = make_step()
    assert st.gate_passed[0] is not False and False in st.gate_passed  # a gated node, not first
    st.gate_passed[1] = False  # the first retrieval node is crossed: its key must not be
    fig = F.tree_figure(st)
    shown = [t for t in fig.data if t.showlegend is not False and t.name]
    keys = {t.name: t for t in shown if t.customdata is None and t.x == (None,)}
    for trace in node_traces(fig):
        assert trace.showlegend is False
        key = keys[trace.name]
        assert key.legendgroup == trace.legendgroup and key.marker.symbol == "circle"
        assert key.marker.color == trace.marker.color
    assert keys[GATED_NAME].marker.symbol == "circle-x"
    st.gate_passed = [None if p is False else p for p in st.gate_passed]
    assert GATED_NAME not in {t.name for t in F.tree_figure(st).data}


def test_tree_draws_the_accepted_path_as_bold_edges() -> None:
    st = make_step()
    fig = F.tree_figure(st)
    path = [t for t in fig.data if t.mode == "lines" and t.line.color == F.PATH_COLOR and t.line.width == 4]
    assert len(path) == 1
    assert len(path[0].x) == 3 * (len(st.accepted) - 1)  # one segment (+ gap) per accepted edge


def test_tidy_layout_puts_parents_between_their_children() -> None:
    parents = [-1, 0, 1, 1, 0, 4, 4, 4]
    pos = F.tidy_layout(F.tree_graph(parents))
    for node, parent in enumerate(parents):
        if parent >= 0:
            assert pos[node][0] == pos[parent][0] + 1
    for node in range(len(parents)):
        kids = [c for c, p in enumerate(parents) if p == node]
        if kids:
            ys = [pos[k][1] for k in kids]
            assert min(ys) <= pos[node][1] <= max(ys)
    leaves = sorted(pos[n][1] for n in range(len(parents)) if n not in parents)
    assert len(set(leaves)) == len(leaves)  # no two leaves share a row


def test_gate_figure_draws_each_layer_threshold_and_splits_passed_from_gated() -> None:
    st = make_step()
    fig = F.gate_figure(st)
    assert fig.layout.yaxis.type == "log"
    thresholds = sorted(
        {t.y[0] for t in fig.data if t.mode == "lines" and t.line.dash == "dash" and t.y[0] is not None}
    )
    assert thresholds == pytest.approx(sorted({0.1 * m for m in st.gate_layer_max if m is not None}))
    expanded = next(t for t in fig.data if (t.name or "").startswith("expanded"))
    gated = next(t for t in fig.data if (t.name or "").startswith("gated out"))
    assert len(expanded.y) == sum(p is True for p in st.gate_passed)
    assert list(gated.y) == pytest.approx([st.path_conf[5]])


def test_gate_figure_without_gates_says_so() -> None:
    st = make_step()
    st.gate_passed = [None] * len(st.tokens)
    fig = F.gate_figure(st)
    assert not fig.data and "no confidence gate" in fig.layout.annotations[0].text


def test_mask_is_the_ancestor_relation() -> None:
    st = make_step()
    fig = F.mask_figure(st)
    z = fig.data[0].z
    n = len(st.tokens)
    assert len(z) == n and all(len(row) == n for row in z)
    for i in range(n):
        ancestors = set()
        node = i
        while node >= 0:
            ancestors.add(node)
            node = st.parents[node]
        for j in range(n):
            assert (z[i][j] > 0) == (j in ancestors)
        assert (z[i][i] == 2) == (i in st.accepted)


def test_timeline_has_one_bar_per_busy_interval_in_the_window() -> None:
    steps = run_steps(6)
    fig = F.timeline_figure(steps, selected=4, window=3)
    drafter = next(t for t in fig.data if t.name == "drafter")
    assert list(drafter.text) == ["s2", "s3", "s4"]
    assert drafter.base[0] == pytest.approx(steps[2].drafter_busy[0][0] * 1e3)


def test_committed_tokens_follow_new_tokens_and_sources() -> None:
    st = make_step()
    assert [c.source for c in F.committed_tokens(st)] == ["retrieval", "retrieval", "bonus"]
    st.new_tokens = [11]  # a stop string cut the step after one token
    assert [c.text for c in F.committed_tokens(st)] == [" add"]
    assert F.committed_sources(st) == {"bonus": 0, "resampled": 0, "model": 0, "head": 0, "mtp": 0, "retrieval": 1,
                                       "both": 0}


def test_run_level_aggregates() -> None:
    steps = run_steps(4)
    steps[1].accepted, steps[1].new_tokens = [0], [99]
    assert F.acceptance_by_depth(steps) == [(1, 4, 3), (2, 4, 3), (3, 4, 0)]
    per_step = F.accepted_per_step_figure(steps)
    bonus = next(t for t in per_step.data if t.name == F.SOURCE_NAMES["bonus"])
    assert list(bonus.y) == [1, 1, 1, 1]
    assert F.step_end_times(steps) == pytest.approx([0.009, 0.019, 0.029, 0.039])


def test_sweep_grid_averages_cells_and_leaves_gaps() -> None:
    rows = [
        F.MeasuredCell("s", "m", 0.1, 8, 2.0, 10.0),
        F.MeasuredCell("s", "m", 0.1, 8, 3.0, 20.0),
        F.MeasuredCell("s", "m", 0.3, 16, 4.0, None),
    ]
    mus, budgets, z = F.sweep_grid(rows, "mat")
    assert (mus, budgets) == ([0.1, 0.3], [8, 16])
    assert z == [[2.5, None], [None, 4.0]]
    assert F.sweep_grid(rows, "tokens_per_second")[2] == [[15.0, None], [None, None]]


def test_visible_whitespace_and_control_characters() -> None:
    assert F.visible_ws(" a\n\tb\r") == "␣a↵⇥b␍"
    assert F.visible_ws("\x07\x1b\x7f") == "␇␛␡"
    assert F.clean_text("a\nb\x00") == "a\nb␀"
    assert "\u202e" not in F.clean_text("\u202eabc") and "\\u202e" in F.clean_text("\u202eabc")


# ---------------------------------------------------------------------------------------------
# Escaping: hostile token text and model names must never reach the page as markup
# ---------------------------------------------------------------------------------------------





def figure_strings(fig: go.Figure) -> str:
    """Every string the figure sends to the browser (JSON-decoded, so escapes are resolved)."""
    out: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(json.loads(fig.to_json()))
    return "\n".join(out)


@pytest.mark.parametrize("name", list(all_figures(make_step(), run_steps())))
def test_figures_escape_hostile_text(name: str) -> None:
    steps = hostile_steps()
    text = figure_strings(all_figures(steps[1], steps)[name])
    for bad in RAW_BAD:
        assert bad not in text, (name, bad)


@pytest.mark.parametrize("name", list(all_figures(make_step(), run_steps())))
def test_figures_use_only_the_entities_plotly_decodes(name: str) -> None:
    """Plotly's labels and hovers decode ``&amp; &lt; &gt;`` and numeric references; any other
    named one (``&quot;``) stays on screen as typed."""
    steps = hostile_steps()
    text = figure_strings(all_figures(steps[1], steps)[name])
    assert "&#34;" in text or name not in ("tree", "mask"), "the hostile quotes reach the labels"
    assert set(re.findall(r"&([A-Za-z]\w*);", text)) <= {"amp", "lt", "gt"}, name


def test_tree_hover_shows_escaped_text_with_visible_whitespace() -> None:
    steps = hostile_steps()
    fig = F.tree_figure(steps[0])
    hovers = "\n".join(h for t in node_traces(fig) for h in t.hovertext)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hovers
    assert "&#34;quoted&#39;" in hovers
    assert "tab⇥here↵nl" in hovers and "␇bell␛" in hovers






def hostile_summary() -> RunSummary:
    return RunSummary(
        text="<script>x</script>",
        token_ids=[1],
        prompt_token_ids=[1],
        steps=3,
        mean_accepted_tokens=3.0,
        tokens_per_second=5.0,
        seconds=1.0,
        target="<img src=x onerror=alert(1)>",
        draft='"><script>',
        dtype="float32",
        device="cpu",
        stop_reason="<b>eos",
        prompt="<img src=p onerror=alert(2)> \u202e<script>p</script>",  # the line that stays in view
    )


@pytest.mark.parametrize(
    "render",
    [
        lambda s: F.text_html(s, highlight=1, status="<script>done</script>"),
        lambda s: F.text_html(s, upto=0),
        lambda s: F.step_caption_html(s, 2),
        lambda s: F.summary_html(hostile_summary(), s, hostile_summary(), status='"><script>'),
    ],
    ids=["text", "text-upto", "caption", "summary"],
)
def test_html_escapes_hostile_text(render) -> None:
    html_text = render(hostile_steps())
    parsed = parse(html_text)
    assert parsed.tags <= {"div", "span", "b", "br", "details", "summary"}  # our own markup only
    assert parsed.attrs <= {"class", "title", "data-step"}
    for bad in RAW_BAD:
        assert bad not in html_text


def test_text_html_has_one_span_per_committed_token_and_step_boundaries() -> None:
    steps = run_steps(3)
    html_text = F.text_html(steps, highlight=1)
    assert html_text.count('class="tk ') == sum(len(st.new_tokens) for st in steps)
    assert html_text.count('data-step="') == 3
    assert html_text.count('class="step sel') == 1
    assert "src-retrieval" in html_text and "src-bonus" in html_text
    titles = parse(html_text).titles
    assert any(t.startswith("step 0 · retrieval draft, depth 1 · q 0.9") for t in titles)
    assert F.text_html(steps, upto=0).count('data-step="') == 1


def test_caption_says_why_the_tree_stopped_and_why_the_model_was_skipped() -> None:
    st = make_step()
    st.tree_stop, st.draft_forwards, st.trimmed = "cost", 2, 3
    st.p_accept_est = [1.0] + [0.5] * (len(st.tokens) - 1)
    plain = F.step_caption_html([st], 0)
    assert "would not pay" in plain and "3 unprofitable nodes trimmed" in plain and "2 draft forwards" in plain
    assert f"expected {0.5 * (len(st.tokens) - 1):.1f} accepted" in plain
    st.tree_stop, st.model_skipped = "skipped", "retrieval first: <4 retrieved nodes>"
    skipped = F.step_caption_html([st], 0)
    assert "the draft model did not run" in skipped and "retrieval first: &lt;4 retrieved nodes&gt;" in skipped
