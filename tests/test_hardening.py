"""Hardening: every kind of bad input is a clear error and the app keeps serving; cancel and
out-of-memory recovery; concurrent sessions get exactly their own output; the server hands out
no file but its own; hostile text stays escaped end to end; the ZeroGPU wrapper, the GPU presets
and the queue settings.

The end-to-end tests run ``python app.py`` on the tiny saved pair of ``tests.test_app`` with small
limits (TALON_MAX_PROMPT_TOKENS=64, two runs at once), on 127.0.0.1 only.
"""

from __future__ import annotations

import inspect
import json
import pickle
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import gradio as gr
import httpx
import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.utils import Status

import app
import talon.core.verify
import talon.models.zerogpu
import talon.server.device as ui_call
import talon.server.pair as ui_models
from talon.gpucheck.launch import REPO
from talon.server import offer
from talon.server.controls import Controls
from talon.server.device import GPU_BASE_S, GPU_MAX_S, decode_on_device, gpu_seconds, on_gpu
from talon.server.facade import decode
from talon.server.offer import find_preset, initial_preset, presets
from talon.server.pair import Held, load_engine, load_startup_pair
from talon.server.presets import DEFAULT_PRESET, PRESETS, STARTUP_GPU_PRESET, preload_repos
from talon.server.request import Job, plan_run
from talon.settings import EMBEDDED_TARGET, Settings
from talon.trace import MAX_TREE_NODES, MAX_UPLOAD_BYTES, RunSummary, StepTrace
from talon.ui.decode_handlers import make_generate
from talon.ui.decode_view import DecodeView
from talon.ui.measure_panel import MAX_SWEEP_CELLS
from talon.ui.panel import MODEL_CONCURRENCY_ID
from talon.ui.session import Session
from tests.steps import good_trace
from tests.tiny import (
    CAPTION,
    DOWNLOAD,
    SUMMARY,
    TEXT,
    TREE,
    byte_tokenizer,
    finish,
    front_matter,
    plot_json,
    serve,
    tiny_loaded,
)

MAX_PROMPT_TOKENS = 64
MAX_NEW_TOKENS_LIMIT = 256
LOAD_TIMEOUT_S = 120
HOSTILE_PROMPT = "<script>alert(1)</script>\"'\x07"


# ---------------------------------------------------------------------------------------------
# Servers on loopback
# ---------------------------------------------------------------------------------------------




@pytest.fixture(scope="module")
def limited_app_url(tiny_dirs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app on the tiny pair with small limits (``limited_client`` connects here)."""
    target, draft = tiny_dirs
    env = {
        "TALON_TARGET": str(target),
        "TALON_DRAFT": str(draft),
        "TALON_MAX_PROMPT_TOKENS": str(MAX_PROMPT_TOKENS),
        "TALON_MAX_NEW_TOKENS_LIMIT": str(MAX_NEW_TOKENS_LIMIT),
        "TALON_QUEUE_CONCURRENCY": "2",
        "TALON_QUEUE_SIZE": "8",
    }
    with serve(tmp_path_factory.mktemp("app"), env) as url:
        yield url


@pytest.fixture()
def limited_client(limited_app_url: str, tmp_path: Path) -> Client:
    return Client(limited_app_url, verbose=False, download_files=str(tmp_path))


def new_client(url: str, tmp_path: Path) -> Client:
    folder = tmp_path / f"client-{time.monotonic_ns()}"
    folder.mkdir()
    return Client(url, verbose=False, download_files=str(folder))


def trace_of(final: tuple) -> dict:
    return json.loads(Path(final[DOWNLOAD]).read_text())


def assert_ok_run(limited_client: Client) -> None:
    """The app still serves: a short greedy run completes with every token."""
    final = limited_client.predict("abc abc abc", max_new_tokens=8, budget=6, api_name="/generate")
    summary = trace_of(final)["summary"]
    assert len(summary["token_ids"]) == 8 or summary["stop_reason"] == "eos"


# ---------------------------------------------------------------------------------------------
# Bad input through the API
# ---------------------------------------------------------------------------------------------


def test_bad_prompts_are_clear_errors_and_the_app_keeps_serving(limited_client: Client) -> None:
    for empty in ("", "   \n\t "):
        with pytest.raises(Exception, match="the prompt is empty"):
            limited_client.predict(empty, api_name="/generate")
    with pytest.raises(Exception, match=rf"the prompt has 100 tokens; this server accepts at most {MAX_PROMPT_TOKENS}"):
        limited_client.predict("x" * 100, api_name="/generate")
    chars = 16 * MAX_PROMPT_TOKENS
    with pytest.raises(Exception, match=rf"{chars + 1} characters; this server accepts at most {chars}"):
        limited_client.predict("y" * (chars + 1), api_name="/generate")
    assert_ok_run(limited_client)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"budget": 0}, "less than minimum"),
        ({"budget": 10_000}, "greater than maximum"),
        ({"budget": 2.5}, "budget must be an integer, got 2.5"),
        ({"mu": 1.5}, "greater than maximum"),
        ({"temperature": -1}, "less than minimum"),
        ({"seed": -3}, "less than minimum|seed"),
        ({"max_new_tokens": MAX_NEW_TOKENS_LIMIT + 1}, "greater than maximum|at most 256"),
        ({"tree_mode": "bushy"}, "bushy"),
        ({"drafter": "none"}, "drafter must be one of|none"),
        ({"preset": "no-such-preset"}, "no-such-preset"),
    ],
)
def test_out_of_range_controls_are_refused(limited_client: Client, change: dict, message: str) -> None:
    with pytest.raises(Exception, match=message):
        limited_client.predict("abc abc", api_name="/generate", **change)


def test_the_app_serves_after_refused_sweeps(limited_client: Client) -> None:
    with pytest.raises(Exception, match="write numbers separated by commas, got '0.1, x'"):
        limited_client.predict("abc", mus="0.1, x", budgets="4", api_name="/sweep")
    with pytest.raises(Exception, match=f"at most {MAX_SWEEP_CELLS}"):
        limited_client.predict("abc", mus="0.1, 0.2, 0.3, 0.4", budgets="4, 8, 12, 16, 20, 24, 28, 32",
                               api_name="/sweep")
    assert_ok_run(limited_client)


def test_bad_trace_uploads_are_refused_with_a_reason(limited_client: Client, tmp_path: Path) -> None:
    cases = {
        "binary.json": (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
        "deep.json": (b"[" * 200_000, "nested too deeply"),
        "steps.json": (json.dumps({"format": "talon-trace/1", "steps": "all of them"}).encode(), "'steps' must be"),
        "huge-tree.json": (json.dumps(huge_tree_trace()).encode(), "1 to 4096 nodes"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(Exception, match=message):
            limited_client.predict(handle_file(str(path)), api_name="/replay")
    oversized = tmp_path / "oversized.json"
    oversized.write_bytes(b" " * (MAX_UPLOAD_BYTES + 1))
    with pytest.raises(Exception):  # noqa: B017  (refused by the upload route, before any handler)
        limited_client.predict(handle_file(str(oversized)), api_name="/replay")
    assert_ok_run(limited_client)


def huge_tree_trace() -> dict:
    data = good_trace()
    step = data["steps"][0]
    n = MAX_TREE_NODES + 1
    step.update(
        tokens=[1] * n,
        texts=["a"] * n,
        parents=[-1] + [0] * (n - 1),
        depths=[0] + [1] * (n - 1),
        q_draft=[0.5] * n,
        path_conf=[0.5] * n,
        sources=["root"] + ["model"] * (n - 1),
        gate_layer_max=[None] * n,
        gate_threshold=[None] * n,
        gate_passed=[None] * n,
        target_top1=[1] * n,
    )
    return data


# ---------------------------------------------------------------------------------------------
# Hostile text
# ---------------------------------------------------------------------------------------------


def strings_of(final: tuple) -> list[str]:
    """Every HTML output and every figure's JSON of a /generate or /replay result."""
    out = [final[i] for i in (SUMMARY, TEXT, CAPTION)]
    out += [value["plot"] for value in final if isinstance(value, dict) and value.get("type") == "plotly"]
    return out


def test_hostile_prompt_never_becomes_markup(limited_client: Client) -> None:
    final = limited_client.predict(HOSTILE_PROMPT, max_new_tokens=16, api_name="/generate")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in final[SUMMARY], "the summary repeats the prompt, escaped"
    for text in strings_of(final):
        assert "<script" not in text and "\x07" not in text
    assert trace_of(final)["summary"]["steps"] >= 1


def test_hostile_trace_text_is_shown_escaped(limited_client: Client, tmp_path: Path) -> None:
    data = good_trace()
    for step in data["steps"]:
        step["texts"] = [HOSTILE_PROMPT] * len(step["texts"])
        step["bonus_text"] = HOSTILE_PROMPT
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    final = limited_client.predict(handle_file(str(path)), api_name="/replay")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&#39;" in final[TEXT]
    for text in strings_of(final):
        assert "<script" not in text and "\x07" not in text
    hovers = json.dumps(plot_json(final[TREE])["data"])
    assert "&lt;script&gt;" in hovers


def test_hostile_values_in_error_messages_are_escaped() -> None:
    with pytest.raises(gr.Error) as caught:
        plan_run(Settings(), "abc", Controls(preset="<img src=x onerror=alert(1)>"))
    assert "&lt;img" in caught.value.message and "<img" not in caught.value.message


def test_the_target_weights_control_reaches_the_pair_and_is_checked_before_loading() -> None:
    preset, _ = plan_run(Settings(device="cpu"), "abc", Controls(target_weights="int4"))
    assert ui_models.pair_key(Settings(device="cpu"), preset).target_weights == "int4"
    preset, _ = plan_run(Settings(device="cpu", target_weights="int4"), "abc", Controls())  # auto: the server's
    assert ui_models.pair_key(Settings(device="cpu", target_weights="int4"), preset).target_weights == "int4"
    with pytest.raises(gr.Error, match="need the CPU"):
        plan_run(Settings(device="cuda"), "abc", Controls(target_weights="int4"))
    with pytest.raises(gr.Error, match="int8 target weights are not offered"):
        plan_run(Settings(device="cpu"), "abc", Controls(target_weights="int8"))
    with pytest.raises(gr.Error, match="target weights must be one of"):
        plan_run(Settings(), "abc", Controls(target_weights="fp4"))


# ---------------------------------------------------------------------------------------------
# Cancel, concurrency
# ---------------------------------------------------------------------------------------------


def test_cancel_mid_run_then_the_next_run_works(limited_client: Client) -> None:
    job = limited_client.submit("abc abc abc", max_new_tokens=MAX_NEW_TOKENS_LIMIT, api_name="/generate")
    deadline = time.monotonic() + 60
    while len(job.outputs()) < 2 and not job.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(job.outputs()) >= 2, "the run should have started streaming"
    job.cancel()
    deadline = time.monotonic() + 30
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.done() and job.status().code == Status.CANCELLED
    assert_ok_run(limited_client)


HARDENING_PROMPTS = (
    "alpha beta alpha beta alpha",
    "one two three, one two three",
    "def add(a, b): return a + b",
    "the cat sat on the mat; the cat",
)


def test_concurrent_sessions_match_sequential_runs(limited_app_url: str, tmp_path: Path) -> None:
    """Greedy output is a function of the prompt alone: four sessions at once (two runs at a time
    on the server) get exactly what one session got running them one after the other."""
    start = time.monotonic()
    sequential = new_client(limited_app_url, tmp_path)
    expected = [trace_of(sequential.predict(p, max_new_tokens=24, api_name="/generate")) for p in HARDENING_PROMPTS]
    clients = [new_client(limited_app_url, tmp_path) for _ in HARDENING_PROMPTS]
    jobs = [c.submit(p, max_new_tokens=24, api_name="/generate") for c, p in zip(clients, HARDENING_PROMPTS)]
    remaining = LOAD_TIMEOUT_S - (time.monotonic() - start)
    with ThreadPoolExecutor(len(jobs)) as pool:
        finals = list(pool.map(lambda job: finish(job, remaining)[1], jobs))
    assert time.monotonic() - start < LOAD_TIMEOUT_S
    got = [trace_of(final) for final in finals]
    for prompt, want, have in zip(HARDENING_PROMPTS, expected, got):
        for key in ("prompt_token_ids", "token_ids", "text"):
            assert have["summary"][key] == want["summary"][key], (prompt, key)
    assert len({tuple(t["summary"]["prompt_token_ids"]) for t in got}) == len(HARDENING_PROMPTS)


def test_queue_limits_come_from_settings() -> None:
    demo = app.build_app(Settings(queue_concurrency=3, queue_max_size=5))
    assert demo._queue.max_size == 5
    model_events = [fn for fn in demo.fns.values() if fn.api_name in ("generate", "compare", "sweep")]
    assert len(model_events) == 3
    for fn in model_events:
        assert (fn.concurrency_id, fn.concurrency_limit) == (MODEL_CONCURRENCY_ID, 3)


# ---------------------------------------------------------------------------------------------
# Files the server hands out
# ---------------------------------------------------------------------------------------------


def test_the_server_hands_out_no_file_outside_its_own(limited_app_url: str, tiny_dirs: tuple[Path, Path]) -> None:
    """No allowed_paths: absolute, relative (to the working directory, the repository) and
    encoded paths to the system, the source and the model weights are all refused."""
    secrets = ["/etc/passwd", str(REPO / "app.py"), "app.py", "talon/settings.py", str(tiny_dirs[0] / "config.json")]
    routes = ["gradio_api/file={}", "gradio_api/file/{}", "file={}"]
    with httpx.Client(base_url=limited_app_url, timeout=10) as http:
        for secret in secrets:
            for path in (secret, quote(secret, safe=""), "..%2F..%2F..%2F.." + quote(secret, safe="")):
                for route in routes:
                    url = route.format(path)
                    response = http.get(url)
                    assert response.status_code in (400, 403, 404, 405), (url, response.status_code)
                    assert "root:" not in response.text and "TALON_" not in response.text, url


# ---------------------------------------------------------------------------------------------
# Models that cannot be loaded
# ---------------------------------------------------------------------------------------------


def test_a_missing_model_is_an_error_on_generate_not_a_crash_at_start(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with serve(tmp_path, {"TALON_TARGET": str(missing), "TALON_DRAFT": "none"}) as url:
        bad = new_client(url, tmp_path)
        for _ in range(2):  # the second request is served too
            with pytest.raises(Exception, match=r"Local path .*no-such-model.* does not exist"):
                bad.predict("abc abc", max_new_tokens=4, api_name="/generate")


def test_unknown_hub_model_and_tokenizer_mismatch_are_clear_errors(
    tiny_dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = tiny_dirs[0]
    settings = Settings(target=str(target), draft="no-such-org/no-such-model", device="cpu", dtype="float32")
    with pytest.raises(gr.Error, match="no-such-org/no-such-model"):
        decode(settings, "abc", Controls(), threading.Event())

    other = tmp_path / "other-tokenizer"
    tiny_loaded("llama", 1).model.save_pretrained(other)
    tokenizer = byte_tokenizer()
    tokenizer.eos_token, tokenizer.pad_token = "<pad>", "<eos>"
    tokenizer.save_pretrained(other)
    settings = Settings(target=str(target), draft=str(other), device="cpu", dtype="float32")
    with pytest.raises(gr.Error, match="does not share the tokenizer"):
        decode(settings, "abc", Controls(), threading.Event())


# ---------------------------------------------------------------------------------------------
# Out of memory (in process)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory"),
    ],
)
def test_out_of_memory_is_a_clear_error_and_the_next_run_works(
    view: DecodeView, monkeypatch: pytest.MonkeyPatch, error: RuntimeError
) -> None:
    verify_tree = talon.core.verify.verify_tree

    def exhausted(*args: object, **kwargs: object) -> torch.Tensor:
        raise error

    emptied: list[bool] = []
    monkeypatch.setattr(talon.core.verify, "verify_tree", exhausted)
    monkeypatch.setattr(offer, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    generate = make_generate(view, Settings(presets="all", preset="default"))  # a GPU server holding the default pair
    session = Session()
    with pytest.raises(gr.Error, match="ran out of memory .*budget N 16, max new tokens 12"):
        list(generate("abc abc abc", session, max_new_tokens=12))
    assert emptied, "the CUDA cache should be emptied"

    monkeypatch.setattr(talon.core.verify, "verify_tree", verify_tree)
    final = list(generate("abc abc abc", session, max_new_tokens=12))[-1]
    assert session.summary is not None and len(session.summary.token_ids) == 12
    assert final[view.download] and not len(ui_call.CANCELS)


def test_other_runtime_errors_are_not_reported_as_out_of_memory(
    view: DecodeView, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(talon.core.verify, "verify_tree", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        list(make_generate(view, Settings())("abc abc", Session(), max_new_tokens=4))


# ---------------------------------------------------------------------------------------------
# ZeroGPU, GPU presets, remote code
# ---------------------------------------------------------------------------------------------


def test_on_gpu_is_spaces_gpu_where_spaces_is_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    def fn(x: int) -> int:
        return x

    monkeypatch.setattr(talon.models.zerogpu, "spaces_module", lambda: None)
    assert on_gpu(gpu_seconds)(fn) is fn
    assert inspect.isgeneratorfunction(decode_on_device)

    calls: list[object] = []

    def fake_gpu(duration: object) -> object:
        calls.append(duration)
        return lambda task: ("reserved", task)

    monkeypatch.setattr(talon.models.zerogpu, "spaces_module", lambda: SimpleNamespace(GPU=fake_gpu))
    assert on_gpu(gpu_seconds)(fn) == ("reserved", fn)
    assert calls == [gpu_seconds]
    # spaces calls duration with the decorated function's own arguments
    assert list(inspect.signature(gpu_seconds).parameters) == list(inspect.signature(decode_on_device).parameters)


def test_gpu_seconds_grow_with_max_new_tokens_and_a_load() -> None:
    preset = PRESETS[0]

    def seconds(*tokens: int) -> int:
        jobs = [Job(preset, "abc", Controls(max_new_tokens=n).to_config(100_000)) for n in tokens]
        return gpu_seconds(Settings(), jobs, "id")

    held = ui_models.SLOT.held
    try:
        ui_models.SLOT.held = Held(ui_models.pair_key(Settings(), preset), None)
        assert seconds(10) == GPU_BASE_S + 1
        assert seconds(100) < seconds(1000) <= GPU_MAX_S
        assert seconds(10, 10) == GPU_BASE_S + 2  # a Compare: one reservation for both runs
        assert seconds(100_000) == GPU_MAX_S
        ui_models.SLOT.held = None
        assert seconds(10) == GPU_BASE_S + ui_call.GPU_LOAD_S + 1  # the pair loads inside the call
    finally:
        ui_models.SLOT.held = held


def test_what_decode_on_device_takes_and_yields_pickles(view: DecodeView) -> None:
    """On ZeroGPU the arguments and every yielded item cross a process boundary."""
    settings, preset = Settings(), PRESETS[0]
    cfg = Controls(max_new_tokens=8).to_config(1024)
    jobs = [Job(preset, "abc abc", cfg), Job(preset, "abc abc", cfg.replace(drafter="none"))]
    pickle.dumps((settings, jobs, "id"))
    items = pickle.loads(pickle.dumps(list(decode_on_device(settings, jobs, "id"))))
    assert [i for i, item in items[:-1] if isinstance(item, RunSummary)] == [0, 1] and len(items) >= 4
    assert all(type(item[1]) in (StepTrace, RunSummary) for item in items[:-1])
    assert isinstance(items[-1], ui_call.Learned)  # what the call learned, as plain data


def test_gpu_presets_are_offered_with_cuda_in_bf16_and_the_startup_pair_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(offer, "cuda_available", lambda: False)
    assert [p.key for p in presets(Settings())] == [DEFAULT_PRESET]
    assert initial_preset(Settings()) == DEFAULT_PRESET

    monkeypatch.setattr(offer, "cuda_available", lambda: True)
    gpu = [p for p in presets(Settings(presets="all")) if p.needs_cuda]
    assert {"qwen2.5-7b", "llama-3.1-8b"} <= {p.key for p in gpu}
    assert all(p.dtype == "bfloat16" and p.target and p.draft for p in gpu)
    assert [p.key for p in presets(Settings(device="cpu"))] == [DEFAULT_PRESET]
    assert initial_preset(Settings()) == STARTUP_GPU_PRESET
    assert initial_preset(Settings(target="/my/model")) == DEFAULT_PRESET

    loads: list[ui_models.PairKey] = []
    def fake_engine(key: ui_models.PairKey) -> SimpleNamespace:
        loads.append(key)
        return SimpleNamespace(target=None, draft=None)

    monkeypatch.setattr(ui_models, "SLOT", ui_models.PairSlot(fake_engine, lambda: None, lambda device: None))
    load_startup_pair(Settings())
    load_engine(Settings(dtype="float16"), find_preset(Settings(), STARTUP_GPU_PRESET))
    switching = Settings(presets="all", preset_switch="visitors")  # where a visitor may pick the default pair
    load_engine(switching, find_preset(switching, DEFAULT_PRESET))
    assert [(k.target, k.dtype) for k in loads] == [
        ("Qwen/Qwen2.5-7B-Instruct", "bfloat16"),
        ("Qwen/Qwen2.5-7B-Instruct", "float16"),  # TALON_DTYPE wins
        (EMBEDDED_TARGET, "auto"),
    ]


def test_readme_preloads_the_gpu_presets() -> None:
    preload = front_matter()["preload_from_hub"]
    assert preload == preload_repos()
    startup = next(p for p in PRESETS if p.key == STARTUP_GPU_PRESET)
    assert set(startup.repos) <= set(preload)


def test_remote_code_is_off_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def fake_load_pair(target: str, draft: str, dtype: str, device: str, allow_remote_code: bool, cache_dir: str,
                       draft_quant: str = "auto", target_weights: str = "dense", prepack: bool | None = None,
                       aux_layers: tuple[int, ...] = ()):
        seen.append(allow_remote_code)
        return SimpleNamespace(), None

    import talon.engine.build

    monkeypatch.setattr(talon.engine.build, "load_pair", fake_load_pair)
    monkeypatch.setattr(talon.engine.build, "Engine", lambda target, draft, **kwargs: SimpleNamespace(
        target=SimpleNamespace(device="cpu"), draft=None, forward_path="dynamic"))
    monkeypatch.setattr(ui_models, "SLOT", ui_models.PairSlot(ui_models.build_engine, lambda: None, lambda d: None))
    for env in ({}, {"TALON_ALLOW_REMOTE_CODE": "1"}):
        load_engine(Settings.from_env(env), PRESETS[0])
    assert seen == [False, True]


def test_the_models_menu_names_the_default_pair_by_its_models() -> None:
    """A first-time visitor reads which models run, not environment-variable names (the old label,
    "Default pair (TALON_TARGET + TALON_DRAFT)", was also cut off in the narrow column)."""
    import dataclasses

    from talon.server.offer import preset_label
    from talon.server.presets import PRESETS
    from talon.settings import Settings

    default, gpu = PRESETS[0], PRESETS[1]
    built_in = preset_label(default, Settings())
    assert "Qwen2.5-Coder" in built_in and "TALON_" not in built_in and len(built_in) <= 27
    served = dataclasses.replace(Settings(), target="Qwen/Qwen2.5-7B-Instruct", draft="/srv/models/tiny-draft.gguf")
    assert preset_label(default, served) == "Server pair: Qwen2.5-7B-Instruct + tiny-draft"
    assert preset_label(default, dataclasses.replace(served, draft="")).endswith("+ no draft model")
    assert preset_label(gpu, Settings()) == gpu.label
