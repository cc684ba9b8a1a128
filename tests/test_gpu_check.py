"""talon/gpucheck/check.py, shrunk (``--tiny``): the GPU check's every path runs on the CPU in the
suite, so the script cannot rot before a GPU runs it; and for each check, its subject broken on
purpose makes that check fail (a check that cannot fail proves nothing)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch

import talon.core.accept
import talon.models.memory
from talon.core.accept import Acceptance
from talon.drafters.tree_drafter import TreeDrafter
from talon.engine.run import Run
from talon.tree import DraftTree
from tests.tiny import CPU, REPO

MODULE = ["-m", "talon.gpucheck"]


def part(name: str):
    """One of the modules the check is split into, where its names are looked up."""
    return importlib.import_module(f"talon.gpucheck.{name}")


@pytest.fixture
def gpu_check(monkeypatch: pytest.MonkeyPatch):
    """The check's module, its check list restored after the test (``only_checks`` narrows it)."""
    module = part("check")
    monkeypatch.setattr(module, "PAIR_CHECKS", list(module.PAIR_CHECKS))
    return module


def tiny_run(gpu_check, key: str = "qwen2.5-7b"):
    """What a check function gets, for one tiny pair on the CPU."""
    spec = gpu_check.pair_specs(True, {key})[0]
    return gpu_check.PairRun(spec, CPU, True, gpu_check.PairModels(spec, CPU))


def only_checks(gpu_check, monkeypatch: pytest.MonkeyPatch, *checks) -> None:
    monkeypatch.setattr(gpu_check, "PAIR_CHECKS", list(checks))


def named(gpu_check, prefix: str):
    return next(c for c in gpu_check.PAIR_CHECKS if c.name.startswith(prefix))


# the two families' code paths; qwen2.5-coder-7b has qwen2.5-7b's shapes and qwen2.5-14b its family's
FAMILY_PAIRS = ("qwen2.5-7b", "llama-3.1-8b")


def test_the_tiny_gpu_check_passes_and_reports(gpu_check, tmp_path: Path) -> None:
    assert {spec.key for spec in gpu_check.pair_specs(True, set())} == {
        "qwen2.5-7b", "qwen2.5-coder-7b", "llama-3.1-8b", "qwen3-8b", "qwen2.5-14b"}  # what a plain --tiny runs
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, *MODULE, "--tiny", "--pairs", ",".join(FAMILY_PAIRS), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["tiny"] and not report["failed"]
    # spaces cannot enter ZeroGPU mode with a CPU torch: that one check is skipped, visibly, not passed
    assert report["skipped"] == ["(once): ZeroGPU-mode start (the real spaces package) "
                                 "(spaces cannot enter ZeroGPU mode with a CPU build of torch)"]
    assert set(report["pairs"]) == set(FAMILY_PAIRS)
    qwen = report["pairs"]["qwen2.5-7b"]
    assert qwen["target_vocab"] - qwen["draft_vocab"] == 152_064 - 151_936  # the real pair's difference
    names = [c["name"] for c in qwen["checks"]]
    assert len(set(names)) == 10 and all(c["ok"] for c in qwen["checks"])
    for key, pair in report["pairs"].items():  # every lossless configuration accepted drafts at depth
        for check in (c for c in pair["checks"] if c["name"].startswith(("lossless", "the other"))):
            mats = check["detail"]["mat"]
            assert check["detail"]["mat_floor"] == 1.5 and not check["detail"]["below_floor"], (key, mats)
            drafting = {k: m for k, m in mats.items() if {"model", "hybrid"} & set(k.split("/"))}
            assert len(drafting) >= 8 and min(drafting.values()) >= 1.5, (key, mats)
    memory = next(c for c in qwen["checks"] if c["name"].startswith("memory"))
    assert memory["detail"]["peak_gib"].startswith("n/a") and memory["detail"]["limits"]["budget"] == 64
    once = {c["name"].split(":")[0].split(" ")[0]: c for c in report["once"]}
    assert once["Hub"]["ok"] and once["app"]["ok"] and once["app"]["detail"]["figures"] >= 5
    assert once["preset"]["ok"] and once["preset"]["detail"]["events"][:3] == ["load A", "release", "load B"]
    assert "| llama-3.1-8b |" in proc.stdout and "| (once) | Hub loader" in proc.stdout


def test_a_planted_bug_fails_the_check_and_the_others_still_run(gpu_check, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lossless check fails and the memory check after it still runs and passes (every
    lossless configuration catching the bug is ``test_plant_passes_only_when...``'s job)."""
    only_checks(gpu_check, monkeypatch, named(gpu_check, "lossless"), named(gpu_check, "memory"))
    with part("check_model").planted("position"):
        report = gpu_check.run_checks(tiny=True, only={"qwen2.5-7b"}, with_app=False)
    assert not report["ok"]
    checks = report["pairs"]["qwen2.5-7b"]["checks"]
    assert len(checks) == len(gpu_check.PAIR_CHECKS)  # every check reported, failed or not
    lossless = checks[0]
    assert lossless["name"].startswith("lossless") and not lossless["ok"] and lossless["detail"]["failures"]
    assert "qwen2.5-7b: " + lossless["name"] in report["failed"] and checks[1]["ok"]


def test_drafts_never_accepted_fail_the_lossless_check_on_its_floor(gpu_check,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: the draft model's every child one token off (never the target's choice): the text
    is still the target's, but the configurations the draft model drafts in (alone, and hybrid on
    a prompt where retrieval finds nothing) fall below the floor, and the check fails on it,
    naming them."""
    from talon.drafters.model import ModelSource

    real = ModelSource.expand

    def off_by_one(self, tree, nodes, k):  # noqa: ANN001, ANN202
        return [[(token + 1, q) for token, q in kids] for kids in real(self, tree, nodes, k)]

    monkeypatch.setattr(ModelSource, "expand", off_by_one)
    only_checks(gpu_check, monkeypatch, named(gpu_check, "lossless"))
    report = gpu_check.run_checks(tiny=True, only={"qwen2.5-7b"}, with_app=False)
    detail = report["pairs"]["qwen2.5-7b"]["checks"][0]["detail"]
    assert not report["ok"] and detail["failures"] == [], "the text is the target's: the floor must fail it"
    assert {k.split("/")[0] for k in detail["below_floor"]} == {"model", "hybrid"}, detail["below_floor"]
    assert all(k in detail["below_floor"] for k in detail["mat"] if k.startswith(("model/", "hybrid/")))


@pytest.mark.parametrize("bug", ["position", "mask"])
def test_plant_is_caught_on_every_step_path(gpu_check, bug: str, tmp_path: Path) -> None:
    """``--plant``: what a GPU runs to prove the check's teeth there. On the tiny Qwen pair every
    step path the lossless checks run (the default, the fold switched, the dynamic cache, the
    static forward, the tree grown on the device) sees a token differ from ``generate()`` in a
    configuration whose tree can express the bug; a path whose catches are taken away is named
    as missed, and the configurations that cannot express it are named with why."""
    out = tmp_path / "plant.json"
    args = ["--tiny", "--pairs", "qwen2.5-7b", "--checks", "lossless,steps", "--out", str(out)]
    assert gpu_check.main([*args, "--plant", bug]) == 0
    report = json.loads(out.read_text())
    planted = report["planted"]
    paths = planted["paths"]["qwen2.5-7b"]
    assert planted["bug"] == bug and planted["missed"] == []
    assert set(paths) == {"dynamic+fold", *part("pair_checks").OTHER_PATHS["cpu"]}, paths
    for path, row in paths.items():
        assert row["ok"] and any(c.split("/")[1] != "chain" for c in row["caught"]), (path, row)
        assert all(c.startswith("none/") or bug == "mask" for c in row["cannot"]), row["cannot"]
    # one path's catches taken away (its plant disabled): that path, and only it, is missed
    for check in report["pairs"]["qwen2.5-7b"]["checks"]:
        if check["name"].startswith("the other steps"):
            check["detail"]["failures"] = [f for f in check["detail"]["failures"] if not f.startswith("static/")]
    gpu_check.caught_planted(report, bug)
    assert not report["ok"] and report["planted"]["missed"] == ["qwen2.5-7b: static"]


def test_without_cuda_the_full_check_says_to_use_tiny(gpu_check, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert gpu_check.main([]) == 2 and "--tiny" in capsys.readouterr().err  # (as a module: the tiny check above)


def first_child_always(tree: DraftTree, p_target: torch.Tensor, generator: torch.Generator) -> Acceptance:
    """A broken sampler: takes the first draft at every node, whatever the target's odds."""
    node, accepted = 0, [0]
    while tree.children(node):
        node = tree.children(node)[0]
        accepted.append(node)
    return Acceptance(accepted, int(p_target[node].argmax()))


def test_a_biased_sampler_fails_the_sampling_check(gpu_check, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(talon.core.accept, "accept_sampling", first_child_always)
    monkeypatch.setattr(talon.core.verify, "accept_sampling", first_child_always)
    ok, detail = gpu_check.sampling_distribution(tiny_run(gpu_check))
    assert not ok and detail["chi2"] > detail["critical_p001"]


def never_adopt(self, pre, new_tokens):
    return None


def wrong_token_after_a_predraft(real_step):
    """Async emits another token whenever it adopts a pre-draft (sync never does)."""

    def step(self, *args, **kwargs):
        result = real_step(self, *args, **kwargs)
        if result.trace.predraft_reused:
            self.generated[-1] = (self.generated[-1] + 1) % 256
        return result

    return step


@pytest.mark.parametrize("bug", ["never reuses a pre-draft", "emits other tokens"])
def test_broken_async_drafting_fails_the_async_check(gpu_check, monkeypatch: pytest.MonkeyPatch, bug: str) -> None:
    if bug == "never reuses a pre-draft":
        monkeypatch.setattr(TreeDrafter, "adopt", never_adopt)
    else:
        monkeypatch.setattr(Run, "_step", wrong_token_after_a_predraft(Run._step))
    ok, detail = gpu_check.async_matches_sync(tiny_run(gpu_check))
    assert not ok
    if bug == "never reuses a pre-draft":
        assert detail["draft_is_target"]["async"]["predrafts_reused"] == 0
    else:
        assert not detail["draft_is_target"]["same_tokens"]


@pytest.mark.parametrize("bug", ["estimate too small", "guard never refuses"])
def test_a_broken_memory_estimate_or_guard_fails_the_memory_check(gpu_check, monkeypatch: pytest.MonkeyPatch,
                                                                 bug: str) -> None:
    if bug == "estimate too small":
        monkeypatch.setattr(talon.models.memory, "OVERHEAD", 0.8)  # the pair holds ~0.83 of the real estimate
    else:
        monkeypatch.setattr(part("pair_checks"), "check_preset_memory", lambda *args, **kwargs: None)
    ok, detail = gpu_check.memory_at_limits(tiny_run(gpu_check))
    assert not ok and detail["peak_gib"].startswith("n/a")
    if bug == "estimate too small":
        assert not detail["within_estimate"] and detail["guard"]["preset_gpu"] == "fits"
    else:
        assert detail["within_estimate"] and detail["guard"]["one_byte_short"] == "fits"


def test_a_broken_hub_snapshot_fails_the_hub_check(gpu_check, monkeypatch: pytest.MonkeyPatch) -> None:
    real = part("run_checks").write_snapshot

    def refs_to_a_missing_commit(cache, repo_id, lm, tokenizer):
        snapshot = real(cache, repo_id, lm, tokenizer)
        (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)
        return snapshot

    monkeypatch.setattr(part("run_checks"), "write_snapshot", refs_to_a_missing_commit)
    env_before = {k: os.environ.get(k) for k in part("run_checks").HUB_SWITCHES}
    cache_before = huggingface_hub.constants.HF_HUB_CACHE
    spec = gpu_check.pair_specs(True, {"qwen2.5-7b"})[0]
    check = gpu_check.guarded("hub", lambda: gpu_check.hub_snapshot_check(spec, CPU))
    assert not check.ok and not check.skipped and "talon-check/target" in check.detail["error"]
    assert {k: os.environ.get(k) for k in part("run_checks").HUB_SWITCHES} == env_before  # restored after the failure
    assert huggingface_hub.constants.HF_HUB_CACHE == cache_before


def test_a_check_that_raises_fails_alone(gpu_check, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(ctx):
        raise RuntimeError("planted")

    deep = named(gpu_check, "draft is the target:")
    only_checks(gpu_check, monkeypatch, deep, dataclasses.replace(deep, name="raises", fn=boom),
                named(gpu_check, "draft is the target + noise"))
    checks = gpu_check.run_pair(gpu_check.pair_specs(True, {"qwen2.5-7b"})[0], CPU, True)
    assert [c.ok for c in checks] == [True, False, True]
    assert checks[1].detail == {"error": "RuntimeError: planted"}


def test_a_check_that_does_not_fit_is_skipped_not_passed(gpu_check, monkeypatch: pytest.MonkeyPatch) -> None:
    models = tiny_run(gpu_check).models
    small = models.bytes_needed((("small-target", gpu_check.F32),), gpu_check.FIT_TOKENS)
    pair = models.bytes_needed(gpu_check.FP32_PAIR, gpu_check.FIT_TOKENS)
    assert small < pair
    monkeypatch.setattr(gpu_check, "device_capacity", lambda device: (small + pair) // 2)
    only_checks(gpu_check, monkeypatch, named(gpu_check, "draft is the target:"), named(gpu_check, "lossless"))
    report = gpu_check.run_checks(tiny=True, only={"qwen2.5-7b"}, with_app=False)
    deep, lossless = report["pairs"]["qwen2.5-7b"]["checks"]
    assert deep["ok"] and lossless["skipped"] and not lossless["ok"]
    assert "needs" in lossless["detail"]["skipped"] and "the device has" in lossless["detail"]["skipped"]
    assert report["ok"] and [s for s in report["skipped"] if s.startswith("qwen")] and report["passed"] == 3
    # passed: the pair's one, the Hub loader's and the preset switch's (ZeroGPU's start is skipped on a CPU)
    text = gpu_check.check_table(report)
    assert "| skipped |" in text and "SKIPPED (not a pass): qwen2.5-7b: lossless" in text


def test_the_memory_check_runs_with_every_earlier_model_dropped(gpu_check, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[weakref.ref] = []
    real = part("pairs").random_model

    def tracked(*args, **kwargs):
        lm = real(*args, **kwargs)
        built.append(weakref.ref(lm.model))
        return lm

    def alive_now(ctx):
        alive = [r for r in built if r() is not None]
        return not alive, {"alive": len(alive), "built": len(built)}

    monkeypatch.setattr(part("pairs"), "random_model", tracked)
    only_checks(gpu_check, monkeypatch, named(gpu_check, "seeded sampling"), named(gpu_check, "draft is the target:"),
                gpu_check.PairCheck("probe", "probe", alive_now, ()), named(gpu_check, "memory"))
    checks = gpu_check.run_pair(gpu_check.pair_specs(True, {"qwen2.5-7b"})[0], CPU, True)
    assert all(c.ok for c in checks), [c.detail for c in checks]
    assert {k: checks[2].detail[k] for k in ("alive", "built")} == {"alive": 0, "built": 3}


def switch_check(gpu_check) -> dict:
    spec = gpu_check.pair_specs(True, {"qwen2.5-7b"})[0]
    check = gpu_check.guarded("preset switch", lambda: gpu_check.preset_switch_check(spec, CPU))
    return dataclasses.asdict(check)


def test_the_preset_switch_check_passes_and_fails_when_the_slot_is_broken(
    gpu_check, monkeypatch: pytest.MonkeyPatch
) -> None:
    from talon.server.pair import Held, PairSlot

    assert switch_check(gpu_check)["ok"]
    real_switch = PairSlot._switch

    def load_before_release(self, key, guard):  # noqa: ANN001 - the old order: build, then evict
        engine = self._build(key)
        self.drop()
        self.held = Held(key, engine)
        return engine

    monkeypatch.setattr(PairSlot, "_switch", load_before_release)
    broken = switch_check(gpu_check)
    assert not broken["ok"] and broken["detail"]["events"][:2] == ["load A", "load B"]
    monkeypatch.setattr(PairSlot, "_switch", real_switch)
    monkeypatch.setattr(PairSlot, "_recover", lambda self, candidates: "")  # a failed load leaves nothing
    assert not switch_check(gpu_check)["ok"]


def test_each_check_is_streamed_as_it_ends_and_the_deadline_skips_the_rest(gpu_check, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    only_checks(gpu_check, monkeypatch, named(gpu_check, "draft is the target:"), named(gpu_check, "seeded"))
    stream = tmp_path / "checks.jsonl"
    clock = iter([0.0, 10.0])  # the first check starts before the deadline, the second after it
    report = gpu_check.run_checks(tiny=True, only={"qwen2.5-7b"}, with_app=False, once=False,
                                  stream=gpu_check.Stream(stream, deadline=5.0, clock=lambda: next(clock)))
    lines = [json.loads(line) for line in stream.read_text().splitlines()]
    assert [(x["pair"], x["ok"], x["skipped"]) for x in lines] == [("qwen2.5-7b", True, False),
                                                                   ("qwen2.5-7b", False, True)]
    assert "out of time" in lines[1]["detail"]["skipped"] and not report["failed"]


def test_a_model_that_fails_its_gate_makes_the_check_invalid_not_passed_or_failed(
    gpu_check, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(part("check_model"), "SPLIT_BOUND", -1.0)  # no model is that well conditioned
    only_checks(gpu_check, monkeypatch, named(gpu_check, "draft is the target:"))
    report = gpu_check.run_checks(tiny=True, only={"qwen2.5-7b"}, with_app=False, once=False)
    check = report["pairs"]["qwen2.5-7b"]["checks"][0]
    assert check["invalid"] and not check["ok"] and not report["ok"] and not report["failed"]
    assert "split against full" in check["detail"]["invalid"] and check["detail"]["conditioning"]
    assert report["invalid"] and "INVALID" in gpu_check.check_table(report)


def test_a_pad_visible_to_the_nodes_fails_the_static_step_check(gpu_check, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.tiny import plant_visible_pads

    plant_visible_pads(monkeypatch)
    ok, detail = gpu_check.static_step_lossless(tiny_run(gpu_check))
    assert not ok and detail["steps"] == list(part("pair_checks").OTHER_PATHS["cpu"]) and detail["failures"]


def test_a_path_that_raises_fails_alone_and_the_paths_after_it_still_run(
    gpu_check, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks, pairs = part("pair_checks"), part("pairs")
    first, *rest = checks.OTHER_PATHS["cpu"]
    real = pairs.path_engine

    def raising_on_first(target, draft, path: str):
        if path == first:
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")
        return real(target, draft, path)

    monkeypatch.setattr(checks, "path_engine", raising_on_first)
    ok, detail = gpu_check.static_step_lossless(tiny_run(gpu_check))
    assert not ok and detail["failures"] == [f"{first} (raised)"], detail["failures"]
    assert "graph capture" in detail["errors"][first]
    assert all(any(key.startswith(f"{path}/") for key in detail["mat"]) for path in rest), detail["mat"]


def test_checks_are_chosen_by_exact_key_and_after_a_run_only_the_rest(gpu_check, tmp_path: Path) -> None:
    """``--checks async`` must not also run "lossless float32 (every drafter x tree x async)" (a
    word inside a name): keys are exact, and ``--after`` reruns only what did not pass, here after
    the H100 run whose time ran out."""
    assert [c.key for c in gpu_check.choose_checks("async", None)] == ["async"]
    with pytest.raises(ValueError, match="unknown check key.*the keys are lossless, async"):
        gpu_check.choose_checks("asyncc", None)
    run = REPO / "docs" / "gpu_runs" / "2026-11-26-h100-check-graphs.jsonl"
    rest = [c.key for c in gpu_check.choose_checks("", run)]
    # "steps" passed there under its old name; it now runs the chained step too, so it runs again
    assert rest == ["memory", "steps", "head", "bf16", "seeded", "costs", "deep", "noise"]  # head: a head preset's
    stream = tmp_path / "s.jsonl"
    stream.write_text(json.dumps({"name": named(gpu_check, "memory").name, "ok": False}) + "\n"
                      + json.dumps({"name": named(gpu_check, "bf16").name, "ok": True}) + "\n")
    assert [c.key for c in gpu_check.choose_checks("memory,bf16,seeded", stream)] == ["memory", "seeded"]
    assert gpu_check.main(["--tiny", "--checks", "nope"]) == 2


def test_sharpening_gives_qwen3_the_attention_scale_of_a_model_without_qk_norms() -> None:
    """Qwen3 normalises q and k per head after the projections, so the checks' sharpening sets the
    norms' weights instead: q (and k) come out at the scale a Llama of the same shape gets."""
    import torch
    from transformers import AutoModelForCausalLM

    from talon.gpucheck.check_model import config_for, sharpen_qk
    from talon.models.memory import ModelShape

    shape = ModelShape(256, 2, 4, 2, 512, 300, False)
    scales = {}
    for family in ("llama", "qwen3"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config_for(shape, family))
        attention = model.model.layers[0].self_attn
        sharpen_qk(model, attention, 6.0)
        x = torch.randn(64, shape.hidden)  # unit RMS, as the input norm leaves it
        with torch.no_grad():
            q = attention.q_proj(x).view(64, shape.heads, shape.head_dim)
            scales[family] = (attention.q_norm(q) if family == "qwen3" else q).std().item()
    assert scales["qwen3"] == pytest.approx(scales["llama"], rel=0.15)
    assert scales["llama"] > 1.0  # sharpened: the planted bugs then move the logits


HEAD_PAIR = "llama-3.1-8b-eagle3"


@pytest.fixture(scope="module")
def head_trained_once() -> Iterator[None]:
    """The head tests train the same head on the same target and texts: the first trains it (7 s
    on a 2-core host), the others load its weights. A different target or text trains again."""
    pairs = part("pairs")
    real, trained = pairs.train_head, {}

    def once(head, target, texts, **kwargs):  # noqa: ANN001, ANN003, ANN202 - train_head's own
        key = (repr(head.cfg), tuple(tuple(ids) for ids in texts), tuple(sorted(kwargs.items())))
        if key not in trained:
            head, training = real(head, target, texts, **kwargs)
            trained[key] = ({k: v.clone() for k, v in head.state_dict().items()}, training)
        weights, training = trained[key]
        head.load_state_dict(weights)
        return head.eval(), dict(training)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pairs, "train_head", once)
        yield


def test_a_head_preset_is_checked_with_a_head_trained_on_its_target(gpu_check, head_trained_once,  # noqa: ANN001
                                                                    tmp_path: Path) -> None:
    """The head preset at tiny shapes: a random target, a head trained on its greedy text (the
    tests' recipe, three draft levels), lossless on the default path and every other path with
    the head's drafts accepted at depth, and the head's forward timed."""
    assert HEAD_PAIR not in {s.key for s in gpu_check.pair_specs(True, set())}  # a plain --tiny: draft models only
    assert HEAD_PAIR in {s.key for s in gpu_check.pair_specs(False, set())}  # a GPU run: the heads too
    out = tmp_path / "head.json"
    assert gpu_check.main(["--tiny", "--pairs", HEAD_PAIR, "--checks", "lossless,steps,head", "--out", str(out)]) == 0
    checks = json.loads(out.read_text())["pairs"][HEAD_PAIR]["checks"]
    assert len(checks) == 3 and all(c["ok"] for c in checks)
    lossless = checks[0]["detail"]
    assert lossless["head_training"]["levels"] == 3 and lossless["head_training"]["loss"] < 0.1
    heads = {k: v for k, v in lossless["mat"].items() if k.startswith("eagle3")}
    assert len(heads) == 6 and min(heads.values()) >= 1.5, lossless["mat"]  # eagle3, eagle3-hybrid x 3 trees, sync
    timed = next(c for c in checks if "forward timed" in c["name"])["detail"]["ms"]
    assert set(timed) == {"1", "8", "64"} and all(v > 0 for v in timed.values())


@pytest.mark.parametrize("bug", ["position", "mask"])
def test_a_head_presets_check_catches_the_plants_on_every_path(gpu_check, head_trained_once, bug: str,  # noqa: ANN001
                                                              tmp_path: Path) -> None:
    out = tmp_path / "plant.json"
    assert gpu_check.main(["--tiny", "--pairs", HEAD_PAIR, "--checks", "lossless,steps", "--out", str(out),
                           "--plant", bug]) == 0
    planted = json.loads(out.read_text())["planted"]
    paths = planted["paths"][HEAD_PAIR]
    assert planted["missed"] == [] and set(paths) == {"dynamic+fold", *part("pair_checks").OTHER_PATHS["cpu"]}
    assert all(any(c.startswith("eagle3") for c in row["caught"]) for row in paths.values()), paths


def test_a_wider_head_trains_at_a_rate_shrinking_as_its_width() -> None:
    rate = part("head").learning_rate
    assert rate(64) == rate(128) == 1e-2  # the tests' heads: the recipe they were tuned at
    assert rate(512) == 2.5e-3 and rate(4096) == 1e-2 * 128 / 4096


def test_a_drafting_configuration_that_accepted_nothing_is_named_unread() -> None:
    """The committed H200 streams: plain decoding (``none``) is MAT 1.0 by design; the head pair's
    retrieval rows accepted nothing, passed its floor, and are named unread, not counted as trees."""
    unread = part("pairs").unread
    assert unread({"none/chain": 1.0, "retrieval/adaptive": 1.0, "model/static": 4.0,
                   "graphs+fold/retrieval/adaptive": 1.83}) == ["retrieval/adaptive"]
    runs = REPO / "docs" / "gpu_runs"
    streams = {name: [json.loads(line) for line in (runs / name).read_text().splitlines()]
               for name in ("2026-11-28-h200-check-paths.jsonl", "2026-11-28-h200-head-check-trained.jsonl")}
    named = {name: [k for c in checks if "mat" in c["detail"] for k in unread(c["detail"]["mat"])]
             for name, checks in streams.items()}
    assert named["2026-11-28-h200-check-paths.jsonl"] == []  # the 7B pair: every drafting row accepted drafts
    assert named["2026-11-28-h200-head-check-trained.jsonl"] and all(
        "retrieval" in k.split("/") for k in named["2026-11-28-h200-head-check-trained.jsonl"])


MTP_PAIR = "glm-4.7-flash-mtp"


@pytest.fixture(scope="module")
def mtp_trained_once() -> Iterator[None]:
    """The MTP preset's tests train the same layer on the same target and texts: the first trains
    it, the others load its weights."""
    pairs = part("pairs")
    real, trained = pairs.train_mtp, {}

    def once(layers, target, texts, **kwargs):  # noqa: ANN001, ANN003, ANN202 - train_mtp's own
        key = (tuple(tuple(ids) for ids in texts), tuple(sorted(kwargs.items())))
        if key not in trained:
            training = real(layers, target, texts, **kwargs)
            trained[key] = ({k: v.clone() for k, v in layers.mtp.layers.state_dict().items()}, training)
        weights, training = trained[key]
        layers.mtp.layers.load_state_dict(weights)
        return dict(training)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pairs, "train_mtp", once)
        yield


def test_the_mtp_preset_is_checked_with_its_targets_classes_and_a_trained_mtp_layer(
        gpu_check, mtp_trained_once, tmp_path: Path) -> None:  # noqa: ANN001
    """GLM-4.7-Flash's classes at tiny widths (latent attention, a dense layer then a routed MoE),
    its MTP layer trained on the random target's greedy text: lossless on the default path and
    every other path, the MTP kinds accepted at depth, the sampler's first token the target's."""
    assert MTP_PAIR not in {s.key for s in gpu_check.pair_specs(True, set())}  # a plain --tiny: draft models only
    spec = next(s for s in gpu_check.pair_specs(False, set()) if s.key == MTP_PAIR)  # a GPU run: at its widths
    assert spec.slot == "mtp" and spec.mtp["hidden_size"] == 2048 and spec.mtp["n_routed_experts"] == 64
    out = tmp_path / "mtp.json"
    assert gpu_check.main(["--tiny", "--no-app", "--pairs", MTP_PAIR, "--checks", "lossless,steps,sampling",
                           "--out", str(out)]) == 0
    checks = json.loads(out.read_text())["pairs"][MTP_PAIR]["checks"]
    assert len(checks) == 3 and all(c["ok"] for c in checks)
    lossless = checks[0]["detail"]
    assert lossless["mtp_training"]["levels"] == 3 and lossless["mtp_training"]["loss"] < 0.1
    mats = {k: v for k, v in {**lossless["mat"], **checks[2]["detail"]["mat"]}.items()
            if any(p.startswith("mtp") for p in k.split("/"))}
    assert len(mats) == 6 + 12 and min(mats.values()) >= 1.5, mats  # 2 kinds x 3 trees; 4 paths x 3 configurations


@pytest.mark.parametrize("bug", ["position", "mask"])
def test_the_mtp_presets_check_catches_the_plants_on_every_path(gpu_check, mtp_trained_once, bug: str,  # noqa: ANN001
                                                               tmp_path: Path) -> None:
    out = tmp_path / "plant.json"
    assert gpu_check.main(["--tiny", "--no-app", "--pairs", MTP_PAIR, "--checks", "lossless,steps", "--out", str(out),
                           "--plant", bug]) == 0
    planted = json.loads(out.read_text())["planted"]
    paths = planted["paths"][MTP_PAIR]
    assert planted["missed"] == [] and set(paths) == {"dynamic+fold", *part("pair_checks").OTHER_PATHS["cpu"]}
    assert all(any(c.startswith("mtp") for c in row["caught"]) for row in paths.values()), paths
