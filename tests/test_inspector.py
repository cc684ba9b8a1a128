"""What a learner sees of one step: the target's top 5 and position id of every node, bonus vs
resampled tokens, the node inspector, the cost view, the serving metrics, and the lighter
streaming (unchanged outputs are not resent)."""

from __future__ import annotations

import json
import math

import plotly.graph_objects as go
import pytest

from talon import figures as F
from talon.cost.model import synthetic_costs
from talon.engine.engine import Engine, generate
from talon.run_config import RunConfig, SamplingConfig, TreeConfig
from talon.trace import StepTrace, TraceFileError, parse_trace, serving_metrics
from talon.ui.session import Session
from tests.steps import RAW_BAD, hostile_steps, make_step, parse
from tests.tiny import noisy_copy, tiny_loaded

INSPECTED_PROMPT = "abc abc abc abd abc"


@pytest.fixture(scope="module")
def inspected_engine() -> Engine:
    target = tiny_loaded("llama", 31)
    return Engine(target, noisy_copy(target, 32, 0.3))


def inspected(step: StepTrace, prefix: int = 40) -> StepTrace:
    """make_step with the inspector fields an engine records."""
    n = len(step.tokens)
    step.positions = [prefix + d for d in step.depths]
    step.target_topk_ids = [[step.target_top1[i], 50 + i, 60 + i, 70 + i, 80 + i] for i in range(n)]
    step.target_topk_probs = [[0.5, 0.49, 0.005, 0.003, 0.002] if i == 2 else [0.6, 0.2, 0.1, 0.05, 0.05]
                              for i in range(n)]
    step.target_topk_texts = [[f"t{t}" for t in ids] for ids in step.target_topk_ids]
    step.p_accept_est = [1.0, 0.9, 0.7, 0.3, 0.2, 0.01, 0.1, 0.05]
    return step


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=0.8, top_p=0.95, seed=3)],
                         ids=["greedy", "sampling"])
def test_every_node_records_the_targets_top5_and_its_position(inspected_engine: Engine,
                                                              sampling: SamplingConfig) -> None:
    cfg = RunConfig(drafter="hybrid", tree=TreeConfig(budget=10, cost_aware=False), max_new_tokens=24,
                    sampling=sampling)
    summary, steps = generate(inspected_engine, INSPECTED_PROMPT, cfg)
    prefix = len(summary.prompt_token_ids) - 1
    for st in steps:
        n = len(st.tokens)
        assert len(st.target_topk_ids) == len(st.target_topk_probs) == len(st.target_topk_texts) == n
        for i in range(n):
            probs = st.target_topk_probs[i]
            assert len(probs) == 5 and all(a >= b for a, b in zip(probs, probs[1:])) and sum(probs) <= 1 + 1e-6
            if sampling.greedy:
                assert st.target_topk_ids[i][0] == st.target_top1[i]
        assert st.positions == [prefix + d for d in st.depths]
        siblings = [(a, b) for a in range(1, n) for b in range(a + 1, n) if st.parents[a] == st.parents[b]]
        assert all(st.positions[a] == st.positions[b] for a, b in siblings)
        prefix += len(st.new_tokens)
        last = st.accepted[-1]
        tried = [c for c in range(1, n) if st.parents[c] == last]
        assert st.bonus_kind == ("resampled" if tried else "bonus")
        if not sampling.greedy and tried:
            rejected = {st.tokens[c] for c in tried}
            assert st.residual_topk and all(p == 0 or t not in rejected for t, p in st.residual_topk)
        else:
            assert st.residual_topk == []
    kinds = {st.bonus_kind for st in steps}
    assert kinds == {"bonus", "resampled"}, "the prompt must exercise both kinds"


def test_new_fields_round_trip_and_are_validated(inspected_engine: Engine) -> None:
    summary, steps = generate(inspected_engine, INSPECTED_PROMPT, RunConfig(max_new_tokens=12))
    data = json.loads(json.dumps({"format": "talon-trace/1", "summary": summary.to_dict(),
                                  "steps": [s.to_dict() for s in steps]}))
    _, back = parse_trace(data)
    assert [s.positions for s in back] == [s.positions for s in steps]
    assert [s.target_topk_ids for s in back] == [s.target_topk_ids for s in steps]
    assert back[0].residual_topk == steps[0].residual_topk
    bad = json.loads(json.dumps(data))
    bad["steps"][0]["positions"] = [p + (1 if i == 1 else 0) for i, p in enumerate(bad["steps"][0]["positions"])]
    if len(bad["steps"][0]["positions"]) > 1:
        with pytest.raises(TraceFileError, match="positions"):
            parse_trace(bad)
    bad = json.loads(json.dumps(data))
    bad["steps"][0]["target_topk_probs"][0][0] = 7.0
    with pytest.raises(TraceFileError, match="target_topk_probs"):
        parse_trace(bad)
    bad = json.loads(json.dumps(data))
    bad["steps"][0]["bonus_kind"] = "<script>"
    with pytest.raises(TraceFileError, match="bonus_kind"):
        parse_trace(bad)


# talon-trace/1's step keys: StepTrace is built from its parts, and its JSON stays what it was
TRACE_STEP_KEYS = {
    "step", "tokens", "texts", "parents", "depths", "q_draft", "path_conf", "sources", "gate_layer_max",
    "gate_threshold", "gate_passed", "target_top1", "accepted", "bonus_token", "bonus_text", "new_tokens", "p_target",
    "p_accept", "draft_s", "verify_s", "other_s", "drafter_busy", "verifier_busy", "predraft_reused", "match_len",
    "tree_stop", "model_skipped", "trimmed", "draft_forwards", "p_accept_est", "predicted_verify_s",
    "target_topk_ids", "target_topk_probs", "target_topk_texts", "positions", "bonus_kind", "residual_topk",
}


def test_a_step_is_its_parts_and_its_json_is_unchanged(inspected_engine: Engine) -> None:
    summary, steps = generate(inspected_engine, INSPECTED_PROMPT, RunConfig(max_new_tokens=6))
    assert set(steps[0].to_dict()) == TRACE_STEP_KEYS
    assert steps[0].timing.verify_s == steps[0].verify_s > 0
    older = {**summary.to_dict(), "forward": "static+fold"}  # a summary written before forward_path
    del older["forward_path"]
    data = json.loads(json.dumps({"format": "talon-trace/1", "summary": older, "steps": [s.to_dict() for s in steps]}))
    read, _ = parse_trace(data)
    assert read.forward_path == "static+fold" and summary.stop_reason == "max_new_tokens"


def test_mask_rows_carry_node_token_and_position() -> None:
    st = inspected(make_step())
    fig = F.mask_figure(st)
    rows = list(fig.layout.yaxis.ticktext)
    assert rows[0] == "0:def @40" and rows[4].endswith("@41") and rows[6].endswith("@42")
    assert "positions: query 42, key 41" in fig.data[0].hovertext[6][4]


def test_tree_hover_shows_position_and_top5() -> None:
    st = inspected(make_step())
    hovers = "\n".join(h for t in F.tree_figure(st).data if t.customdata is not None for h in t.hovertext)
    assert "position 41" in hovers and "t51 0.20" in hovers


def test_bonus_and_resampled_tokens_look_different() -> None:
    full = make_step()  # node 2 has child 3 (rejected): the last token replaces it
    full.bonus_kind = "resampled"
    leaf = make_step()
    leaf.accepted, leaf.new_tokens = [0, 1, 2, 3], [11, 12, 13, 99]
    leaf.bonus_kind = "bonus"
    marks = {}
    for st in (full, leaf):
        star = [t for t in F.tree_figure(st).data if t.name in (F.SOURCE_NAMES["bonus"], F.SOURCE_NAMES["resampled"])]
        marks[st.bonus_kind] = (star[0].marker.symbol, star[0].marker.color, star[0].name)
    assert marks["bonus"] != marks["resampled"] and marks["bonus"][0] == "star"
    assert 'class="tk src-resampled"' in F.text_html([full]) and 'class="tk src-bonus"' in F.text_html([leaf])
    assert "resampled" in F.step_caption_html([full], 0) and "bonus" in F.step_caption_html([leaf], 0)
    assert F.committed_sources(full)["resampled"] == 1 and F.committed_sources(leaf)["bonus"] == 1


def test_inspector_table_marks_the_drafted_token_and_flags_near_ties() -> None:
    st = inspected(make_step())
    choices = F.node_choices(st)
    assert [v for _, v in choices] == list(range(8)) and "rejected" in choices[3][0]
    assert F.default_node(st) == 3  # the first rejected node
    html = F.node_inspector_html(st, 3, F.token_vocab([st]))
    assert "position id 43" in html and "rejected" in html
    assert "13</td>" in html or "not in the target" in html  # the drafted token, marked or named
    assert "near-tie" in html  # node 3's parent (node 2) has a 0.5 / 0.49 top two
    accepted = F.node_inspector_html(st, 2, F.token_vocab([st]))
    assert "would write next" in accepted and 'class="mark"' in accepted  # the resampled token is in its top 5
    assert "not reached" in F.node_inspector_html(st, 6)


def test_inspector_escapes_hostile_text() -> None:
    for st in hostile_steps():
        st = inspected(st)
        st.target_topk_texts = [["<script>", "\u202e", "<img", "\x07", "ok"] for _ in st.tokens]
        html = F.node_inspector_html(st, 3, F.token_vocab([st]))
        tags = parse(html).tags
        assert tags <= {"div", "b", "code", "table", "thead", "tbody", "tr", "th", "td"}
        for bad in RAW_BAD:
            assert bad not in html


def test_cost_view_places_the_steps_and_the_goodput_peak() -> None:
    costs = synthetic_costs({1: 0.1, 128: 0.1 + 127 * 0.01}, {1: 0.02, 128: 0.1})
    steps = [inspected(make_step(i)) for i in range(4)]
    for st in steps:
        st.verify_s, st.draft_s = 0.15, 0.05
    fig = F.cost_figure(costs.to_dict(), steps, 2)
    go.Figure(fig.to_dict())  # valid plotly
    names = [t.name for t in fig.data]
    assert "this run's steps (measured)" in names and any(n.startswith("best: ") for n in names)
    sizes, rates = F.expected_rate(steps[2], *[F.cost.curves(costs.to_dict())[i] for i in (0, 2)])
    best = sizes[max(range(len(rates)), key=rates.__getitem__)]
    assert 0 < best < 7  # the unlikely tail does not pay for its verification
    expensive = synthetic_costs({1: 0.1, 128: 0.1 + 127 * 0.5})
    sizes, rates = F.expected_rate(steps[2], *[F.cost.curves(expensive.to_dict())[i] for i in (0, 2)])
    assert max(range(len(rates)), key=rates.__getitem__) < best
    assert "cost model appears" in json.dumps(F.cost_figure(None, steps, 0).to_dict())


def test_serving_metrics_use_the_engines_definitions() -> None:
    m = serving_metrics([2, 0, 3, 0], [5, 4, 6, 0])  # the last step drafted nothing
    assert m["num_drafts"] == 3 and m["num_draft_tokens"] == 15 and m["num_accepted_tokens"] == 5
    assert math.isclose(m["mean_acceptance_length"], 1 + 5 / 3)
    assert m["per_position_acceptance_rate"] == pytest.approx([2 / 3, 2 / 3, 1 / 3])


def test_run_summary_carries_serving_metrics(inspected_engine: Engine) -> None:
    summary, steps = generate(inspected_engine, INSPECTED_PROMPT, RunConfig(max_new_tokens=16))
    m = summary.serving_metrics
    assert m["num_accepted_tokens"] == sum(s.accept_len for s in steps)
    assert m["num_draft_tokens"] == sum(len(s.tokens) - 1 for s in steps)


def test_stream_does_not_resend_unchanged_outputs() -> None:
    import gradio as gr

    with gr.Blocks():
        text, plot, state = gr.HTML(), gr.Plot(), gr.State()
    session = Session()
    st = make_step()
    first = session.unsent({text: "<b>a</b>", plot: F.mask_figure(st), state: session})
    assert set(first) == {text, plot, state}
    again = session.unsent({text: "<b>a</b>", plot: F.mask_figure(st), state: session})
    assert set(again) == {state}  # only the server-side state passes
    changed = session.unsent({text: "<b>ab</b>", plot: F.mask_figure(st), state: session})
    assert set(changed) == {text, state}
    computed, sent = session.payload[1]
    assert sent == 0 and computed > 1000
    session.begin(False, None)  # a new run forgets what was sent
    assert set(session.unsent({text: "<b>ab</b>"})) == {text}


def test_figures_keep_the_users_zoom() -> None:
    st = make_step()
    for fig in (F.tree_figure(st), F.mask_figure(st), F.gate_figure(st), F.accepted_per_step_figure([st])):
        assert fig.layout.uirevision == "talon"


def test_streamed_text_leaves_out_the_hover_titles() -> None:
    steps = [make_step(i) for i in range(3)]
    live, final = F.text_html(steps, highlight=2, titles=False), F.text_html(steps, highlight=2)
    assert "title=" not in live and final.count("title=") == live.count('class="tk ')
    assert len(live) < 0.6 * len(final)


def test_the_node_list_shows_tokens_as_text_not_entities() -> None:
    """A dropdown shows its labels as typed: quotes and angle brackets stay themselves."""
    import dataclasses

    st = dataclasses.replace(inspected(make_step()), texts=["'''\n", "<b>", '"x"', "a", "b", "c", "d", "e"])
    labels = [label for label, _ in F.node_choices(st)]
    assert labels[0].startswith("0 · '''↵") and "<b>" in labels[1] and '"x"' in labels[2]
    assert not any("&#" in label or "&lt;" in label for label in labels)
