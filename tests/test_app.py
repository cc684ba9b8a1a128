"""The app end to end: ``python app.py`` on tiny saved models, driven with gradio_client; plus
the server-side validation (controls, prompts, trace and results uploads) as plain functions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from gradio_client import Client, handle_file

import talon.trace
from talon.engine.prompt import PromptError
from talon.run_config import ConfigError, RunConfig
from talon.server.controls import Controls, user_error
from talon.server.examples import BUILTIN_EXAMPLES, load_examples
from talon.server.request import check_prompt
from talon.settings import Settings
from talon.trace import (
    TraceFileError,
    dump_trace,
    parse_trace,
    read_json_upload,
)
from talon.ui.decode_handlers import make_generate, make_nudge, make_show_step
from talon.ui.decode_view import DecodeView
from talon.ui.measure_panel import parse_sweep
from talon.ui.session import Session, stop
from tests.steps import good_trace, make_step, summary_of
from tests.tiny import (
    ACCEPTANCE,
    BY_DEPTH,
    COST,
    DOWNLOAD,
    GATES,
    INSPECTOR,
    MASK,
    PER_STEP,
    PLAIN_TEXT,
    REPO,
    SOURCES,
    SPEED,
    SUMMARY,
    TEXT,
    TIMELINE,
    TREE,
    finish,
    plot_json,
)

# ---------------------------------------------------------------------------------------------
# A launched app on tiny models (also used by test_browser.py)
# ---------------------------------------------------------------------------------------------
















# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------


def test_generate_streams_text_and_figures_and_the_trace_replays(client: Client) -> None:
    outputs, final = finish(client.submit("hello hello hello world, hello hello", api_name="/generate"))
    assert len(outputs) >= 2, "the run should stream intermediate updates"
    assert any('class="tk ' in str(out[TEXT]) for out in outputs[:-1]), "text should stream before the end"
    assert final[TEXT].count('class="tk ') >= 64
    tree = plot_json(final[TREE])
    nodes = [i for trace in tree["data"] if "customdata" in trace for i in trace["customdata"]]
    steps = json.loads(Path(final[DOWNLOAD]).read_text())["steps"]
    # the page ends on the last step, whose tree may be the root alone (the planner may skip drafting)
    assert len(nodes) == len(steps[-1]["tokens"]) and nodes.count(0) == 1
    assert any(len(step["tokens"]) >= 2 for step in steps), "some step drafted"
    for key in (GATES, MASK, TIMELINE, PER_STEP, BY_DEPTH, SOURCES, SPEED):
        assert plot_json(final[key])["layout"]["height"] > 0
    assert "MAT" in final[SUMMARY]
    assert "<table" in final[INSPECTOR] and "position id" in final[INSPECTOR]
    assert "Cost model" in plot_json(final[COST])["layout"]["title"]["text"]
    acceptance = plot_json(final[ACCEPTANCE])["layout"]
    if len(steps[-1]["tokens"]) >= 2:  # the last step drafted: its first drafted node is decided
        assert "siblings" in acceptance["title"]["text"]
    else:  # a busy host's planner may verify the root alone: the figure says what to pick
        assert "Pick a drafted node" in acceptance["annotations"][0]["text"]
    assert isinstance(final[PLAIN_TEXT], str) and final[PLAIN_TEXT].strip()  # the text as a plain string
    assert 'class="tk' not in final[PLAIN_TEXT] and len(final[PLAIN_TEXT]) < len(final[TEXT])

    trace = json.loads(Path(final[DOWNLOAD]).read_text())
    assert trace["format"] == "talon-trace/1"
    assert len(trace["steps"]) == trace["summary"]["steps"] >= 1
    replayed = client.predict(handle_file(final[DOWNLOAD]), api_name="/replay")
    assert replayed[TEXT] == final[TEXT]
    assert plot_json(replayed[TREE])["data"] == tree["data"]
    assert "replayed trace" in replayed[SUMMARY]


def test_empty_prompt_is_a_clear_error_and_the_app_keeps_serving(client: Client) -> None:
    with pytest.raises(Exception, match="prompt is empty"):
        client.predict("   ", api_name="/generate")
    with pytest.raises(Exception, match="budget must be an integer, got 2.5"):
        client.predict("abc", budget=2.5, api_name="/generate")
    with pytest.raises(Exception, match="less than minimum"):  # Gradio's own slider bounds
        client.predict("abc", budget=0, api_name="/generate")
    final = client.predict("abc abc abc", max_new_tokens=8, budget=6, api_name="/generate")
    assert final[TEXT].count('class="tk ') == 8


def test_malformed_trace_upload_is_refused_with_a_reason(client: Client, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(Exception, match="not valid JSON"):
        client.predict(handle_file(str(bad)), api_name="/replay")
    bad.write_text(json.dumps({"format": "something-else", "steps": []}))
    with pytest.raises(Exception, match="not a Talon trace"):
        client.predict(handle_file(str(bad)), api_name="/replay")


def test_serving_config_endpoint_takes_the_run_controls(client: Client) -> None:
    text, data, predicted = client.predict(drafter="model", tree_mode="static", budget=12, max_depth=5,
                                           api_name="/serving_config")
    assert "--speculative-config" in text and "sglang" in text.lower()
    assert "Record or upload this prompt's draft atlas" in predicted, "no atlas in this session yet"
    assert data["vllm_config"] and data["sglang_flags"] and data["versions"]["vllm"]
    with pytest.raises(Exception, match="budget must be an integer"):
        client.predict(budget=2.5, api_name="/serving_config")


def api_example() -> str:
    """docs/app.md's Python example against a Space, as a user copies it (the README links to it)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "app.md").read_text(encoding="utf-8")
    after = text.split("From Python, against a Space", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_api_example_runs_against_a_local_server(app_url: str) -> None:
    """Both kinds of call: a run through gradio_client (queued) and a light call on the plain
    HTTP route (not queued), the Space id swapped for the local server's address."""
    code = api_example()
    assert 'Client("USER/SPACE")' in code and "/gradio_api/run/serving_config" in code
    scope: dict = {}
    exec(compile(code.replace('"USER/SPACE"', repr(app_url)), "docs/app.md", "exec"), scope)  # noqa: S102
    assert isinstance(scope["text"], str) and scope["text"]
    assert scope["flags"]["sglang_command"] and scope["flags"]["vllm_command"] and "SGLang" in scope["markdown"]
    assert "Record or upload" in scope["forecast"]


def test_compare_and_sweep_endpoints(client: Client) -> None:
    summary, *_ = client.predict("abc abc abc abc", max_new_tokens=12, api_name="/compare")
    assert "A: hybrid · adaptive" in summary and "B: hybrid · static" in summary
    plain = {"cost_aware": False, "mu": 0.1}  # greedy, no clock in the plan: runs are reproducible
    progress, mat, speed, *_ = client.predict(
        "abc abc abc", mus="0.1", budgets="4, 8", sweep_tokens=6, api_name="/sweep", **plain
    )
    assert "sweep done: 2 runs" in progress
    z = plot_json(mat)["data"][0]["z"]
    assert len(z) == 1 and len(z[0]) == 2
    # Each cell is the MAT of a real run of that configuration: the (mu 0.1, N 8) cell equals a
    # plain /generate run of the same prompt and settings.
    _, final = finish(client.submit("abc abc abc", budget=8, max_new_tokens=6, api_name="/generate", **plain))
    summary = json.loads(Path(final[DOWNLOAD]).read_text())["summary"]
    assert z[0][1] == pytest.approx(summary["mean_accepted_tokens"])


# ---------------------------------------------------------------------------------------------
# Server-side validation, no server
# ---------------------------------------------------------------------------------------------


def test_default_controls_are_the_run_config_defaults() -> None:
    assert Controls().to_config(1024) == RunConfig()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"budget": 2.5}, "budget must be an integer"),
        ({"budget": True}, "budget must be an integer"),
        ({"mu": float("nan")}, "mu must be a number"),
        ({"mu": 1.5}, r"mu must be a number in \[0.0, 1.0\]"),
        ({"drafter": "none"}, "drafter must be one of"),
        ({"tree_mode": "bushy"}, "tree mode must be one of"),
        ({"max_new_tokens": 2000}, "at most 1024"),
    ],
)
def test_controls_refuse_bad_values(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Controls(**change).to_config(1024)


def test_controls_accept_integral_floats_from_sliders() -> None:
    cfg = Controls(budget=12.0, seed=3.0, max_new_tokens=16.0).to_config(1024)
    assert (cfg.tree.budget, cfg.sampling.seed, cfg.max_new_tokens) == (12, 3, 16)


def test_check_prompt() -> None:
    settings = Settings(max_prompt_tokens=4)
    assert check_prompt("hi", settings) == "hi"
    for bad in ("", "  \n", None):
        with pytest.raises(PromptError, match="empty"):
            check_prompt(bad, settings)
    with pytest.raises(PromptError, match="at most 64"):
        check_prompt("x" * 65, settings)




def test_trace_round_trip(tmp_path: Path) -> None:
    steps = [make_step(i) for i in range(3)]
    path = tmp_path / "trace.json"
    dump_trace(str(path), summary_of(steps), steps)
    summary, loaded = parse_trace(read_json_upload(path))
    assert loaded == steps
    assert summary.seconds == 0.3 and summary.target == "tiny"
    assert len(parse_trace(good_trace())[1]) == 2




def corrupt(path: str, value: object) -> dict:
    """good_trace() with steps[0][path] replaced by value (or deleted when value is ...)."""
    data = good_trace()
    if value is ...:
        del data["steps"][0][path]
    else:
        data["steps"][0][path] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "not a Talon trace"),
        ({"format": "talon-trace/0", "steps": []}, "not a Talon trace"),
        ({"format": "talon-trace/1", "steps": []}, "'steps' must be a list of 1"),
        (corrupt("tokens", ...), "step 0: missing field 'tokens'"),
        (corrupt("texts", [1] * 8), "field 'texts'"),
        (corrupt("q_draft", [math.nan] * 8), "field 'q_draft'"),
        (corrupt("sources", ["root"] + ["evil"] * 7), "field 'sources'"),
        (corrupt("parents", [-1, 0, 1, 2, 0, 0, 7, 4]), "do not describe a tree"),
        (corrupt("parents", [-1, 0]), "per-node lists"),
        (corrupt("accepted", [0, 4, 2]), "'accepted' must be a root-to-node path"),
        (corrupt("new_tokens", []), "'new_tokens' must hold"),
        (corrupt("step", "3"), "field 'step'"),
        (corrupt("drafter_busy", [[0.1]]), "field 'drafter_busy'"),
    ],
)
def test_malformed_traces_are_refused_with_a_reason(data: object, message: str) -> None:
    with pytest.raises(TraceFileError, match=message):
        parse_trace(data)


def test_uploads_have_a_size_limit_and_must_be_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(TraceFileError, match="not UTF-8"):
        read_json_upload(path)
    path.write_text("[1, 2,")
    with pytest.raises(TraceFileError, match="not valid JSON"):
        read_json_upload(path)
    monkeypatch.setattr(talon.trace, "MAX_UPLOAD_BYTES", 4)
    with pytest.raises(TraceFileError, match="limit"):
        read_json_upload(path)


def test_sweep_results_parse() -> None:
    results = {
        "env": {"device": "cpu"},
        "results": [
            {
                "suite": "qa",
                "method": "talon",
                "mu": 0.1,
                "budget": 16,
                "mat": 2.5,
                "tokens_per_second": 9.0,
                "speedup_vs_ar": 1.8,
            },
            {"suite": "qa", "method": "talon", "mu": 0.3, "budget": 16, "mat": 2.1, "tokens_per_second": None},
        ],
    }
    rows = parse_sweep(results)
    assert rows[0].speedup_vs_ar == 1.8 and rows[1].tokens_per_second is None
    with pytest.raises(TraceFileError, match="numeric 'mu' and 'budget'"):
        parse_sweep({"results": [{"mu": "x", "budget": 8}]})
    with pytest.raises(TraceFileError, match='"results" list'):
        parse_sweep({"rows": []})


def test_examples_come_from_specbench_or_the_builtins(tmp_path: Path) -> None:
    assert load_examples(tmp_path) == list(BUILTIN_EXAMPLES)
    lines = ['{"question_id": 1, "turns": ["first q", "second turn"]}', "not json", '{"turns": ["second q"]}']
    (tmp_path / "qa.jsonl").write_text("\n".join(lines))
    examples = load_examples(tmp_path, per_suite=5)
    assert [(e.suite, e.prompt) for e in examples] == [
        ("Natural Questions", "first q"),
        ("Natural Questions", "second q"),
    ]


# ---------------------------------------------------------------------------------------------
# Handlers in process (tiny engine, no server): stop, step-through, scrubbing
# ---------------------------------------------------------------------------------------------






def test_stop_ends_the_run_and_keeps_what_was_done(view: DecodeView) -> None:
    session = Session()
    run = make_generate(view, Settings())("abc abc abc", session, max_new_tokens=200)
    next(run)  # the run has started: its first update is out
    stop(session)
    final = list(run)[-1]
    assert session.summary is not None and session.summary.stop_reason == "cancelled"
    assert len(session.steps) <= 1
    assert "stopped" in final[view.summary]


def test_step_through_reveals_one_step_per_click(view: DecodeView) -> None:
    session = Session()
    final = list(make_generate(view, Settings())("abc abc abc", session, step_through=True, max_new_tokens=24))[-1]
    assert len(session.steps) >= 3
    assert final[view.text].count('data-step="') == 1 and final[view.slider]["value"] == 0
    after = make_nudge(view, +1)(session)
    assert after[view.text].count('data-step="') == 2 and session.shown == 1
    assert "step 1:" in after[view.tree].layout.title.text


def test_scrubbing_stops_following_and_latest_resumes(view: DecodeView) -> None:
    session = Session()
    list(make_generate(view, Settings())("abc abc abc", session, max_new_tokens=24))
    last = len(session.steps) - 1
    shown = make_show_step(view)(0, session)
    assert not session.follow and shown[view.slider]["value"] == 0
    assert shown[view.text].count('data-step="') == last + 1  # full text, step 0 highlighted
    assert make_show_step(view)(10**6, session)[view.slider]["value"] == last  # clamped
    live = view.live_updates(session, "running", full=False)
    assert view.tree not in live and view.gates not in live
    make_nudge(view, 0)(session)
    assert session.follow and session.shown == last


def test_async_sampling_run_draws_the_timeline_and_sampling_hovers(view: DecodeView) -> None:
    session = Session()
    run = make_generate(view, Settings())
    final = list(run("abc abc abc abc", session, async_draft=True, cost_aware=False, temperature=0.8, seed=1,
                     max_new_tokens=24))[-1]
    assert session.summary is not None and session.summary.config["async_draft"] is True
    lanes = {trace.name: trace for trace in final[view.timeline].data}
    assert len(lanes["drafter"].x) >= 1 and len(lanes["verifier"].x) >= 1
    hovers = "".join(h for trace in final[view.tree].data if trace.customdata is not None for h in trace.hovertext)
    assert "p_target" in hovers


def test_error_messages_quoting_user_input_are_escaped() -> None:
    error = user_error("tree mode must be one of ('adaptive',), got '<img src=x onerror=alert(1)>'")
    assert "<img" not in error.message and "&lt;img" in error.message and "'adaptive'" in error.message


def test_a_starting_run_says_the_figures_below_are_the_earlier_run(view: DecodeView) -> None:
    """Until the first step arrives (the prompt's prefill: 10-20 s on a 2-core CPU) the caption says
    so, instead of the recording's step sitting next to an emptied text."""
    session = Session()
    first = next(make_generate(view, Settings())("abc abc abc", session, max_new_tokens=8))
    assert "Reading the prompt" in first[view.caption] and "earlier run" in first[view.caption]
    assert 'data-step="' not in first[view.text]




def talon_way(frames: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(module, function) of the frames in talon's own code, from the Decode handler on."""
    way = []
    for filename, function in frames:
        path = Path(filename).resolve()
        if REPO / "talon" in path.parents:
            way.append((".".join(path.relative_to(REPO).with_suffix("").parts), function))
    start = next(i for i, (module, function) in enumerate(way) if module == "talon.ui.decode_handlers")
    return way[start:]


def visits(way: list[tuple[str, str]]) -> list[str]:
    """The modules in the order the way enters them (consecutive frames of one module: one visit)."""
    return [module for i, (module, _) in enumerate(way) if i == 0 or way[i - 1][0] != module]


def test_a_decode_press_reaches_the_step_loop_in_a_few_calls(view: DecodeView, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted on the real call stack when the first step runs: the calls from the Decode handler
    to ``Run._step``, in talon's own code (Gradio's frames and the generators' plumbing aside),
    at most 12, no module entered twice."""
    import traceback

    from talon.engine.run import Run

    stacks: list[list[tuple[str, str]]] = []
    step = Run._step

    def first_step(self: Run, *args: object, **kwargs: object) -> object:
        if not stacks:
            stacks.append([(f.filename, f.name) for f in traceback.extract_stack()[:-1]]
                          + [(step.__code__.co_filename, "_step")])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Run, "_step", first_step)
    list(make_generate(view, Settings())("abc abc abc", Session(), max_new_tokens=4))
    way = talon_way(stacks[0])
    assert way[0] == ("talon.ui.decode_handlers", "generate") and way[-1] == ("talon.engine.run", "_step")
    assert len(way) <= 12, way
    assert len(visits(way)) == len(set(visits(way))), visits(way)
    assert len(set(visits(way * 2))) < len(visits(way * 2))  # a way that comes back is caught
