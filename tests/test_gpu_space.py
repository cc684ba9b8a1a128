"""The GPU Space's paths, proven on a CPU: device discipline (generators, KV surgery, the LM head),
placement over several GPUs, preset switching that fits, ZeroGPU by its contract (a CUDA
tripwire around every user action), and a GPU that is present but unusable, said aloud."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
import torch
from transformers import DynamicCache

import app
import talon.server.device as ui_call
import talon.server.pair as ui_models
from talon.core.accept import accept_sampling
from talon.core.kv import gather_entries
from talon.core.verify import TargetVerifier
from talon.engine.engine import Engine
from talon.models import ModelLoadError, gpu_health, loading, zerogpu
from talon.models.head import lm_logits
from talon.models.rng import DeviceMismatch, generator_for
from talon.run_config import SamplingConfig
from talon.server import facade, offer
from talon.server.pair import Held, PairSlot
from talon.settings import PairKey, Settings
from talon.tree import DraftTree
from talon.ui.decode_handlers import make_generate
from talon.ui.layout import build_ui
from talon.ui.session import CompareSession, Session
from tests.tiny import REPO, FakeGPU, tiny_model

GIB = 1024**3


# ---------------------------------------------------------------------------------------------
# 1. Device discipline
# ---------------------------------------------------------------------------------------------


def chain_tree(n: int = 3) -> DraftTree:
    tree = DraftTree.with_root(5)
    parent = 0
    for i in range(n):
        parent = tree.add(parent, 10 + i, 0.5, "model")
    return tree


def test_a_generator_on_another_device_cannot_sample() -> None:
    """Checked where the generator is used: probabilities on one device, generator on another."""
    tree = chain_tree()
    probs = torch.full((len(tree), 32), 1 / 32, device="meta")
    with pytest.raises(DeviceMismatch, match="cpu.*meta"):
        accept_sampling(tree, probs, torch.Generator().manual_seed(0))
    cpu = torch.full((len(tree), 32), 1 / 32)  # the same call with agreeing devices samples
    assert accept_sampling(tree, cpu, generator_for(cpu.device, 0)).bonus_token in range(32)


def test_the_verifier_makes_its_generator_where_the_logits_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked where the generator is made: on the LM head's device (a GPU here, faked)."""
    asked: list[object] = []
    real = torch.Generator

    def recording_generator(device: object = None) -> torch.Generator:
        asked.append(device)
        return real()

    monkeypatch.setattr(torch, "Generator", recording_generator)
    model = tiny_model()
    head = SimpleNamespace(weight=SimpleNamespace(device=torch.device("cuda", 1)))
    monkeypatch.setattr(model, "get_output_embeddings", lambda: head)
    TargetVerifier(model, SamplingConfig(temperature=0.7, seed=3))
    assert asked == [torch.device("cuda", 1)]


def test_kv_surgery_never_mixes_devices() -> None:
    """The cache on another device than the CPU, its layers of unequal length (a sliding window):
    the index moves to each layer's device, and "nothing to drop" compares no tensors."""
    cache = DynamicCache()
    for layer, length in enumerate((6, 5)):
        cache.update(torch.empty(1, 2, length, 4, device="meta"), torch.empty(1, 2, length, 4, device="meta"), layer)
    gather_entries(cache, list(range(5)))  # layer 0 drops one entry; layer 1 keeps all (a device/CPU compare)
    assert [layer.keys.shape[-2] for layer in cache.layers] == [5, 5]
    gather_entries(cache, [0, 1, 3])
    assert [layer.keys.shape[-2] for layer in cache.layers] == [3, 3]


def test_the_lm_head_runs_where_its_weight_lives(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[torch.device, torch.device]] = []
    real_linear = torch.nn.functional.linear

    def recording_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        seen.append((x.device, weight.device))
        return real_linear(torch.zeros(x.shape), torch.zeros(weight.shape))  # meta tensors hold no data

    monkeypatch.setattr(torch.nn.functional, "linear", recording_linear)
    model = tiny_model()
    head = SimpleNamespace(weight=torch.empty(258, 64, device="meta"), bias=None)
    monkeypatch.setattr(model, "get_output_embeddings", lambda: head)
    lm_logits(model, torch.ones(3, 64))
    assert seen == [(torch.device("meta"), torch.device("meta"))]


# ---------------------------------------------------------------------------------------------
# 5. Several GPUs: only the target spreads
# ---------------------------------------------------------------------------------------------


def test_only_the_target_spreads_over_several_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cuda = torch.device("cuda")
    assert loading.device_map(cuda, spread=True) == "auto"
    assert loading.device_map(cuda, spread=False) == {"": torch.device("cuda", 0)}
    assert loading.device_map(torch.device("cuda", 1), spread=True) == {"": torch.device("cuda", 1)}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert loading.device_map(cuda, spread=True) == {"": torch.device("cuda", 0)}

    spreads: dict[str, bool] = {}

    def fake_load_model(spec: str, *args: object, spread: bool = False) -> SimpleNamespace:
        spreads[spec] = spread
        return SimpleNamespace(model=None, device=torch.device("cpu"), tokenizer=None)

    monkeypatch.setattr(loading, "load_model", fake_load_model)
    monkeypatch.setattr(loading, "check_tokenizers_match", lambda *args: None)
    loading.load_pair("the-target", "the-draft", "bfloat16", "cuda", draft_quant="none", prepack=False)
    assert spreads == {"the-target": True, "the-draft": False}


# ---------------------------------------------------------------------------------------------
# 2. Preset switching that fits
# ---------------------------------------------------------------------------------------------


def key(name: str) -> PairKey:
    return PairKey(name, "draft", "bfloat16", "cuda", "none", False, "/c", "")




def test_the_old_pair_is_released_before_the_new_one_loads_and_the_guard_sees_real_free_memory() -> None:
    gpu = FakeGPU({"qwen-7b": 17 * GIB, "coder-7b": 17 * GIB})
    slot = PairSlot(gpu.build, gpu.release, gpu.free)
    assert slot.get(key("qwen-7b"), gpu.guard(18 * GIB)) == "engine qwen-7b"
    assert slot.get(key("qwen-7b"), gpu.guard(18 * GIB)) == "engine qwen-7b"  # held: nothing happens
    assert slot.get(key("coder-7b"), gpu.guard(18 * GIB)) == "engine coder-7b"
    assert gpu.events == ["guard saw 24 GiB", "load qwen-7b", "release", "guard saw 24 GiB", "load coder-7b"]


def test_a_failed_load_leaves_the_previous_pair_held_and_says_so() -> None:
    gpu = FakeGPU({"qwen-7b": 17 * GIB, "gated": 17 * GIB}, failing={"gated"})
    slot = PairSlot(gpu.build, gpu.release, gpu.free)
    slot.get(key("qwen-7b"))
    with pytest.raises(ModelLoadError, match=r"cannot load gated.*back on qwen-7b \+ draft"):
        slot.get(key("gated"), fallback=key("embedded"))
    assert slot.held is not None and slot.held.key == key("qwen-7b") and gpu.used == 17 * GIB


def test_out_of_memory_while_loading_is_a_load_error_and_the_default_pair_comes_back() -> None:
    gpu = FakeGPU({"huge": 30 * GIB, "embedded": 4 * GIB, "broken": 1}, failing={"broken"})
    slot = PairSlot(gpu.build, gpu.release, gpu.free)
    with pytest.raises(ModelLoadError, match=r"huge \+ draft did not fit.*back on embedded") as caught:
        slot.get(key("huge"), fallback=key("embedded"))
    assert "budget" not in str(caught.value)  # not blamed on the run's settings
    assert slot.held.key == key("embedded")
    slot.drop()
    with pytest.raises(ModelLoadError, match="holds no model pair now"):
        slot.get(key("broken"), fallback=key("broken"))
    assert slot.held is None


def test_load_engine_switches_presets_through_the_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's own wiring: GPU presets, the guard's estimate at this server's limits."""
    gpu = FakeGPU({"Qwen/Qwen2.5-7B-Instruct": 17 * GIB, "Qwen/Qwen2.5-Coder-7B-Instruct": 17 * GIB})
    monkeypatch.setattr(offer, "cuda_available", lambda: True)
    monkeypatch.setattr(ui_models, "SLOT", PairSlot(gpu.build, gpu.release, lambda device: gpu.free(device)))
    settings = Settings(device="cuda", preset_switch="visitors")
    ui_models.load_engine(settings, offer.find_preset(settings, "qwen2.5-7b"))
    ui_models.load_engine(settings, offer.find_preset(settings, "qwen2.5-coder-7b"))
    assert gpu.events == ["load Qwen/Qwen2.5-7B-Instruct", "release", "load Qwen/Qwen2.5-Coder-7B-Instruct"]
    monkeypatch.setattr(gpu, "free", lambda device: 10 * GIB)  # someone else holds the card
    with pytest.raises(ModelLoadError, match=r"needs about 18\.\d GiB.*CUDA-graph buffers.*10\.0 GiB free"
                                             r".*back on Qwen/Qwen2.5-Coder-7B"):
        ui_models.load_engine(settings, offer.find_preset(settings, "qwen2.5-7b"))


# ---------------------------------------------------------------------------------------------
# 4. A GPU that cannot be used is said aloud
# ---------------------------------------------------------------------------------------------


def test_an_unusable_gpu_is_a_banner_and_a_log_line(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(gpu_health, "nvidia_visible", lambda: False)
    assert gpu_health.unusable_gpu() is None and ui_models.device_notices() == []
    monkeypatch.setattr(gpu_health, "nvidia_visible", lambda: True)
    monkeypatch.setattr(gpu_health, "driver_version", lambda: "535.104.05")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    sentence = gpu_health.unusable_gpu()
    assert sentence and "driver 535.104.05" in sentence and torch.__version__ in sentence
    demo = build_ui(Settings(device="cpu"))
    assert any(getattr(b, "value", None) and "driver 535.104.05" in str(b.value) for b in demo.blocks.values())
    monkeypatch.setattr(app, "start_models", lambda settings: None)
    monkeypatch.setattr(app, "build_app", lambda settings: SimpleNamespace(launch=lambda **kw: None, fns={}))
    with caplog.at_level("WARNING"):
        app.main()
    assert "driver 535.104.05" in caplog.text


def test_the_driver_version_is_read_from_the_kernel_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n")
    monkeypatch.setattr(gpu_health, "DRIVER_FILE", version)
    assert gpu_health.driver_version() == "550.54.15"


# ---------------------------------------------------------------------------------------------
# 3. ZeroGPU
# ---------------------------------------------------------------------------------------------


def test_zerogpu_versions_are_checked() -> None:
    assert zerogpu.unmet_requirements((3, 12), "2.11.0") == []
    assert zerogpu.unmet_requirements((3, 10), "2.8.1+cu128") == []
    problems = zerogpu.unmet_requirements((3, 11), "2.13.0")
    assert len(problems) == 2 and "Python 3.11" in problems[0] and "torch 2.13.0" in problems[1]
    assert zerogpu.unmet_requirements((3, 12), "2.7.1")


def test_the_zerogpu_glue_imports_before_torch() -> None:
    """app.py imports ``talon.models.zerogpu`` first, so that on ZeroGPU ``spaces`` comes before
    torch: that import must bring neither torch nor transformers with it."""
    code = "import sys, talon.models.zerogpu; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.strip() == "[]"
    first = next(line for line in (REPO / "app.py").read_text().splitlines() if line.startswith(("import", "from")) and
                 "__future__" not in line and line.split()[1] not in ("logging", "threading", "pathlib"))
    assert first == "from talon.models import zerogpu"


def test_an_unsupported_stack_is_refused_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zerogpu, "unmet_requirements", lambda *args: ["Python 3.11 (...)"])
    with pytest.raises(zerogpu.ZeroGPUUnsupported, match=r"does not support Python 3\.11.*scripts\.zerogpu_space"):
        zerogpu.check_supported()
    assert zerogpu.check_supported(Settings.from_env({"TALON_ZEROGPU_UNSUPPORTED_OK": "1"}).zerogpu_unsupported_ok)


FAKE_SPACES = '''
"""A stand-in for Hugging Face's spaces package in ZeroGPU mode (SPACES_ZERO_GPU)."""
def GPU(task=None, *, duration=None, size=None):
    return (lambda fn: fn) if task is None else task
'''
FAKE_SPACES_CONFIG = "class Config:\n    zero_gpu = True\n"


def fake_spaces_dir(tmp_path: Path) -> Path:
    package = tmp_path / "fake-spaces" / "spaces"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_SPACES)
    (package / "config.py").write_text(FAKE_SPACES_CONFIG)
    return package.parent


def test_on_an_unsupported_stack_the_app_refuses_to_start_in_zerogpu_mode(tmp_path: Path) -> None:
    problems = zerogpu.unmet_requirements()
    if not problems:
        pytest.skip("this stack is one ZeroGPU supports (the app would start and serve)")
    env = {"PYTHONPATH": f"{fake_spaces_dir(tmp_path)}:{REPO}", "TALON_CACHE": str(tmp_path / "cache"),
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "ZeroGPU was detected" in proc.stderr and problems[0] in proc.stderr
    assert "Running on" not in proc.stdout  # it never served


class ZeroGPUHarness:
    """Fake ZeroGPU in this process: every function registered through ``zerogpu.gpu`` is put
    behind a ``spaces.GPU`` that counts calls and their reserved seconds, and a CUDA tripwire
    raises on every device touch (a forward, a generator, a load, the memory check, the cache)
    outside a GPU call, but the start-up load on the main thread before launch."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[int] = []
        self.on = 0  # GPU calls running now (any thread of the call may touch the device)
        self.starting = False
        module = types.ModuleType("spaces")
        module.GPU = self.gpu
        config = types.ModuleType("spaces.config")
        config.Config = SimpleNamespace(zero_gpu=True)
        monkeypatch.setitem(sys.modules, "spaces", module)
        monkeypatch.setitem(sys.modules, "spaces.config", config)
        for name, (fn, duration) in zerogpu.DECORATED.items():
            module_name, attr = name.rsplit(".", 1)
            if not module_name.startswith("talon."):
                continue  # a test's own decorated function
            monkeypatch.setattr(sys.modules[module_name], attr, self.gpu(duration=duration)(fn))
        for owner, attr in ((torch.nn.Module, "__call__"), (torch, "Generator"), (torch.cuda, "mem_get_info"),
                            (torch.cuda, "empty_cache"), (torch.cuda, "synchronize"), (ui_models, "build_engine")):
            monkeypatch.setattr(owner, attr, self.tripwire(getattr(owner, attr), attr))

    def gpu(self, task=None, *, duration=None, size=None):  # noqa: ANN001 - spaces.GPU's signature
        def wrap(fn):  # noqa: ANN001
            def reserved(*args, **kwargs):  # noqa: ANN002, ANN003
                self.calls.append(duration(*args, **kwargs))
                self.on += 1
                try:
                    yield from fn(*args, **kwargs)
                finally:
                    self.on -= 1
            return reserved
        return wrap

    def tripwire(self, real, name: str):  # noqa: ANN001
        harness = self

        def guarded(*args, **kwargs):  # noqa: ANN002, ANN003
            main = threading.current_thread() is threading.main_thread()
            start_load = harness.starting and main  # the start-up load (and what it runs: a host's timing checks)
            if not harness.on and not start_load:
                raise AssertionError(f"CUDA tripwire: {name} outside a @spaces.GPU call")
            return real(*args, **kwargs)

        if isinstance(real, type):  # torch.Generator: a class whose construction is guarded
            return type(real.__name__, (), {"__new__": lambda cls, *a, **k: guarded(*a, **k)})
        return guarded


@pytest.fixture()
def zero_gpu(tiny_dirs: tuple[Path, Path],
             monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ZeroGPUHarness, Settings]]:
    harness = ZeroGPUHarness(monkeypatch)
    monkeypatch.setattr(app, "ZEROGPU", True)
    monkeypatch.setattr(zerogpu, "unmet_requirements", lambda *args: [])
    monkeypatch.setattr(ui_models, "SLOT", PairSlot(lambda k: ui_models.build_engine(k), ui_models.release_memory,
                                                   lambda device: ui_models.free_device_bytes(device)))
    settings = dataclasses.replace(Settings.from_env(), target=str(tiny_dirs[0]), draft=str(tiny_dirs[1]),
                                   device="cpu", dtype="float32")  # from_env: the suite's own cost cache
    harness.starting = True
    app.start_models(settings)  # the main thread, before launch
    harness.starting = False
    assert ui_models.SLOT.held is not None and not harness.calls
    yield harness, settings


def test_zerogpu_starts_without_asking_the_device_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up load runs before any GPU call: no memory guard there (it would ask CUDA)."""
    guards: list[object] = []

    class Recording(PairSlot):
        def get(self, key, guard=None, fallback=None):  # noqa: ANN001
            guards.append(guard)
            return "engine"

    monkeypatch.setattr(ui_models, "SLOT", Recording(None, None, None))
    monkeypatch.setattr(zerogpu, "active", lambda: True)
    ui_models.load_startup_pair(Settings())
    monkeypatch.setattr(zerogpu, "active", lambda: False)
    ui_models.load_startup_pair(Settings())
    assert guards[0] is None and callable(guards[1])


def test_zerogpu_every_user_action_is_one_gpu_call_and_nothing_touches_the_device_outside(
    zero_gpu: tuple[ZeroGPUHarness, Settings], monkeypatch: pytest.MonkeyPatch,
) -> None:
    import talon.ui.measure_panel as measure_panel
    from talon.server.controls import Controls
    from talon.ui.compare_tab import make_compare
    from talon.ui.decode_tab import decode_panel

    harness, settings = zero_gpu
    assert {"talon.server.device.decode_on_device", "talon.server.device.record_on_device"} <= set(zerogpu.DECORATED)
    with gr.Blocks():
        view, _, _ = decode_panel()
    session = Session()
    updates = list(make_generate(view, settings)("abc abc abc", session, compare_ar=True, max_new_tokens=8))
    assert len(harness.calls) == 1 and harness.calls[0] >= ui_call.GPU_BASE_S + 1
    assert "waiting for a GPU slot" in str(updates[0])
    assert session.summary is not None and session.ar_summary is not None
    assert session.summary.token_ids == session.ar_summary.token_ids  # lossless, and the baseline ran

    compare_view = SimpleNamespace(updates=lambda cmp, status="": {"status": status})
    list(make_compare(compare_view, settings)("abc abc", CompareSession(), max_new_tokens=6))
    monkeypatch.setattr(measure_panel, "measure_updates", lambda *args: {})
    list(measure_panel.make_measure(SimpleNamespace(), settings)("abc abc", None, mus="0.1, 0.3", budgets="4, 8",
                                                             sweep_tokens=4))
    assert len(harness.calls) == 3, "Compare's A and B, and every sweep cell, share one reservation each"

    run = facade.decode(settings, "abc abc", Controls(max_new_tokens=6), threading.Event())
    items = list(facade.record_prompt_atlas(settings, run.preset, "abc abc", run.cfg))  # the way the explorer records
    assert len(harness.calls) == 4 and type(items[-1]).__name__ == "Atlas"


def test_zerogpu_an_error_before_the_gpu_call_needs_no_device(zero_gpu: tuple[ZeroGPUHarness, Settings]) -> None:
    harness, settings = zero_gpu
    with gr.Blocks():
        from talon.ui.decode_tab import decode_panel

        view, _, _ = decode_panel()
    with pytest.raises(gr.Error, match="empty"):
        list(make_generate(view, settings)("   ", Session(), max_new_tokens=4))
    with pytest.raises(gr.Error, match="drafter 'hybrid' needs a draft model|context window"):
        list(make_generate(view, settings)("abc " * 200, Session(), max_new_tokens=400))
    assert harness.calls == []


def test_zerogpu_a_run_past_a_visitors_grant_is_refused_before_the_call_with_the_figures(
    zero_gpu: tuple[ZeroGPUHarness, Settings],
) -> None:
    harness, settings = zero_gpu
    with gr.Blocks():
        from talon.ui.decode_tab import decode_panel

        view, _, _ = decode_panel()
    capped = dataclasses.replace(settings, zerogpu_max_s=60)  # 20 s to start + 0.1 s x tokens
    with pytest.raises(gr.Error, match=r"reserve about 80 s of GPU .*600 token steps over 2 runs.*more than the "
                                       r"60 s.*at most 200 new tokens per run, or for fewer runs"):
        list(make_generate(view, capped)("abc abc abc", Session(), compare_ar=True, max_new_tokens=300))
    assert harness.calls == [], "refused before any GPU call"
    list(make_generate(view, capped)("abc abc abc", Session(), compare_ar=True, max_new_tokens=100))
    assert len(harness.calls) == 1 and harness.calls[0] <= 60


def test_what_a_gpu_call_learned_comes_back_as_plain_data(tiny_engine: Engine) -> None:  # noqa: F811
    from talon.cost.model import synthetic_costs

    learned_costs = synthetic_costs({1: 0.05, 128: 0.5}, {1: 0.01, 32: 0.02})
    held = ui_models.SLOT.held
    try:
        ui_models.SLOT.held = Held(key("start-up"), tiny_engine)
        ui_call.adopt_learned(ui_call.Learned(key("start-up"), {0: learned_costs.to_dict()}))
        assert tiny_engine.cost_snapshot(0).verify_s(1) == pytest.approx(0.05)
        ui_call.adopt_learned(ui_call.Learned(key("another pair"), {0: synthetic_costs({1: 9.0}, {1: 9.0}).to_dict()}))
        assert tiny_engine.cost_snapshot(0).verify_s(1) == pytest.approx(0.05)  # not this pair's curves
    finally:
        ui_models.SLOT.held = held


def test_the_zerogpu_space_bundle_meets_zerogpus_versions(tmp_path: Path) -> None:
    out = tmp_path / "space"
    subprocess.run([sys.executable, "-m", "scripts.zerogpu_space", str(out)], cwd=REPO, check=True, timeout=120)
    pins = dict(line.split("==") for line in (out / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    front = (out / "README.md").read_text().split("---")[1]
    python = next(line.split(":")[1].strip().strip('"') for line in front.splitlines()
                  if line.startswith("python_version"))
    assert zerogpu.unmet_requirements(tuple(int(x) for x in python.split(".")), pins["torch"]) == []
    assert "spaces" in pins and (out / "app.py").is_file() and (out / "talon" / "models" / "zerogpu.py").is_file()
    assert "torch==2.13.0" in (REPO / "requirements.txt").read_text()  # the CPU commands stay as they are
