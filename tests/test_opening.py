"""The first view: the bundled recording meets the teaching criterion, the page opens on the step
that shows the most, the controls reproduce the recording's run, the guided walk explains every
stop with the step's own numbers, and the re-run offer follows the planner's skips."""

from __future__ import annotations

import dataclasses
import re

import pytest

from talon import figures as F
from talon.engine.engine import Engine, generate
from talon.figures.opening import opening_criterion, opening_step, step_lessons
from talon.run_config import RetrievalConfig, RunConfig, SamplingConfig, TreeConfig
from talon.server.controls import Controls
from talon.settings import Settings
from talon.trace import RunSummary, StepTrace, dump_trace
from talon.ui.recording import load_recording, recording_controls
from tests.tiny import tiny_loaded


@pytest.fixture(scope="module")
def recording() -> tuple[RunSummary, list[StepTrace]]:
    loaded = load_recording()
    assert loaded is not None, "static/recording.json is missing or invalid"
    return loaded[0], list(loaded[1])


def test_bundled_recording_meets_the_teaching_criterion(recording) -> None:
    summary, steps = recording
    unmet = [name for name, met in opening_criterion(steps).items() if not met]
    assert not unmet, f"the bundled recording does not show: {unmet}"
    assert summary.prompt and summary.config.get("drafter") in ("hybrid", "model"), "it says what produced it"


def test_the_page_opens_on_the_step_that_shows_it_all(recording) -> None:
    _, steps = recording
    index = opening_step(steps)
    assert step_lessons(steps[index]).shows_all
    assert index < len(steps) - 1 or len(steps) == 1 or step_lessons(steps[-1]).shows_all


def test_step_lessons_read_the_trace(recording) -> None:
    _, steps = recording
    st = steps[opening_step(steps)]
    lessons = step_lessons(st)
    assert lessons.branching and lessons.gated and lessons.rejected
    assert not step_lessons(dataclasses.replace(st, gate_passed=[None] * len(st.tokens))).gated
    assert not step_lessons(dataclasses.replace(st, bonus_kind="bonus")).rejected
    chain = dataclasses.replace(st, parents=[-1] + list(range(len(st.tokens) - 1)))
    assert not step_lessons(chain).branching
    only_retrieval = dataclasses.replace(st, sources=["root"] + ["retrieval"] * (len(st.tokens) - 1))
    assert not step_lessons(only_retrieval).shows_all
    path = dataclasses.replace(chain, accepted=list(range(len(st.tokens))), bonus_kind="bonus")
    assert step_lessons(path).full_path == (len(st.tokens) >= 3)


def test_a_run_of_retrieval_chains_fails_the_criterion(recording) -> None:
    """The old first view (straight retrieval chains, nothing gated or rejected) would not pass."""
    _, steps = recording
    chains = [
        dataclasses.replace(
            st,
            parents=[-1] + list(range(len(st.tokens) - 1)),
            sources=["root"] + ["retrieval"] * (len(st.tokens) - 1),
            gate_passed=[None] * len(st.tokens),
            bonus_kind="bonus",
            tree_stop="skipped",
        )
        for st in steps
    ]
    assert sum(opening_criterion(chains).values()) <= 1  # at most "a fully accepted path"


def test_controls_from_config_reproduce_the_run_config() -> None:
    cfg = RunConfig(
        drafter="model",
        tree=TreeConfig("static", 24, 6, 3, 0.05, 10, 0.1, False),
        retrieval=RetrievalConfig(graft_threshold=4),
        sampling=SamplingConfig(temperature=0.7, top_p=0.9, seed=7),
        max_new_tokens=40,
        async_draft=True,
    )
    back = Controls.from_config(cfg.to_dict()).to_config(256)
    assert back.tree == cfg.tree and back.drafter == cfg.drafter
    assert back.retrieval.graft_threshold == 4 and back.max_new_tokens == 40 and back.async_draft
    assert (back.sampling.temperature, back.sampling.top_p, back.sampling.seed) == (0.7, 0.9, 7)
    assert Controls.from_config({}) == Controls()


def _element_ids(settings: Settings) -> set[str]:
    from talon.ui.layout import build_ui

    demo = build_ui(settings)
    return {c.elem_id for c in demo.blocks.values() if getattr(c, "elem_id", None)}


def test_the_page_opens_the_recording_and_its_prompt_in_one_update() -> None:
    """At load, one event shows the recording and sets the prompt box and controls it was made
    with. As two, the second landed on a busy host after a browser test had typed its prompt, and
    Run sent the recording's 3,279-token prompt to a 512-token model."""
    from talon.ui.layout import build_ui

    loads = [fn for fn in build_ui(Settings()).fns.values() if any(event == "load" for _, event in fn.targets)]
    ids = [{getattr(block, "elem_id", None) for block in fn.outputs} for fn in loads]
    setting_the_prompt = [found for found in ids if "talon-prompt" in found]
    assert len(setting_the_prompt) == 1 and {"talon-summary", "talon-cost-aware"} <= setting_the_prompt[0], ids


def test_every_walk_stop_points_at_a_figure_and_quotes_the_step(recording) -> None:
    summary, steps = recording
    ids = _element_ids(Settings())
    assert len(F.WALK) == 7 and len({s.key for s in F.WALK}) == 7
    for stop in F.WALK:
        assert stop.focus in ids, f"walk stop {stop.key} points at #{stop.focus}, which the page lacks"
    index = opening_step(steps)
    st = steps[index]
    cards = [F.walk_html(i, summary, steps, index) for i in range(len(F.WALK))]
    for i, card in enumerate(cards):
        assert f'data-focus="{F.WALK[i].focus}"' in card and f"{i + 1} / {len(F.WALK)}" in card
    assert f"{len(st.tokens) - 1} tokens" in cards[0]  # the tree: nodes drafted
    gated = sum(passed is False for passed in st.gate_passed)
    assert f"{gated} node" in cards[1]  # the gate: how many it cut
    assert f"all {len(st.tokens)} nodes" in cards[2]  # the mask: one forward
    # the question: the kept path is the one right answer, and the verdict is hidden until pressed
    question = cards[3]
    rights = re.findall(r'class="talon-choice" data-right="(\d)"', question)
    assert rights.count("1") == 1 and len(rights) >= 2, rights
    assert '<div class="talon-answer" hidden>' in question and "talon-hides" in question
    kept = len(st.accepted) - 1
    assert f"It kept <b>{kept}</b>" in question.split("talon-answer")[1]
    assert f"{len(st.new_tokens)} tokens" in cards[4] and "◆" in cards[4]  # a rejection, resampled
    assert f"{st.verify_s * 1e3:.0f} ms verifying" in cards[5]
    tokens = sum(len(s.new_tokens) for s in steps)
    assert f"wrote {tokens} tokens" in cards[6] and f"{tokens / len(steps):.2f}" in cards[6]
    # every step of the recording walks without error, and the card shows no raw markup from tokens
    for i in range(len(steps)):
        for stop in range(len(F.WALK)):
            F.walk_html(stop, summary, steps, i)
    hostile = dataclasses.replace(st, texts=["<img src=x onerror=alert(1)>"] * len(st.tokens))
    card = F.walk_html(0, summary, [hostile], 0)
    assert "<img" not in card and "&lt;img" in card


def test_the_question_answers_none_when_the_target_kept_nothing(recording) -> None:
    summary, steps = recording
    st = next(s for s in steps if len(s.tokens) > 3)
    predict = [s.key for s in F.WALK].index("predict")
    card = F.walk_html(predict, summary, [dataclasses.replace(st, accepted=[0])], 0)
    answers = re.findall(r'data-right="(\d)">(.*?)</button>', card)
    assert [label for right, label in answers if right == "1"] == [
        "None of them: it turns down the first token of every path"]
    with pytest.raises(ValueError, match="right answer"):
        F.predict_html("?", [F.Choice("a", False)], "")


def test_the_full_tree_offer_follows_the_planner_skips(recording) -> None:
    summary, steps = recording
    skipped = [dataclasses.replace(st, model_skipped="retrieval first") for st in steps]
    half = [dataclasses.replace(st, model_skipped="retrieval first" if i % 2 else "") for i, st in enumerate(steps)]
    cost_aware = {**summary.config, "tree": {**summary.config["tree"], "cost_aware": True}, "drafter": "hybrid"}
    on = dataclasses.replace(summary, config=cost_aware)
    assert F.model_skipped_most(on, skipped)
    assert "Show the full TALON tree" in F.summary_html(on, skipped)
    assert not F.model_skipped_most(on, half)  # half is not most
    assert not F.model_skipped_most(on, [dataclasses.replace(st, model_skipped="") for st in steps])
    off = dataclasses.replace(on, config={**cost_aware, "tree": {**cost_aware["tree"], "cost_aware": False}})
    assert not F.model_skipped_most(off, skipped)
    retrieval = dataclasses.replace(on, config={**cost_aware, "drafter": "retrieval"})
    assert not F.model_skipped_most(retrieval, skipped)
    assert "Show the full TALON tree" not in F.summary_html(off, skipped)


def test_run_with_the_controls_the_page_sets_repeats_the_recording(tmp_path) -> None:
    """Run reproduces the recording: a recording made with non-default controls, read back
    through what the page sets at load (``recording_controls``), runs to the same tokens."""
    import gradio as gr

    target, draft = tiny_loaded("llama", 0), tiny_loaded("llama", 1)
    cfg = RunConfig(
        drafter="hybrid",
        tree=TreeConfig("adaptive", 12, 3, 2, 0.2, 5, 0.0, False),
        retrieval=RetrievalConfig(graft_threshold=2),
        max_new_tokens=20,
    )
    summary, steps = generate(Engine(target, draft), "abc abc abc", cfg)
    path = tmp_path / "recording.json"
    dump_trace(str(path), summary, steps)
    load_recording.cache_clear()
    with gr.Blocks():
        prompt = gr.Textbox()
        components = {field.name: gr.Textbox() for field in dataclasses.fields(Controls)}
    updates = recording_controls(prompt, components, path)()
    values = {key: updates[component] for key, component in components.items() if component in updates}
    assert updates[prompt] == "abc abc abc" and values["budget"] == 12 and values["mu"] == 0.2
    again, again_steps = generate(Engine(target, draft), updates[prompt], Controls(**values).to_config(256))
    assert again.token_ids == summary.token_ids
    assert [len(st.accepted) for st in again_steps] == [len(st.accepted) for st in steps]
