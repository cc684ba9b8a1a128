"""Presets a GPU can hold, and no eviction by visitors, on a faked CUDA device of a given size
(the GPU Space's harness: ``tests/test_gpu_space.py``'s FakeGPU): the Models menu offers what
fits, lists the rest with the reason, and with TALON_PRESET_SWITCH=owner a visitor's request
for another pair is refused before anything is released."""

from __future__ import annotations

import gradio as gr
import pytest

import talon.server.pair as pairs
from talon.models.memory import GIB
from talon.run_config import ConfigError
from talon.server import offer
from talon.server.controls import Controls
from talon.server.pair import PairSlot
from talon.server.request import plan_run
from talon.settings import Settings
from tests.tiny import FakeGPU


@pytest.fixture()
def gpu(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """A CUDA machine with a card of ``size(gib)`` GiB (24 unless set), its slot a FakeGPU's."""
    card = FakeGPU({"Qwen/Qwen2.5-7B-Instruct": 17 * GIB, "Qwen/Qwen2.5-Coder-7B-Instruct": 17 * GIB})
    total = {"gib": 24}
    monkeypatch.setattr(offer, "cuda_available", lambda: True)
    monkeypatch.setattr(offer, "gpu_total_bytes", lambda settings: total["gib"] * GIB)
    monkeypatch.setattr(pairs, "SLOT", PairSlot(card.build, card.release, card.free))
    card.size = lambda gib: total.update(gib=gib)
    return card


def test_a_24_gb_gpu_is_not_offered_the_14b_pair_and_says_why(gpu) -> None:
    settings = Settings(device="cuda", presets="all", preset_switch="visitors")
    offered = [p.key for p in offer.presets(settings)]
    assert "qwen2.5-7b" in offered and "qwen3-8b" in offered and "qwen2.5-14b" not in offered
    refused = dict((p.key, why) for p, why in offer.unoffered(settings))
    assert set(refused) == {"qwen2.5-14b", "glm-4.7-flash-mtp"}
    assert "needs about" in refused["qwen2.5-14b"] and "this GPU has 24 GiB" in refused["qwen2.5-14b"]
    with pytest.raises(ConfigError, match=r"cannot run on this server: needs about \d+ GiB"):
        offer.find_preset(settings, "qwen2.5-14b")
    gpu.size(80)
    assert "qwen2.5-14b" in [p.key for p in offer.presets(settings)] and offer.unoffered(settings) == []


def test_the_mtp_preset_offers_its_targets_own_mtp_layer_and_no_draft_models_kinds(gpu) -> None:
    """GLM-4.7-Flash drafts with its own MTP layer: no draft model in the slot (nothing to download
    for it), the MTP kinds first, no kind that needs a draft model; an 80 GB card holds it."""
    from talon.knobs import DRAFTERS, MTP_KINDS
    from talon.server.presets import PRESETS

    preset = next(p for p in PRESETS if p.mtp)
    assert preset.key.endswith("-mtp") and preset.repos == ("zai-org/GLM-4.7-Flash",) and preset.gpu_gib == 80
    settings = Settings(device="cuda", presets=preset.key, preset_switch="visitors")
    assert offer.presets(settings) == []  # 24 GiB: refused, with the reason
    gpu.size(80)
    kinds, shown = offer.drafter_choices(settings, preset.key, "hybrid")
    assert kinds[:len(MTP_KINDS)] == MTP_KINDS and shown == "mtp-hybrid"
    assert not any(DRAFTERS[k].model == "draft" for k in kinds) and "retrieval" in kinds
    assert offer.target_has_mtp(settings, preset)


def test_a_gpu_space_offers_what_it_preloads_unless_the_owner_lists_more(gpu) -> None:
    settings = Settings(device="cuda", preset_switch="visitors")
    assert [p.key for p in offer.presets(settings)] == ["qwen2.5-7b", "qwen2.5-coder-7b"]
    assert all(p.preload for p in offer.presets(settings))
    listed = Settings(device="cuda", presets="qwen2.5-7b, qwen3-8b", preset_switch="visitors")
    assert [p.key for p in offer.presets(listed)] == ["qwen2.5-7b", "qwen3-8b"]
    with pytest.raises(ConfigError, match="TALON_PRESETS names no preset"):
        offer.presets(Settings(device="cuda", presets="qwen-9000"))
    # the owner's own pair (TALON_TARGET) joins the offer, and is the pair held from start
    own = Settings(device="cuda", target="/models/mine", draft="none")
    assert offer.initial_preset(own) == "default" and "default" in [p.key for p in offer.presets(own)]


def test_with_the_owner_switching_a_visitors_other_preset_is_refused_and_nothing_is_evicted(gpu) -> None:
    settings = Settings(device="cuda")  # auto: the owner picks the pair on a GPU
    assert offer.switch_policy(settings) == "owner"
    assert [p.key for p in offer.visitor_presets(settings)] == ["qwen2.5-7b"]
    pairs.load_engine(settings, offer.find_preset(settings, "qwen2.5-7b"))
    held = pairs.SLOT.held
    with pytest.raises(gr.Error, match="its owner picks it"):
        plan_run(settings, "hello", Controls(preset="qwen2.5-coder-7b"))
    assert pairs.SLOT.held is held and gpu.events == ["load Qwen/Qwen2.5-7B-Instruct"], "nothing released"
    preset, _ = plan_run(settings, "hello", Controls(preset="qwen2.5-7b"))  # the held pair runs
    assert preset.key == "qwen2.5-7b"
    # the owner's variable picks the pair; one the GPU cannot hold is refused at start, with the reason
    coder = Settings(device="cuda", preset="qwen2.5-coder-7b")
    assert [p.key for p in offer.visitor_presets(coder)] == ["qwen2.5-coder-7b"]
    with pytest.raises(ConfigError, match="cannot be held here: needs about"):
        offer.initial_preset(Settings(device="cuda", preset="qwen2.5-14b", presets="all"))


def test_visitors_may_switch_only_where_runs_take_turns(gpu) -> None:
    settings = Settings(device="cuda", preset_switch="visitors")
    assert offer.find_preset(settings, "qwen2.5-coder-7b").key == "qwen2.5-coder-7b"
    with pytest.raises(ConfigError, match="needs TALON_QUEUE_CONCURRENCY=1"):
        Settings(device="cuda", preset_switch="visitors", queue_concurrency=2)
    with pytest.raises(ConfigError, match="TALON_PRESET_SWITCH must be one of"):
        Settings(preset_switch="anyone")


def test_the_default_pair_is_not_offered_where_its_parts_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offer.importlib.util, "find_spec", lambda name: None)
    settings = Settings()
    assert offer.presets(settings) == []
    (preset, why), = offer.unoffered(settings)
    assert preset.key == "default" and "requirements-embedded.txt" in why


def test_a_run_waits_for_the_loading_pair_with_words_and_stop_ends_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from talon.server import device

    gate = threading.Event()
    slot = PairSlot(lambda key: gate.wait(30) and "engine", lambda: None, lambda device: None)
    monkeypatch.setattr(pairs, "SLOT", slot)
    settings = Settings()
    loader = threading.Thread(target=pairs.load_startup_pair, args=(settings,))
    loader.start()
    try:
        for _ in range(1000):  # the warm-up thread starts the load
            if slot.loading is not None:
                break
            gate.wait(0.01)
        assert slot.loading is not None, "the slot says what it loads"
        assert pairs.held_status().startswith("Loading the models: qwen2.5-coder-1.5b-instruct + "
                                              "qwen2.5-coder-0.5b-instruct (1.6 GB of GGUF weights)")
        cancel = threading.Event()
        notes = device.pair_wait(settings, "default", cancel)
        first = next(notes)
        assert "loading the models: qwen2.5-coder-1.5b-instruct" in first and "Stop ends the wait" in first
        cancel.set()
        assert list(notes) == [], "Stop ends the wait at once"
        assert slot.loading is not None, "the load goes on for the next run"
    finally:
        gate.set()
        loader.join()
    assert pairs.held_status().startswith("Models ready: qwen2.5-coder-1.5b-instruct")
    assert list(device.pair_wait(settings, "default", threading.Event())) == []  # held: no wait
    with pytest.raises(ConfigError):
        list(device.pair_wait(settings, "qwen2.5-14b", threading.Event()))  # refused before any wait


def test_a_visitors_switch_is_announced_to_every_page(gpu) -> None:
    settings = Settings(device="cuda", preset_switch="visitors")
    pairs.load_engine(settings, offer.find_preset(settings, "qwen2.5-7b"))
    assert "switched" not in pairs.held_status()
    pairs.load_engine(settings, offer.find_preset(settings, "qwen2.5-coder-7b"))
    status = pairs.held_status()
    assert status.startswith("Models ready: Qwen2.5-Coder-7B-Instruct")
    assert "switched from Qwen2.5-7B-Instruct" in status


def test_every_preset_a_gpu_space_offers_by_default_is_preloaded(gpu) -> None:
    """No visitor's pick downloads a pair inside a run: the README's preload_from_hub holds the
    repos of every preset a GPU Space offers unless its owner lists more (TALON_PRESETS)."""
    from tests.tiny import front_matter

    preload = set(front_matter()["preload_from_hub"])
    offered = offer.presets(Settings(device="cuda"))
    assert offered and {repo for p in offered for repo in p.repos} <= preload
    held = offer.find_preset(Settings(device="cuda"), offer.initial_preset(Settings(device="cuda")))
    assert set(held.repos) <= preload


def test_a_preset_the_server_cannot_hold_stops_the_app_at_start_with_the_reason(gpu) -> None:
    import os
    import subprocess
    import sys

    from talon.gpucheck.launch import REPO

    env = {**os.environ, "TALON_PRESET": "qwen2.5-14b", "TALON_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "TALON_PRESET 'qwen2.5-14b' cannot be held here: it needs a CUDA GPU" in done.stderr
    assert "Traceback" not in done.stderr
    with pytest.raises(ConfigError, match="there is no such preset"):
        offer.initial_preset(Settings(preset="qwen-9000"))
    with pytest.raises(ConfigError, match="TALON_PRESETS offers only"):  # on the faked GPU
        offer.initial_preset(Settings(device="cuda", preset="qwen3-8b"))
