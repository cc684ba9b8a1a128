"""The GPU path, proven without downloads: random-weight draft/target pairs at the shapes of each
GPU preset, run through every check that matters on a CUDA device.

    python scripts/gpu_check.py                 # on a CUDA device, the presets' real shapes
    python scripts/gpu_check.py --tiny          # the same checks, shrunk, on the CPU (the test suite)
    python scripts/gpu_check.py --out report.json --pairs qwen2.5-7b

Checks per pair: greedy output equals ``generate(do_sample=False)`` in float32 (TF32 off) for
every drafter and tree mode, async on and off; bf16 outputs pass the benchmark's every-token
judge; seeded sampling repeats; a draft that *is* the target gets everything accepted and a
noisy copy part of it; the share of drafting hidden behind verification, sync against async;
the cost probe's curves and the tree sizes the planner then chooses; peak memory at the app's
largest settings against the GPU the preset names, and the memory guard's verdict. Once per
run: the app started on a random-weight pair, one ``/generate`` through gradio_client.

Prints one JSON report (also written to ``--out``) and a short table; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from talon.bench.judge import TieJudge, default_tie_tol  # noqa: E402
from talon.cost import probe_costs, synthetic_costs  # noqa: E402
from talon.decode import Engine, generate  # noqa: E402
from talon.examples import PRESETS  # noqa: E402
from talon.models import LoadedModel  # noqa: E402
from talon.models.memory import GIB, KNOWN_SHAPES, ModelShape, estimate_pair, scaled  # noqa: E402
from talon.run_config import RunConfig, SamplingConfig, TreeConfig  # noqa: E402
from talon.settings import Settings  # noqa: E402
from talon.ui.backend import check_preset_memory  # noqa: E402
from talon.ui.launch import serve_app  # noqa: E402

DRAFTERS = ("hybrid", "model", "retrieval")
MODES = ("adaptive", "static", "chain")
TINY_FACTOR = 16
TINY_VOCAB = 1024  # the tiny pairs keep the real pairs' vocabulary difference on top of this


@dataclass
class Check:
    name: str
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PairSpec:
    key: str
    target: ModelShape
    draft: ModelShape
    gpu_gib: float | None
    family: str  # "llama" | "qwen2"


# ------------------------------------------------------------------------------------ models


def pair_specs(tiny: bool, only: set[str]) -> list[PairSpec]:
    """One spec per GPU preset whose shapes are known; ``tiny`` shrinks width, depth and the
    vocabulary but keeps the difference between the two vocabularies."""
    specs = []
    for p in PRESETS:
        if not p.needs_cuda or (only and p.key not in only) or p.target not in KNOWN_SHAPES:
            continue
        target, draft = KNOWN_SHAPES[p.target], KNOWN_SHAPES[p.draft or ""]
        if tiny:
            extra = target.vocab - draft.vocab
            target = dataclasses.replace(scaled(target, TINY_FACTOR), vocab=TINY_VOCAB + extra)
            draft = dataclasses.replace(scaled(draft, TINY_FACTOR), vocab=TINY_VOCAB)
        specs.append(PairSpec(p.key, target, draft, p.gpu_gib, "qwen2" if target.qkv_bias else "llama"))
    return specs


def byte_tokenizer(size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: ids 0-255 are the bytes, the rest up to ``size`` filler
    tokens (as a real vocabulary's unused rows); no EOS, so random models always run to
    max_new_tokens and every comparison covers the same length."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({f"<extra_{i}>": i for i in range(len(vocab), size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def random_model(shape: ModelShape, family: str, seed: int, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    torch.manual_seed(seed)
    config_cls = Qwen2Config if family == "qwen2" else LlamaConfig
    config = config_cls(**shape.config_kwargs(), max_position_embeddings=8192, eos_token_id=None,
                        bos_token_id=None, pad_token_id=None)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).to(device).eval()
    with torch.no_grad():  # sharper than init: greedy paths are decisive, drafts can be accepted,
        model.get_output_embeddings().weight.mul_(4.0)  # and attention is peaked enough that a
        for layer in model.model.layers:  # wrong position id or mask entry changes the output
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return LoadedModel(model, byte_tokenizer(max(shape.vocab, 2)), f"random-{family}-{seed}", dtype, device)


def noisy(lm: LoadedModel, scale: float, seed: int) -> LoadedModel:
    """A copy of ``lm`` with Gaussian noise (``scale`` x each tensor's std) on its weights."""
    twin = dataclasses.replace(copy.deepcopy(lm), name=f"{lm.name}-noise{scale:g}")
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in twin.model.parameters():
            p.add_(torch.randn_like(p) * scale * p.float().std().to(p.dtype))
    return twin


def prompt_ids(vocab: int, length: int, seed: int) -> list[int]:
    """A prompt with a repeated span, so that retrieval has something to find."""
    g = torch.Generator().manual_seed(seed)
    span = torch.randint(1, vocab, (max(length // 3, 4),), generator=g).tolist()
    return (span + torch.randint(1, vocab, (length,), generator=g).tolist() + span)[:length]


def reference(target: LoadedModel, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        x = torch.tensor([ids], device=target.device)  # (1, P)
        out = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                    pad_token_id=0)
    return out[0, len(ids):].tolist()


# ------------------------------------------------------------------------------------ checks


def plain(mode: str = "adaptive", **tree: Any) -> TreeConfig:
    return TreeConfig(mode=mode, budget=tree.pop("budget", 16), root_k=4, top_k=2, mu=0.1,
                      max_depth=tree.pop("max_depth", 8), min_conf=0.0, cost_aware=False, **tree)


def lossless_fp32(spec: PairSpec, device: torch.device, tokens: int) -> Check:
    target = random_model(spec.target, spec.family, 1, torch.float32, device)
    draft = random_model(spec.draft, spec.family, 2, torch.float32, device)
    engine = Engine(target, draft)
    ids = prompt_ids(spec.draft.vocab, 48, 3)
    want = reference(target, ids, tokens)
    failures, mats = [], {}
    for drafter in DRAFTERS:
        for mode in MODES:
            for async_draft in (False, True):
                cfg = RunConfig(drafter=drafter, tree=plain(mode), max_new_tokens=tokens, async_draft=async_draft,
                                chat_template=False, draft_vocab=0)
                summary, _ = generate(engine, ids, cfg)
                mats[f"{drafter}/{mode}/{'async' if async_draft else 'sync'}"] = round(summary.mean_accepted_tokens, 3)
                if summary.token_ids != want:
                    failures.append(f"{drafter}/{mode}/async={async_draft}")
    return Check("lossless float32 (every drafter x tree x async)", not failures,
                 {"runs": len(mats), "failures": failures, "vocab": [spec.target.vocab, spec.draft.vocab]})


def same_and_noisy(spec: PairSpec, device: torch.device, tokens: int) -> tuple[Check, Check, LoadedModel, LoadedModel]:
    """The draft is the target (everything accepted), then the target plus noise (part of it)."""
    target = random_model(spec.target, spec.family, 4, torch.float32, device)
    ids = prompt_ids(spec.target.vocab, 32, 5)
    want = reference(target, ids, tokens)
    tree = dataclasses.replace(plain(budget=24, max_depth=12), root_k=2, top_k=1)  # two deep branches
    cfg = RunConfig(drafter="model", tree=tree, max_new_tokens=tokens, chat_template=False, draft_vocab=0)
    same, same_steps = generate(Engine(target, target), ids, cfg)
    partner = noisy(target, 0.3, 6)
    part, steps = generate(Engine(target, partner), ids, cfg)
    full_paths = all(s.accept_len == max(s.depths) for s in same_steps[:-1])  # the last step may be cut
    ok_same = same.token_ids == want and full_paths and same.mean_accepted_tokens >= 6.0
    ok_part = part.token_ids == want and 1.0 < part.mean_accepted_tokens < same.mean_accepted_tokens
    detail_same = {"mat": round(same.mean_accepted_tokens, 2), "mean_depth": round(same.mean_tree_depth, 2),
                   "every_path_accepted_to_its_leaf": full_paths}
    detail_part = {"mat": round(part.mean_accepted_tokens, 2), "steps": len(steps)}
    return (Check("draft is the target: deep trees, full paths", ok_same, detail_same),
            Check("draft is the target + noise: partial acceptance", ok_part, detail_part), target, partner)


def bf16_and_sampling(spec: PairSpec, device: torch.device, tokens: int) -> list[Check]:
    target = random_model(spec.target, spec.family, 7, torch.bfloat16, device)
    draft = noisy(target, 0.3, 8) if spec.target == spec.draft else random_model(spec.draft, spec.family, 8, torch.bfloat16, device)
    engine = Engine(target, draft)
    ids = prompt_ids(spec.draft.vocab, 40, 9)
    judge = TieJudge(target, default_tie_tol(torch.bfloat16))
    checks, near, bad = [], 0, []
    for drafter in DRAFTERS:
        cfg = RunConfig(drafter=drafter, tree=plain(), max_new_tokens=tokens, chat_template=False, draft_vocab=0)
        summary, _ = generate(engine, ids, cfg)
        verdict = judge.check(ids, summary.token_ids, tokens)
        near += len(verdict.near_ties)
        if not verdict.lossless:
            bad.append({"drafter": drafter, "mismatch": dataclasses.asdict(verdict.first_mismatch)})
    judge.release()
    checks.append(Check("bf16: every token the target's choice (judge)", not bad, {"near_ties": near, "mismatches": bad}))
    sampled = RunConfig(drafter="hybrid", tree=plain(), max_new_tokens=tokens, chat_template=False, draft_vocab=0,
                        sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=11))
    runs = [generate(engine, ids, sampled)[0].token_ids for _ in range(2)]
    other = generate(engine, ids, sampled.replace(sampling=dataclasses.replace(sampled.sampling, seed=12)))[0].token_ids
    checks.append(Check("seeded sampling repeats", runs[0] == runs[1] and len(runs[0]) == tokens,
                        {"differs_with_another_seed": runs[0] != other}))
    return checks


def overlap_share(steps: list) -> float:
    """Share of the drafter's busy time that ran while the verifier was busy."""
    busy = sum(e - s for st in steps for s, e in st.drafter_busy)
    hidden = 0.0
    for st in steps:
        for ds, de in st.drafter_busy:
            for vs, ve in (iv for other in steps for iv in other.verifier_busy):
                hidden += max(0.0, min(de, ve) - max(ds, vs))
    return hidden / busy if busy > 0 else 0.0


def async_overlap(target: LoadedModel, draft: LoadedModel, tokens: int) -> Check:
    ids = prompt_ids(target.model.config.vocab_size, 32, 13)
    shares = {}
    for async_draft in (False, True):
        cfg = RunConfig(drafter="model", tree=plain(), max_new_tokens=tokens, async_draft=async_draft,
                        chat_template=False, draft_vocab=0)
        summary, steps = generate(Engine(target, draft), ids, cfg)
        reused = sum(bool(st.predraft_reused) for st in steps)
        shares["async" if async_draft else "sync"] = {"hidden_share": round(overlap_share(steps), 3),
                                                      "predrafts_reused": reused, "steps": len(steps),
                                                      "tokens_per_s": round(summary.tokens_per_second, 1)}
    ok = shares["sync"]["hidden_share"] == 0.0 and shares["async"]["hidden_share"] >= 0.0
    return Check("async overlap (share of drafting hidden behind verification)", ok, shares)


def cost_model(target: LoadedModel, tiny: bool, tokens: int) -> Check:
    """Probe curves on this device with the draft-is-target pair, then the tree sizes the planner
    chooses on them (fixed mode: the same trees whatever the load)."""
    costs = probe_costs(target.model, target.model, prefix=64 if tiny else 256, max_tree=128, max_reps=3)
    curve = {n: round(1e3 * costs.verify_s(n), 2) for n in (1, 4, 16, 64, 128)}
    draft = {w: round(1e3 * costs.draft_s(w), 2) for w in (1, 4, 16)}
    ids = prompt_ids(target.model.config.vocab_size, 32, 14)
    sizes = {}
    for label, model in (("probed", costs), ("flat (GPU-like)", synthetic_costs({1: 0.02, 128: 0.021}, {1: 0.002, 32: 0.002}))):
        cfg = RunConfig(drafter="model", max_new_tokens=tokens, chat_template=False, draft_vocab=0, cost_model="fixed",
                        tree=TreeConfig(budget=64, max_depth=12, min_conf=0.0))
        _, steps = generate(Engine(target, target, costs=model), ids, cfg)
        sizes[label] = round(sum(len(s.tokens) - 1 for s in steps) / max(len(steps), 1), 1)
    ok = all(b >= a for a, b in zip(curve.values(), list(curve.values())[1:])) and sizes["flat (GPU-like)"] >= 8
    return Check("cost model on this device", ok, {"verify_ms": curve, "draft_layer_ms": draft,
                                                   "mean_tree_nodes": sizes, "spread": costs.provenance.spread})


def memory(spec: PairSpec, device: torch.device, tiny: bool) -> Check:
    """Peak memory at the app's largest settings (CUDA), against the preset's GPU, and the
    guard's verdict on that GPU."""
    settings = Settings()
    preset = next(p for p in PRESETS if p.key == spec.key)
    real_target, real_draft = KNOWN_SHAPES[preset.target or ""], KNOWN_SHAPES[preset.draft or ""]
    tokens = settings.max_prompt_tokens + settings.max_new_tokens_limit + 65
    estimate = estimate_pair(real_target, real_draft, "bfloat16", tokens)
    detail: dict[str, Any] = {"estimate_gib": round(estimate.total / GIB, 2), "preset_gpu_gb": spec.gpu_gib}
    try:
        check_preset_memory(settings, preset, "bfloat16", int((spec.gpu_gib or 0) * GIB))
        detail["guard"] = "fits the GPU it names"
        ok = True
    except ValueError as err:  # ModelLoadError
        detail["guard"] = str(err)
        ok = False
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        target = random_model(spec.target, spec.family, 15, torch.bfloat16, device)
        draft = random_model(spec.draft, spec.family, 16, torch.bfloat16, device)
        ids = prompt_ids(spec.draft.vocab, 256 if tiny else settings.max_prompt_tokens, 17)
        cfg = RunConfig(drafter="hybrid", max_new_tokens=64 if tiny else 256, chat_template=False, draft_vocab=0,
                        tree=plain(budget=64))
        generate(Engine(target, draft), ids, cfg)
        peak = torch.cuda.max_memory_allocated(device)
        detail["peak_gib"] = round(peak / GIB, 2)
        ok = ok and (tiny or peak <= estimate.total)
        del target, draft
        torch.cuda.empty_cache()
    else:
        detail["peak_gib"] = "n/a (no CUDA device)"
    return Check("memory at the largest settings", ok, detail)


# ------------------------------------------------------------------------------------ the app


def app_on(target_dir: Path, draft_dir: Path, device: torch.device, timeout: float = 180.0):
    """``app.py`` on 127.0.0.1 serving the saved pair on ``device``."""
    env = {**os.environ, "TALON_TARGET": str(target_dir), "TALON_DRAFT": str(draft_dir), "TALON_DEVICE": device.type,
           "TALON_DTYPE": "float32", "TALON_CACHE": str(target_dir.parent / "cache")}
    return serve_app(env, target_dir.parent / "app.log", timeout)


def app_check(spec: PairSpec, device: torch.device) -> Check:
    try:
        from gradio_client import Client
    except ImportError:
        return Check("app /generate on this device", True, {"skipped": "gradio_client is not installed"})
    with tempfile.TemporaryDirectory(prefix="talon-gpu-check-") as root:
        dirs = []
        for name, shape, seed in (("target", spec.target, 21), ("draft", spec.draft, 22)):
            lm = random_model(shape, spec.family, seed, torch.float32, torch.device("cpu"))
            lm.model.save_pretrained(Path(root) / name)
            byte_tokenizer(max(spec.target.vocab, spec.draft.vocab)).save_pretrained(Path(root) / name)
            dirs.append(Path(root) / name)
        with app_on(dirs[0], dirs[1], device) as url:
            client = Client(url, verbose=False, download_files=root)
            job = client.submit("abc abc abc abc", max_new_tokens=24, api_name="/generate")
            outputs = list(job)
            final = job.result()
    figures = sum(isinstance(v, dict) and v.get("type") == "plotly" for v in final)
    ok = len(outputs) >= 2 and figures >= 5 and "MAT" in str(final)
    return Check("app /generate on this device", ok, {"streamed_updates": len(outputs), "figures": figures})


# ------------------------------------------------------------------------------------ main


def run_pair(spec: PairSpec, device: torch.device, tiny: bool) -> list[Check]:
    tokens = 24 if tiny else 64
    checks = [lossless_fp32(spec, device, tokens)]
    same, part, target, partner = same_and_noisy(spec, device, tokens)
    checks += [same, part, async_overlap(target, partner, tokens)]
    checks += bf16_and_sampling(spec, device, tokens)
    checks += [cost_model(target, tiny, tokens), memory(spec, device, tiny)]
    return checks


def guarded(name: str, fn: Callable[[], list[Check]]) -> list[Check]:
    """A check that raises is a failed check, not a crashed report."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - every failure belongs in the report
        return [Check(name, False, {"error": f"{type(err).__name__}: {err}"})]


def run_checks(tiny: bool, only: set[str], with_app: bool = True) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() and not tiny else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    specs = pair_specs(tiny, only)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "tiny": tiny, "torch": torch.__version__, "pairs": {}}
    for spec in specs:
        checks = guarded("pair", lambda s=spec: run_pair(s, device, tiny))
        report["pairs"][spec.key] = {"target_vocab": spec.target.vocab, "draft_vocab": spec.draft.vocab,
                                     "checks": [dataclasses.asdict(c) for c in checks]}
    if with_app and specs:
        app = guarded("app", lambda: [app_check(specs[0], device)])
        report["app"] = [dataclasses.asdict(c) for c in app]
    every = [c for p in report["pairs"].values() for c in p["checks"]] + report.get("app", [])
    report["ok"] = bool(every) and all(c["ok"] for c in every)
    return report


def table(report: dict[str, Any]) -> str:
    lines = [f"device: {report['device']} (tiny={report['tiny']})", "| pair | check | ok |", "| --- | --- | --- |"]
    for key, pair in report["pairs"].items():
        lines += [f"| {key} | {c['name']} | {'yes' if c['ok'] else 'NO'} |" for c in pair["checks"]]
    lines += [f"| (once) | {c['name']} | {'yes' if c['ok'] else 'NO'} |" for c in report.get("app", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="shrunk shapes on the CPU, in minutes (the test suite runs this)")
    p.add_argument("--pairs", default="", help="comma list of preset keys (default: every GPU preset)")
    p.add_argument("--no-app", action="store_true", help="skip starting the app")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    args = p.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        print("no CUDA device: run with --tiny for the CPU-sized checks", file=sys.stderr)
        return 2
    report = run_checks(args.tiny, {k for k in args.pairs.split(",") if k}, with_app=not args.no_app)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text)
    print(table(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
