"""The GPU path, proven without downloads: random-weight draft/target pairs at the shapes of each
GPU preset, run through every check that matters on a CUDA device.

    python scripts/gpu_check.py                 # on a CUDA device, the presets' real shapes
    python scripts/gpu_check.py --tiny          # the same checks, shrunk, on the CPU (the test suite)
    python scripts/gpu_check.py --out report.json --pairs qwen2.5-7b

Checks per pair, each on its own (an exception fails that check only), each run with only the
models it names alive, and each skipped, with the numbers, when ``estimate_pair`` says those
models would not fit the device:

* lossless float32: greedy output equals ``generate(do_sample=False)`` (TF32 off) for every
  drafter and tree mode, async on and off;
* sampling: the first token of sampled decoding (model drafter) over many seeds is distributed as
  the target's own softmax (chi-square);
* async drafting against sync: the same tokens on the preset's pair and on the draft-sized
  target drafting for itself, some pre-drafts reused there, and on CUDA more than
  ``ASYNC_HIDDEN_MIN`` of the preset pair's drafting hidden behind verification (on the CPU
  the share is recorded only);
* a draft that *is* the target (draft-sized, float32) gets its deep paths accepted in full, and
  noisy copies of it part of them, the output always the target's;
* bf16: seeded sampling repeats; the cost probe's curves and the tree sizes the planner then
  chooses; every greedy token the target's choice (the benchmark's judge, on the target upcast in
  place, so no second copy);
* memory at the server's largest settings (the longest prompt, the most new tokens, the largest
  tree): the guard passes the GPU the preset names and refuses one a byte too small; on CUDA the
  peak of the pair alone against the estimate and the device, on the CPU the weights and KV
  caches against the estimate.

Once per run: a pair loaded by the real Hub loader from an offline snapshot in the Hugging Face
cache layout; the app's own loader switching presets (the old pair released before the guard reads
the free memory, only the new pair held after, a failed load falling back to it); the app started
in ZeroGPU mode by the real ``spaces`` package (a CUDA build of torch only; skipped elsewhere); the
app started on a random-weight pair, one ``/generate`` through gradio_client.

Prints one JSON report (also written to ``--out``) and a short table; exits 1 on any failure. A
skipped check is listed as such and is not a pass.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import hashlib
import http.server
import json
import math
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
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
from talon.presets import PRESETS, ModelPreset  # noqa: E402
from talon.models import LoadedModel, ModelLoadError, load_pair  # noqa: E402
from talon.models.memory import GIB, KNOWN_SHAPES, ModelShape, estimate_pair, scaled  # noqa: E402
from talon.run_config import MAX_BUDGET, RunConfig, SamplingConfig, TreeConfig  # noqa: E402
from talon.settings import Settings  # noqa: E402
import talon.ui.backend as backend  # noqa: E402
from talon.ui.backend import check_preset_memory  # noqa: E402
from talon.ui.launch import serve_app  # noqa: E402

DRAFTERS = ("hybrid", "model", "retrieval")
MODES = ("adaptive", "static", "chain")
TINY_FACTOR = 16
TINY_VOCAB = 1024  # the tiny pairs keep the real pairs' vocabulary difference on top of this
F32, BF16 = torch.float32, torch.bfloat16
ASYNC_HIDDEN_MIN = 0.2  # CUDA: share of drafting that async must hide behind verification
SAMPLING_SEEDS = 400  # per pair; the chi-square needs expected counts >= 5 in each bin
CHI2_Z = 3.09  # the normal quantile of p = 0.001: a correct sampler fails one pair in a thousand
NOISE_SCALES = (0.3, 1.0, 2.0)  # noisy copies of the draft-sized target, x each tensor's std
FIT_TOKENS = 1024  # context the fit test allows the short checks (prompt + new tokens + tree)
HUB_TARGET, HUB_DRAFT = "talon-check/target", "talon-check/draft"
TINY_LIMITS = (192, 32, 64)  # --tiny: (prompt tokens, max_new_tokens, tree budget) on the CPU


@dataclass
class Check:
    name: str
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False  # did not run (``detail["skipped"]`` says why); never a pass
    seconds: float = 0.0


class Skipped(Exception):
    """Raised by a check that cannot run here; the message says why, with the numbers."""


Outcome = tuple[bool, dict[str, Any]]  # what a check function returns: passed?, and what it saw


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
    with torch.device(device):  # built where it runs: a 14B model initialised on the host takes minutes
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).to(device).eval()
    with torch.no_grad():  # sharper than init: greedy paths are decisive, drafts can be accepted,
        model.model.norm.weight.mul_(4.0)  # (the head's input, not the head: a tied head would
        for layer in model.model.layers:  # scale the embeddings too), and attention is peaked
            # enough that a wrong position id or mask entry changes the output
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


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def device_capacity(device: torch.device) -> int:
    """Bytes the device holds: the GPU's total memory, or the host's for the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


Role = tuple[str, torch.dtype]  # (which model of the pair, its dtype)


class PairModels:
    """The random models of one pair, built on first use and kept only while the next check
    names them: ``keep`` drops every other one first, so no check runs beside (or measures)
    models an earlier check left behind.

    Roles: ``target`` and ``draft`` at the preset's shapes; ``small-target``, a target of the
    draft's shape, for the checks where the draft is the target or a noisy copy of it (so no
    check holds two float32 copies of a 7B+ target)."""

    def __init__(self, spec: PairSpec, device: torch.device) -> None:
        self.spec, self.device = spec, device
        self.held: dict[Role, LoadedModel] = {}

    def shape(self, role: str) -> ModelShape:
        return self.spec.target if role == "target" else self.spec.draft

    def get(self, role: str, dtype: torch.dtype) -> LoadedModel:
        if (role, dtype) not in self.held:
            self.held[(role, dtype)] = self._build(role, dtype)
        return self.held[(role, dtype)]

    def _build(self, role: str, dtype: torch.dtype) -> LoadedModel:
        seed = {"target": 1, "draft": 2, "small-target": 4}[role]
        return random_model(self.shape(role), self.spec.family, seed, dtype, self.device)

    def keep(self, roles: tuple[Role, ...]) -> None:
        for key in [k for k in self.held if k not in roles]:
            del self.held[key]
        free_memory(self.device)

    def take(self, role: str, dtype: torch.dtype) -> LoadedModel:
        """The model, now the caller's alone (to change it in place): the pair forgets it."""
        return self.held.pop((role, dtype))

    def bytes_needed(self, roles: tuple[Role, ...], tokens: int) -> int:
        dtypes = {F32: "float32", BF16: "bfloat16"}
        return sum(estimate_pair(self.shape(r), None, dtypes[d], tokens).total for r, d in roles)


@dataclass
class PairRun:
    """What every check of one pair gets: the spec, the device, the pair's models."""

    spec: PairSpec
    device: torch.device
    tiny: bool
    models: PairModels

    @property
    def tokens(self) -> int:
        return 24 if self.tiny else 64


# ------------------------------------------------------------------------------------ checks


def plain(mode: str = "adaptive", **tree: Any) -> TreeConfig:
    return TreeConfig(mode=mode, budget=tree.pop("budget", 16), root_k=4, top_k=2, mu=0.1,
                      max_depth=tree.pop("max_depth", 8), min_conf=0.0, cost_aware=False, **tree)


def greedy_cfg(drafter: str, tokens: int, **changes: Any) -> RunConfig:
    return RunConfig(drafter=drafter, tree=changes.pop("tree", plain()), max_new_tokens=tokens, chat_template=False,
                     draft_vocab=0, **changes)


def lossless_fp32(ctx: PairRun) -> Outcome:
    target, draft = ctx.models.get("target", F32), ctx.models.get("draft", F32)
    engine = Engine(target, draft)
    ids = prompt_ids(ctx.spec.draft.vocab, 48, 3)
    want = reference(target, ids, ctx.tokens)
    failures, mats = [], {}
    for drafter in DRAFTERS:
        for mode in MODES:
            for async_draft in (False, True):
                cfg = greedy_cfg(drafter, ctx.tokens, tree=plain(mode), async_draft=async_draft)
                summary, _ = generate(engine, ids, cfg)
                mats[f"{drafter}/{mode}/{'async' if async_draft else 'sync'}"] = round(summary.mean_accepted_tokens, 3)
                if summary.token_ids != want:
                    failures.append(f"{drafter}/{mode}/async={async_draft}")
    vocab = [ctx.spec.target.vocab, ctx.spec.draft.vocab]
    return not failures, {"runs": len(mats), "failures": failures, "vocab": vocab}


def flat_temperature(logits: torch.Tensor) -> float:
    """The temperature (of a few) at which the likeliest token is nearest 30 %: spread enough that
    a sampler favouring the drafts (or the first of them) shows, peaked enough that several
    tokens are expected often enough for the chi-square."""
    grid = [round(0.05 * 1.25**k, 4) for k in range(23)]  # 0.05 ... 6.8
    return min(grid, key=lambda t: abs(float(torch.softmax(logits.double() / t, -1).max()) - 0.3))


def chi_square(counts: Counter, expected_p: torch.Tensor, n: int) -> tuple[float, int, float]:
    """Pearson's statistic over the tokens expected at least 5 times, the rest in one bin (merged
    into the last when it is expected less than 5 times); its degrees of freedom, and the
    critical value at p = 0.001 (Wilson-Hilferty)."""
    expected = expected_p * n  # (V,)
    big = [int(t) for t in torch.nonzero(expected >= 5).flatten()]
    obs = [float(counts.get(t, 0)) for t in big]
    exp = [float(expected[t]) for t in big]
    rest_obs, rest_exp = n - sum(obs), n - sum(exp)
    if rest_exp >= 5 or not big:
        obs, exp = obs + [rest_obs], exp + [rest_exp]
    else:
        obs[-1], exp[-1] = obs[-1] + rest_obs, exp[-1] + rest_exp
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    dof = max(len(obs) - 1, 1)
    critical = dof * (1 - 2 / (9 * dof) + CHI2_Z * math.sqrt(2 / (9 * dof))) ** 3
    return stat, dof, critical


def sampling_distribution(ctx: PairRun) -> Outcome:
    """Sampled decoding with the model drafter (the target drafts for itself, so its drafts are
    the likely tokens and acceptance, not only the residual draw, is exercised): the first
    token over ``SAMPLING_SEEDS`` seeds against the target's own softmax."""
    target = ctx.models.get("target", F32)
    engine = Engine(target, target)
    ids = prompt_ids(ctx.spec.draft.vocab, 8, 31)
    with torch.inference_mode():
        logits = target.model(torch.tensor([ids], device=target.device)).logits[0, -1].double().cpu()  # (V,)
    temperature = flat_temperature(logits)
    exact = torch.softmax(logits / temperature, -1)  # not warp_probs: an independent reference
    counts: Counter = Counter()
    accepted = 0
    for seed in range(SAMPLING_SEEDS):
        cfg = greedy_cfg("model", 1, tree=plain(budget=8, max_depth=2),
                         sampling=SamplingConfig(temperature=temperature, seed=seed))
        summary, steps = generate(engine, ids, cfg)
        counts[summary.token_ids[0]] += 1
        accepted += steps[0].accept_len
    stat, dof, critical = chi_square(counts, exact, SAMPLING_SEEDS)
    enough = accepted >= SAMPLING_SEEDS // 4 and dof >= 2  # the check exercised acceptance, and has power
    seen = torch.zeros_like(exact)
    seen[list(counts)] = torch.tensor(list(counts.values()), dtype=seen.dtype) / SAMPLING_SEEDS
    tv = 0.5 * float((seen - exact).abs().sum())
    return stat <= critical and enough, {
        "seeds": SAMPLING_SEEDS, "temperature": temperature, "chi2": round(stat, 2), "dof": dof,
        "critical_p001": round(critical, 2), "total_variation": round(tv, 3), "first_tokens_from_drafts": accepted,
        "most_common": counts.most_common(3), "target_top": round(float(exact.max()), 3)}


def overlap_share(steps: list) -> float:
    """Share of the drafter's busy time that ran while the verifier was busy."""
    busy = sum(e - s for st in steps for s, e in st.drafter_busy)
    hidden = 0.0
    for st in steps:
        for ds, de in st.drafter_busy:
            for vs, ve in (iv for other in steps for iv in other.verifier_busy):
                hidden += max(0.0, min(de, ve) - max(ds, vs))
    return hidden / busy if busy > 0 else 0.0


def sync_and_async(target: LoadedModel, draft: LoadedModel, ids: list[int], tokens: int) -> dict[str, Any]:
    """The same greedy run with async drafting off and on: tokens, hidden share, reuse."""
    runs = {}
    for mode in ("sync", "async"):
        cfg = greedy_cfg("model", tokens, async_draft=mode == "async")
        summary, steps = generate(Engine(target, draft), ids, cfg)
        runs[mode] = {"hidden_share": round(overlap_share(steps), 3), "steps": len(steps),
                      "predrafts_reused": sum(bool(st.predraft_reused) for st in steps),
                      "mat": round(summary.mean_accepted_tokens, 2), "tokens": summary.token_ids}
    runs["same_tokens"] = runs["sync"].pop("tokens") == runs["async"].pop("tokens")
    return runs


def async_matches_sync(ctx: PairRun) -> Outcome:
    """Async against sync on the same pair and prompt, twice. The preset's pair: the same tokens,
    and on CUDA more than ``ASYNC_HIDDEN_MIN`` of drafting hidden behind verification (the
    real sizes set that share; on the CPU, two cores here, the threads share the cores, so it
    is recorded only). The draft-sized target drafting for itself: the same tokens, and some
    pre-drafts reused (a random draft never wins the pre-draft's bet on a whole path)."""
    ids = prompt_ids(ctx.spec.draft.vocab, 32, 13)
    preset = sync_and_async(ctx.models.get("target", F32), ctx.models.get("draft", F32), ids, ctx.tokens)
    small = ctx.models.get("small-target", F32)
    agreeing = sync_and_async(small, small, ids, 2 * ctx.tokens)
    cuda = ctx.device.type == "cuda"
    hidden_ok = preset["async"]["hidden_share"] > ASYNC_HIDDEN_MIN if cuda else True
    ok = (preset["same_tokens"] and agreeing["same_tokens"] and hidden_ok and agreeing["async"]["predrafts_reused"] > 0
          and preset["sync"]["hidden_share"] == agreeing["sync"]["hidden_share"] == 0.0)
    rule = (f"CUDA: async must hide > {ASYNC_HIDDEN_MIN} of the preset pair's drafting" if cuda else
            "CPU: overlap not expected (the threads share two cores); the async share is recorded, not required")
    return ok, {"preset_pair": preset, "draft_is_target": agreeing, "overlap_rule": rule}


def deep_run(ctx: PairRun, partner: LoadedModel) -> tuple[Any, list, list[int]]:
    """The draft-sized target verifying ``partner``'s drafts on two deep branches."""
    target = ctx.models.get("small-target", F32)
    ids = prompt_ids(ctx.spec.draft.vocab, 32, 5)
    tree = dataclasses.replace(plain(budget=24, max_depth=12), root_k=2, top_k=1)
    summary, steps = generate(Engine(target, partner), ids, greedy_cfg("model", ctx.tokens, tree=tree))
    return summary, steps, reference(target, ids, ctx.tokens)


def draft_is_target(ctx: PairRun) -> Outcome:
    same, steps, want = deep_run(ctx, ctx.models.get("small-target", F32))
    # every accepted path ran to a leaf of its branch: no draft rejected (the last step may be cut)
    full_paths = all(s.bonus_kind == "bonus" for s in steps[:-1])
    ok = same.token_ids == want and full_paths and same.mean_accepted_tokens >= 6.0
    return ok, {"mat": round(same.mean_accepted_tokens, 2), "mean_depth": round(same.mean_tree_depth, 2),
                "every_path_accepted_to_its_leaf": full_paths}


def draft_is_noisy_target(ctx: PairRun) -> Outcome:
    """Noisy copies of the target as drafts, one alive at a time: every output the target's,
    and some noise level accepted in part (more than the bonus token, less than without noise;
    how much noise that takes depends on the shape, so a few levels are tried)."""
    full, _, _ = deep_run(ctx, ctx.models.get("small-target", F32))
    mats, lossless = {}, True
    for i, scale in enumerate(NOISE_SCALES):
        part, _, want = deep_run(ctx, noisy(ctx.models.get("small-target", F32), scale, 6 + i))
        mats[scale] = round(part.mean_accepted_tokens, 2)
        lossless = lossless and part.token_ids == want
    partial = any(1.0 < m < full.mean_accepted_tokens for m in mats.values())
    return lossless and partial, {"mat_by_noise": mats, "mat_without_noise": round(full.mean_accepted_tokens, 2),
                                  "every_output_the_targets": lossless}


def seeded_sampling(ctx: PairRun) -> Outcome:
    engine = Engine(ctx.models.get("target", BF16), ctx.models.get("draft", BF16))
    ids = prompt_ids(ctx.spec.draft.vocab, 40, 9)
    sampled = greedy_cfg("hybrid", ctx.tokens, sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=11))
    runs = [generate(engine, ids, sampled)[0].token_ids for _ in range(2)]
    other = generate(engine, ids, sampled.replace(sampling=dataclasses.replace(sampled.sampling, seed=12)))[0].token_ids
    return runs[0] == runs[1] and len(runs[0]) == ctx.tokens, {"differs_with_another_seed": runs[0] != other}


def cost_model(ctx: PairRun) -> Outcome:
    """Probe curves of the bf16 pair on this device, then the tree sizes the planner chooses on
    them with the target drafting for itself (fixed mode: the same trees whatever the load)."""
    target, draft = ctx.models.get("target", BF16), ctx.models.get("draft", BF16)
    costs = probe_costs(target.model, draft.model, prefix=64 if ctx.tiny else 256, max_tree=128, max_reps=3)
    curve = {n: round(1e3 * costs.verify_s(n), 2) for n in (1, 4, 16, 64, 128)}
    drafted = {w: round(1e3 * costs.draft_s(w), 2) for w in (1, 4, 16)}
    ids = prompt_ids(ctx.spec.draft.vocab, 32, 14)
    sizes = {}
    flat = synthetic_costs({1: 0.02, 128: 0.021}, {1: 0.002, 32: 0.002})
    cfg = greedy_cfg("model", ctx.tokens, cost_model="fixed", tree=TreeConfig(budget=64, max_depth=12, min_conf=0.0))
    for label, model in (("probed", costs), ("flat (GPU-like)", flat)):
        _, steps = generate(Engine(target, target, costs=model), ids, cfg)
        sizes[label] = round(sum(len(s.tokens) - 1 for s in steps) / max(len(steps), 1), 1)
    ok = all(b >= a for a, b in zip(curve.values(), list(curve.values())[1:])) and sizes["flat (GPU-like)"] >= 8
    return ok, {"verify_ms": curve, "draft_ms": drafted, "mean_tree_nodes": sizes, "spread": costs.provenance.spread}


def bf16_judge(ctx: PairRun) -> Outcome:
    """Every token of the bf16 pair's greedy outputs the target's choice. The judge runs on the
    target upcast in place (the draft dropped first): a float32 copy beside the bf16 target
    would not fit an 80 GB GPU for the 14B pair."""
    ids = prompt_ids(ctx.spec.draft.vocab, 40, 9)
    engine = Engine(ctx.models.get("target", BF16), ctx.models.get("draft", BF16))
    outputs = {d: generate(engine, ids, greedy_cfg(d, ctx.tokens))[0].token_ids for d in DRAFTERS}
    del engine
    ctx.models.keep((("target", BF16),))
    target = ctx.models.take("target", BF16)
    judge = TieJudge(dataclasses.replace(target, model=target.model.float()), default_tie_tol(BF16), upcast=False)
    near, bad = 0, []
    for drafter, out in outputs.items():
        checked = judge.check(ids, out, ctx.tokens)
        near += len(checked.near_ties)
        if not checked.lossless:
            bad.append({"drafter": drafter, "mismatch": dataclasses.asdict(checked.first_mismatch)})
    return not bad, {"near_ties": near, "mismatches": bad}


# ------------------------------------------------------------------------------------ memory


def largest_settings(tiny: bool, settings: Settings) -> tuple[int, int, int]:
    """(prompt tokens, max_new_tokens, tree budget): the server's limits, or ``TINY_LIMITS``."""
    return TINY_LIMITS if tiny else (settings.max_prompt_tokens, settings.max_new_tokens_limit, MAX_BUDGET)


def widest_tree(budget: int) -> TreeConfig:
    """A static tree that fills ``budget`` on every step (root_k + (depth - 1) * top_k**2 nodes
    before the cut), in as few draft forwards as the knobs allow: 1024 steps of a random pair."""
    root_k = min(64, budget)
    return TreeConfig(mode="static", budget=budget, root_k=root_k, top_k=16, mu=0.0, min_conf=0.0, cost_aware=False,
                      max_depth=math.ceil((budget - root_k) / 256) + 1)


def guard_verdicts(settings: Settings, preset: ModelPreset) -> Outcome:
    """The memory guard on the preset's real shapes: it must pass the GPU the preset names and
    refuse one a single byte smaller than its own estimate."""
    tokens = settings.max_prompt_tokens + settings.max_new_tokens_limit + MAX_BUDGET + 1
    real = estimate_pair(KNOWN_SHAPES[preset.target or ""], KNOWN_SHAPES.get(preset.draft or ""), "bfloat16", tokens)
    verdicts = {}
    for label, available in (("preset_gpu", int((preset.gpu_gib or 0) * GIB)), ("one_byte_short", real.total - 1)):
        try:
            check_preset_memory(settings, preset, "bfloat16", available)
            verdicts[label] = "fits"
        except ModelLoadError as err:
            verdicts[label] = f"refused: {err}"
    ok = verdicts["preset_gpu"] == "fits" and verdicts["one_byte_short"].startswith("refused")
    return ok, {"guard_estimate_gib": round(real.total / GIB, 2), "preset_gpu_gib": preset.gpu_gib, "guard": verdicts}


def pair_bytes(engine: Engine, run: Any) -> int:
    """Weights (and buffers) of both models plus both KV caches as the run left them."""
    tensors = [t for lm in (engine.target, engine.draft) for t in (*lm.model.parameters(), *lm.model.buffers())]
    caches = [run.verifier.cache] + ([run.drafter.model.cache] if run.drafter.model is not None else [])
    tensors += [t for c in caches for layer in c.layers for t in (layer.keys, layer.values) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def peak_bytes(device: torch.device, baseline: int) -> int | None:
    """Bytes allocated at the peak beyond ``baseline`` (CUDA); None on the CPU (no allocator)."""
    return torch.cuda.max_memory_allocated(device) - baseline if device.type == "cuda" else None


def run_at_limits(ctx: PairRun, limits: tuple[int, int, int], baseline: int) -> dict[str, Any]:
    """Greedy at the limits, then a few sampled steps (their (T, V) float64 buffers peak on every
    step). The peaks after each, and the bytes the pair holds after the greedy run."""
    prompt, new, budget = limits
    target, draft = ctx.models.get("target", BF16), ctx.models.get("draft", BF16)
    if ctx.device.type == "cuda":  # from here on: building random weights is not the server's work
        torch.cuda.reset_peak_memory_stats(ctx.device)
    engine, ids = Engine(target, draft), prompt_ids(ctx.spec.draft.vocab, prompt, 17)
    cfg = greedy_cfg("hybrid", new, tree=widest_tree(budget))
    run = engine.run(ids, cfg)
    for _ in run:
        pass
    out: dict[str, Any] = {"held": pair_bytes(engine, run), "greedy": peak_bytes(ctx.device, baseline)}
    del run
    sampled = cfg.replace(max_new_tokens=min(new, 16), sampling=SamplingConfig(temperature=1.0, top_p=0.9, seed=1))
    try:
        generate(engine, ids, sampled)
        out["sampled"] = peak_bytes(ctx.device, baseline)
    except Exception as err:  # noqa: BLE001 - the greedy peak above still belongs in the report
        out["sampled_error"] = f"{type(err).__name__}: {err}"
    return out


def memory_at_limits(ctx: PairRun) -> Outcome:
    """The pair alone (every earlier model dropped) at the server's largest settings, against
    ``estimate_pair`` and, on CUDA, the device; and the guard's verdicts."""
    settings = Settings.from_env()
    ok, detail = guard_verdicts(settings, next(p for p in PRESETS if p.key == ctx.spec.key))
    limits = largest_settings(ctx.tiny, settings)
    estimate = estimate_pair(ctx.spec.target, ctx.spec.draft, "bfloat16", sum(limits) + 1)
    capacity = device_capacity(ctx.device)
    if estimate.total > capacity:
        raise Skipped(f"needs {estimate.total / GIB:.1f} GiB, the device has {capacity / GIB:.1f} GiB")
    cuda = ctx.device.type == "cuda"
    free_memory(ctx.device)
    baseline = torch.cuda.memory_allocated(ctx.device) if cuda else 0
    got = run_at_limits(ctx, limits, baseline)
    gib = {k: round(v / GIB, 3) for k, v in got.items() if isinstance(v, int)}
    detail.update(limits=dict(zip(("prompt", "max_new_tokens", "budget"), limits)), device_gib=round(capacity / GIB, 2),
                  estimate_gib=round(estimate.total / GIB, 3), sampled_error=got.get("sampled_error"))
    if cuda:
        peak, reserved = max(got["greedy"], got.get("sampled", 0)), torch.cuda.max_memory_reserved(ctx.device)
        detail.update(baseline_gib=round(baseline / GIB, 3), peak_gib=gib, peak_reserved_gib=round(reserved / GIB, 3))
        measured, on_device = peak, reserved <= capacity
    else:
        detail.update(peak_gib="n/a (no CUDA device)", held_bytes=got["held"], estimate_bytes=estimate.total)
        measured, on_device = got["held"], True
    within = measured <= estimate.total
    detail.update(measured_over_estimate=round(measured / estimate.total, 3), within_estimate=within,
                  within_device=on_device)
    return ok and within and on_device and "sampled_error" not in got, detail


# ------------------------------------------------------------------------------------ once per run


def write_snapshot(cache: Path, repo_id: str, lm: LoadedModel, tokenizer: PreTrainedTokenizerFast) -> Path:
    """``lm`` saved as the Hub cache holds a download: models--<org>--<name>/snapshots/<commit>/,
    with refs/main naming the commit."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = folder / "snapshots" / commit
    lm.model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    return snapshot


HUB_SWITCHES = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE")


@contextlib.contextmanager
def offline_hub(home: Path) -> Iterator[Path]:
    """The Hub offline, its cache in ``home``/hub, then everything as it was. huggingface_hub
    reads these variables once, at import, into ``huggingface_hub.constants`` (which
    transformers reads on every call), so the constants are switched with the environment."""
    from huggingface_hub import constants

    values = {"HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": "1"}
    saved_env = {k: os.environ.get(k) for k in HUB_SWITCHES}
    saved_constants = {k: getattr(constants, k) for k in HUB_SWITCHES}
    os.environ.update(values)
    for k in HUB_SWITCHES:
        setattr(constants, k, True if k == "HF_HUB_OFFLINE" else values[k])
    try:
        yield home / "hub"
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for k, v in saved_constants.items():
            setattr(constants, k, v)


def hub_snapshot_check(spec: PairSpec, device: torch.device) -> Outcome:
    """``load_pair`` on two Hub ids found only in a local offline cache (the tiny shapes: this
    is about the loader's path, not the size), then a greedy run that must equal the loaded
    target's ``generate(do_sample=False)``, on weights equal to those saved."""
    tiny = pair_specs(True, {spec.key})[0]
    saved = {HUB_TARGET: random_model(tiny.target, tiny.family, 41, F32, torch.device("cpu")),
             HUB_DRAFT: random_model(tiny.draft, tiny.family, 42, F32, torch.device("cpu"))}
    env_before = {k: os.environ.get(k) for k in HUB_SWITCHES}
    ids, n = prompt_ids(tiny.draft.vocab, 24, 43), 16
    with tempfile.TemporaryDirectory(prefix="talon-hub-check-") as root, offline_hub(Path(root)) as cache:
        for repo_id, lm in saved.items():
            write_snapshot(cache, repo_id, lm, byte_tokenizer(tiny.target.vocab))
        target, draft = load_pair(HUB_TARGET, HUB_DRAFT, dtype="float32", device=device.type)
        got = generate(Engine(target, draft), ids, greedy_cfg("hybrid", n))[0].token_ids
        want = reference(target, ids, n)
    pairs = ((target, saved[HUB_TARGET]), (draft, saved[HUB_DRAFT]))
    same_weights = all(torch.equal(a.cpu(), b) for got_lm, saved_lm in pairs
                       for a, b in zip(got_lm.model.state_dict().values(), saved_lm.model.state_dict().values()))
    restored = {k: os.environ.get(k) for k in HUB_SWITCHES} == env_before
    ok = got == want and len(got) == n and same_weights and restored and target.name == HUB_TARGET
    return ok, {"loaded": [target.name, draft.name if draft else None], "device": str(target.device),
                "same_tokens_as_generate": got == want, "weights_as_saved": same_weights,
                "environment_restored": restored}


def save_pair(root: Path, spec: PairSpec, seeds: tuple[int, int]) -> tuple[Path, Path]:
    """A random target and draft of ``spec``'s tiny shapes saved as local checkpoints under ``root``
    (the app and loader checks are about paths, not sizes: tiny weights load in a second)."""
    tiny = pair_specs(True, {spec.key})[0]
    dirs = []
    for name, shape, seed in (("target", tiny.target, seeds[0]), ("draft", tiny.draft, seeds[1])):
        lm = random_model(shape, tiny.family, seed, torch.float32, torch.device("cpu"))
        lm.model.save_pretrained(root / name)
        byte_tokenizer(max(tiny.target.vocab, tiny.draft.vocab)).save_pretrained(root / name)
        dirs.append(root / name)
    return dirs[0], dirs[1]


def app_on(target_dir: Path, draft_dir: Path, device: torch.device, timeout: float = 180.0, **env: str):
    """``app.py`` on 127.0.0.1 serving the saved pair on ``device`` (``env``: more variables)."""
    env = {**os.environ, "TALON_TARGET": str(target_dir), "TALON_DRAFT": str(draft_dir), "TALON_DEVICE": device.type,
           "TALON_DTYPE": "float32", "TALON_CACHE": str(target_dir.parent / "cache"), **env}
    return serve_app(env, target_dir.parent / "app.log", timeout)


def app_check(spec: PairSpec, device: torch.device) -> Outcome:
    try:
        from gradio_client import Client
    except ImportError:
        raise Skipped("gradio_client is not installed") from None
    with tempfile.TemporaryDirectory(prefix="talon-gpu-check-") as root:
        target_dir, draft_dir = save_pair(Path(root), spec, (21, 22))
        with app_on(target_dir, draft_dir, device) as url:
            client = Client(url, verbose=False, download_files=root)
            job = client.submit("abc abc abc abc", max_new_tokens=24, api_name="/generate")
            outputs = list(job)
            final = job.result()
    figures = sum(isinstance(v, dict) and v.get("type") == "plotly" for v in final)
    ok = len(outputs) >= 2 and figures >= 5 and "MAT" in str(final)
    return ok, {"streamed_updates": len(outputs), "figures": figures}


@contextlib.contextmanager
def recording_slot() -> Iterator[dict[str, list]]:
    """The backend's pair slot, for the duration, replaced by a fresh one whose loads, releases
    and free-memory readings (what the guard sees) are recorded in order."""
    seen: dict[str, list] = {"events": [], "free": []}

    def build(key: Any) -> Engine:
        seen["events"].append(f"load {Path(key.target).parent.name}")
        return backend.build_engine(key)

    def release() -> None:
        seen["events"].append("release")
        backend.release_memory()

    def free(device: str) -> int | None:
        seen["free"].append(backend.free_device_bytes(device))
        return seen["free"][-1]

    held = backend.SLOT
    backend.SLOT = backend.PairSlot(build, release, free)
    try:
        yield seen
    finally:
        backend.SLOT.drop()
        backend.SLOT = held


def preset_switch_check(spec: PairSpec, device: torch.device) -> Outcome:
    """The app's own loader switching presets on this device: pair A, then B (A is released before
    the guard reads the free memory, and only B is held after), then a preset that cannot load
    (the server is back on B, and B still decodes as its own ``generate``)."""
    with tempfile.TemporaryDirectory(prefix="talon-switch-check-") as root, recording_slot() as seen:
        dirs = {name: save_pair(Path(root) / name, spec, seeds) for name, seeds in (("A", (51, 52)), ("B", (53, 54)))}
        settings = dataclasses.replace(Settings.from_env(), target=str(dirs["A"][0]), draft=str(dirs["A"][1]),
                                       device=device.type, dtype="float32")
        cuda = device.type == "cuda"
        presets = {name: ModelPreset(key=f"check-{name}", label=name, target=str(t), draft=str(d), needs_cuda=cuda)
                   for name, (t, d) in dirs.items()}
        presets["C"] = dataclasses.replace(presets["B"], key="check-C", target=str(Path(root) / "C" / "target"))
        bytes_held = {}
        for name in ("A", "B"):
            backend.load_engine(settings, presets[name])
            bytes_held[name] = torch.cuda.memory_allocated(device) if cuda else None
        try:
            backend.load_engine(settings, presets["C"])
            refused = ""
        except ModelLoadError as error:
            refused = str(error)
        engine = backend.SLOT.held.engine if backend.SLOT.held is not None else None
        ids = prompt_ids(pair_specs(True, {spec.key})[0].draft.vocab, 24, 55)
        decodes = engine is not None and generate(engine, ids, greedy_cfg("hybrid", 12))[0].token_ids == reference(
            engine.target, ids, 12)
    order = seen["events"][:3] == ["load A", "release", "load B"]
    released_first = not cuda or seen["free"][1] >= seen["free"][0] - 64 * 2**20  # B's guard saw A's bytes free
    only_b = not cuda or bytes_held["B"] <= 1.1 * bytes_held["A"]
    ok = order and released_first and only_b and "back on" in refused and str(dirs["B"][0]) in refused and decodes
    return ok, {"events": seen["events"], "guard_saw_free_gib": [None if f is None else round(f / GIB, 2)
                                                                  for f in seen["free"]],
                "allocated_gib": {k: None if v is None else round(v / GIB, 3) for k, v in bytes_held.items()},
                "failed_load_says": refused[-200:], "held_pair_decodes": decodes}


class StartupReport(http.server.BaseHTTPRequestHandler):
    """A stand-in for ZeroGPU's device API: the start-up report is all a start asks of it."""

    received: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        StartupReport.received.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def zerogpu_start_check(spec: PairSpec, device: torch.device) -> Outcome:
    """``app.py`` started in ZeroGPU mode by the real ``spaces`` package (SPACES_ZERO_GPU, a local
    stand-in for its device API): the start-up pair loads on the main thread as ZeroGPU records
    it, the tensors are packed and reported at launch, and the page serves. A GPU call itself
    needs ZeroGPU's scheduler and is not run here."""
    try:
        import spaces  # noqa: F401
    except ImportError:
        raise Skipped("the spaces package is not installed (pip install -r requirements-dev.txt)") from None
    if torch.version.cuda is None:
        raise Skipped("spaces cannot enter ZeroGPU mode with a CPU build of torch")
    api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StartupReport)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    StartupReport.received.clear()
    try:
        with tempfile.TemporaryDirectory(prefix="talon-zerogpu-check-") as root:
            target_dir, draft_dir = save_pair(Path(root), spec, (61, 62))
            env = {"SPACES_ZERO_GPU": "true", "SPACES_ZERO_DEVICE_API_URL": f"http://127.0.0.1:{api.server_port}",
                   "ZEROGPU_OFFLOAD_DIR": str(Path(root) / "offload"), "TALON_ZEROGPU_UNSUPPORTED_OK": "1"}
            with app_on(target_dir, draft_dir, torch.device("cuda"), **env) as url:
                page = urllib.request.urlopen(url, timeout=30).read().decode("utf-8", "replace")
            log = (Path(root) / "app.log").read_text()
    finally:
        api.shutdown()
    loaded = "holding" in log and "could not pre-load" not in log
    ok = loaded and "/startup-report" in StartupReport.received and "ZeroGPU" in page
    return ok, {"start_up_pair_loaded": loaded, "startup_reported": StartupReport.received,
                "page_names_zerogpu": "ZeroGPU" in page, "log_tail": log[-600:]}


# ------------------------------------------------------------------------------------ running


@dataclass(frozen=True)
class PairCheck:
    """One check of a pair: ``needs`` the models alive while it runs (all others are dropped
    first); ``peak`` what it holds at its peak when that is more (the fit test takes the larger)."""

    name: str
    fn: Callable[[PairRun], Outcome]
    needs: tuple[Role, ...]
    peak: tuple[Role, ...] = ()


FP32_PAIR = (("target", F32), ("draft", F32))
BF16_PAIR = (("target", BF16), ("draft", BF16))
PAIR_CHECKS: list[PairCheck] = [
    PairCheck("lossless float32 (every drafter x tree x async)", lossless_fp32, FP32_PAIR),
    PairCheck("sampling: first token distributed as the target's softmax", sampling_distribution,
              FP32_PAIR),  # the draft is not used, but the next check needs it: kept, not rebuilt
    PairCheck("async drafting: same tokens as sync, pre-drafts reused, drafting hidden", async_matches_sync,
              FP32_PAIR + (("small-target", F32),)),
    PairCheck("draft is the target: deep trees, full paths", draft_is_target, (("small-target", F32),)),
    PairCheck("draft is the target + noise: partial acceptance", draft_is_noisy_target, (("small-target", F32),),
              peak=(("small-target", F32),) * 2),
    PairCheck("seeded sampling repeats", seeded_sampling, BF16_PAIR),
    PairCheck("cost model on this device", cost_model, BF16_PAIR),
    PairCheck("bf16: every token the target's choice (judge, target upcast in place)", bf16_judge, BF16_PAIR,
              peak=(("target", F32),)),
    PairCheck("memory at the server's largest settings", memory_at_limits, ()),  # fits itself, at the limits
]


def guarded(name: str, fn: Callable[[], Outcome]) -> Check:
    """A check that raises is that check failed (with the error), not a crashed report."""
    start = time.perf_counter()
    try:
        ok, detail = fn()
        check = Check(name, bool(ok), detail)
    except Skipped as why:
        check = Check(name, False, {"skipped": str(why)}, skipped=True)
    except Exception as err:  # noqa: BLE001 - every failure belongs in the report
        check = Check(name, False, {"error": f"{type(err).__name__}: {err}"})
    check.seconds = round(time.perf_counter() - start, 2)
    return check


def run_pair_check(check: PairCheck, ctx: PairRun) -> Check:
    """``check`` with only the models it names alive; skipped, before anything is allocated,
    when ``estimate_pair`` says they would not fit the device."""

    def body() -> Outcome:
        need = max(ctx.models.bytes_needed(check.needs, FIT_TOKENS), ctx.models.bytes_needed(check.peak, FIT_TOKENS))
        have = device_capacity(ctx.device)
        if need > have:
            raise Skipped(f"needs {need / GIB:.1f} GiB, the device has {have / GIB:.1f} GiB")
        ctx.models.keep(check.needs)
        return check.fn(ctx)

    return guarded(check.name, body)


def run_pair(spec: PairSpec, device: torch.device, tiny: bool) -> list[Check]:
    ctx = PairRun(spec, device, tiny, PairModels(spec, device))
    try:
        return [run_pair_check(check, ctx) for check in PAIR_CHECKS]
    finally:
        ctx.models.keep(())


def once_per_run(spec: PairSpec, device: torch.device, with_app: bool) -> list[tuple[str, Callable[[], Outcome]]]:
    """The checks run once, on the first pair: one line each."""
    checks = [("Hub loader: offline snapshot in the HF cache layout", lambda: hub_snapshot_check(spec, device))]
    if with_app:
        checks.append(("app /generate on this device", lambda: app_check(spec, device)))
    checks.append(("preset switch: release, guard, fall back", lambda: preset_switch_check(spec, device)))
    checks.append(("ZeroGPU-mode start (the real spaces package)", lambda: zerogpu_start_check(spec, device)))
    return checks


def report_rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(pair key or "(once)", check) for every check in the report."""
    pairs = [(key, c) for key, p in report["pairs"].items() for c in p["checks"]]
    return pairs + [("(once)", c) for c in report["once"]]


def verdict(report: dict[str, Any]) -> None:
    """``ok``: no check failed and one passed at least; ``failed`` and ``skipped`` list them."""
    rows = report_rows(report)
    report["failed"] = [f"{key}: {c['name']}" for key, c in rows if not c["ok"] and not c["skipped"]]
    report["skipped"] = [f"{key}: {c['name']} ({c['detail']['skipped']})" for key, c in rows if c["skipped"]]
    report["passed"] = sum(c["ok"] for _, c in rows)
    report["ok"] = not report["failed"] and report["passed"] > 0


def run_checks(tiny: bool, only: set[str], with_app: bool = True) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() and not tiny else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    specs = pair_specs(tiny, only)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "tiny": tiny, "torch": torch.__version__, "pairs": {}, "once": []}
    for spec in specs:
        checks = run_pair(spec, device, tiny)
        report["pairs"][spec.key] = {"target_vocab": spec.target.vocab, "draft_vocab": spec.draft.vocab,
                                     "checks": [dataclasses.asdict(c) for c in checks]}
    if specs:
        once = once_per_run(specs[0], device, with_app)
        report["once"] = [dataclasses.asdict(guarded(name, fn)) for name, fn in once]
    verdict(report)
    return report


def table(report: dict[str, Any]) -> str:
    lines = [f"device: {report['device']} (tiny={report['tiny']})", "| pair | check | ok | s |",
             "| --- | --- | --- | --- |"]
    for key, c in report_rows(report):
        state = "skipped" if c["skipped"] else "yes" if c["ok"] else "NO"
        lines.append(f"| {key} | {c['name']} | {state} | {c['seconds']} |")
    lines += [f"SKIPPED (not a pass): {s}" for s in report["skipped"]]
    lines += [f"FAILED: {f}" for f in report["failed"]]
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
