"""The GPU check's checks of one pair: losslessness, the sampling distribution, async against
sync, a draft that is the target, seeded sampling, the cost model, the bf16 judge, and memory at
the server's largest settings (``talon/gpucheck/check.py`` runs them)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from typing import Any

import torch

from talon.bench.judge import TieJudge, default_tie_tol
from talon.cost.model import synthetic_costs
from talon.cost.probe import probe_costs
from talon.engine.engine import Engine, generate
from talon.gpucheck.pairs import (
    BF16,
    CHI2_Z,
    F32,
    MAT_FLOOR,
    MODES,
    NOISE_SCALES,
    SAMPLING_SEEDS,
    TINY_LIMITS,
    CheckOutcome,
    PairRun,
    Skipped,
    below_floor,
    check_prompts,
    device_capacity,
    free_memory,
    noisy,
    path_engine,
    prompt_ids,
    random_ids,
    reference,
    unread,
)
from talon.knobs import ATLAS_DRAFTING_KINDS as MODEL_KINDS
from talon.knobs import HEAD_ATLAS_DRAFTING_KINDS, HEAD_COUNTERPART, MTP_ATLAS_KINDS, MTP_COUNTERPART
from talon.models import LoadedModel, ModelLoadError
from talon.models.memory import GIB, KNOWN_SHAPES, estimate_pair
from talon.run_config import MAX_BUDGET, RunConfig, SamplingConfig, TreeConfig
from talon.server.pair import check_preset_memory
from talon.server.presets import PRESETS, ModelPreset
from talon.settings import Settings

# ------------------------------------------------------------------------------------ checks


def plain(mode: str = "adaptive", **tree: Any) -> TreeConfig:
    return TreeConfig(**{"mode": mode, "budget": 16, "root_k": 4, "top_k": 2, "mu": 0.1, "max_depth": 8,
                         "min_conf": 0.0, "cost_aware": False, **tree})


# A trained head (or MTP layer) is sure of its chain, so at plain()'s gates its trees are chains with
# a stray sibling, where a mask that shows a node more than its ancestors changes no token; ungated
# and wider, every accepted node follows many it must not see.
HEAD_TREE = {"budget": 64, "root_k": 8, "top_k": 4, "mu": 0.0}


def tree_for(ctx: PairRun, mode: str) -> TreeConfig:
    """The lossless checks' tree in ``mode``: ``plain`` for a draft model, else ``HEAD_TREE``."""
    return plain(mode, **(HEAD_TREE if ctx.spec.slot != "model" else {}))


SLOT_KINDS = {"model": MODEL_KINDS, "head": HEAD_ATLAS_DRAFTING_KINDS, "mtp": MTP_ATLAS_KINDS}
SLOT_COUNTERPART = {"model": {}, "head": HEAD_COUNTERPART, "mtp": MTP_COUNTERPART}  # a draft model's kind -> the slot's


def slot_draft(ctx: PairRun) -> LoadedModel | None:  # None: the target's MTP layer drafts, no draft model
    return None if ctx.spec.slot == "mtp" else ctx.models.get("draft", F32)


def greedy_cfg(drafter: str, tokens: int, **changes: Any) -> RunConfig:
    return RunConfig(drafter=drafter, tree=changes.pop("tree", plain()), max_new_tokens=tokens, chat_template=False,
                     draft_vocab=0, **changes)


def lossless_fp32(ctx: PairRun) -> CheckOutcome:
    """Greedy output equal to ``generate()`` for every drafter x tree mode x async on the default
    engine (the forward, fold and chain ``auto`` gives on this device), each configuration with
    drafts accepted at depth (``MAT_FLOOR``)."""
    target, draft = ctx.models.get("target", F32), slot_draft(ctx)
    engine = Engine(target, draft)
    prompts = check_prompts(ctx, target)
    wants = {name: reference(target, ids, ctx.tokens) for name, ids in prompts.items() if name != "chain"}
    failures, mats = [], {}
    for drafter in SLOT_KINDS[ctx.spec.slot]:
        which = "echo" if drafter == "retrieval" else "random"
        ids, want = prompts[which], wants[which]
        for mode in MODES:
            # a head and an MTP layer need this step's features
            for async_draft in (False, True) if ctx.spec.slot == "model" else (False,):
                cfg = greedy_cfg(drafter, ctx.tokens, tree=tree_for(ctx, mode), async_draft=async_draft)
                summary, _ = generate(engine, ids, cfg)
                mats[f"{drafter}/{mode}/{'async' if async_draft else 'sync'}"] = round(summary.mean_accepted_tokens, 3)
                if summary.token_ids != want:
                    failures.append(f"{drafter}/{mode}/{'async' if async_draft else 'sync'}")
    vocab = [ctx.spec.target.vocab, ctx.spec.draft.vocab]
    low = below_floor(mats)
    head = {f"{ctx.spec.slot}_training": ctx.models.training} if ctx.spec.slot != "model" else {}
    return not failures and not low, {"runs": len(mats), "forward": engine.forward_path, "failures": failures,
                                      "vocab": vocab, "mat": mats, "mat_floor": MAT_FLOOR, "below_floor": low,
                                      "unread": unread(mats), **head}


# The paths the lossless check does not run (it runs the device's default), as ``step[+chain][+fold]``
OTHER_PATHS = {"cuda": ("graphs+fold", "dynamic", "static", "graphs+chain"),
               "cpu": ("dynamic", "static", "static+fold", "static+chain+fold")}


def static_step_lossless(ctx: PairRun) -> CheckOutcome:
    """The paths the lossless check does not run (it runs the default: CUDA graphs unfolded on
    CUDA, the dynamic cache folded on the CPU), ``OTHER_PATHS``: greedy output equals
    ``generate()`` for each drafter, on the prompt where its drafts are accepted (each above
    ``MAT_FLOOR``), with the grouped-query fold switched the other way, the other steps, and the
    adaptive tree grown on the device (``+chain``: ``TALON_CHAIN``)."""
    target, draft = ctx.models.get("target", F32), slot_draft(ctx)
    steps = OTHER_PATHS["cuda" if ctx.device.type == "cuda" else "cpu"]
    start = time.perf_counter()
    prompts = check_prompts(ctx, target)
    failures, mats, errors = [], {}, {}
    for step in steps:
        try:  # a path that raises fails itself only: the paths after it still run and report
            engine = path_engine(target, draft, step)
            for kind, mode, which in (("none", "chain", "random"), ("hybrid", "adaptive", "random"),
                                      ("model", "static", "random"), ("retrieval", "adaptive", "echo"),
                                      ("model", "adaptive", "chain" if ctx.spec.slot == "model" else "random")):
                drafter = SLOT_COUNTERPART[ctx.spec.slot].get(kind, kind)  # a head's or MTP layer's slot: its kinds
                want = reference(target, prompts[which], ctx.tokens)
                summary, _ = generate(engine, prompts[which],
                                      greedy_cfg(drafter, ctx.tokens, tree=tree_for(ctx, mode)))
                mats[f"{step}/{drafter}/{mode}"] = round(summary.mean_accepted_tokens, 3)
                if summary.token_ids != want:
                    failures.append(f"{step}/{drafter}/{mode}")
        except Exception as err:  # noqa: BLE001 - the path's error is its verdict
            errors[step] = f"{type(err).__name__}: {str(err)[:300]}"
            failures.append(f"{step} (raised)")
    low = below_floor(mats)
    return not failures and not low, {"steps": list(steps), "failures": failures, "errors": errors, "mat": mats,
                                      "mat_floor": MAT_FLOOR, "below_floor": low, "unread": unread(mats),
                                      "seconds": round(time.perf_counter() - start, 1)}


def flat_temperature(logits: torch.Tensor, seeds: int = SAMPLING_SEEDS) -> float:
    """The temperature (of a few) that gives the chi-square the most bins (tokens expected at
    least 5 times in ``seeds`` draws) while the likeliest token stays at most 50 %: spread enough
    that a sampler favouring the drafts (or the first of them) shows, peaked enough that several
    tokens are expected often enough. Ties go to the likeliest token nearest 30 %."""
    grid = [round(0.05 * 1.25**k, 4) for k in range(23)]  # 0.05 ... 6.8

    def score(t: float) -> tuple[bool, int, float]:
        p = torch.softmax(logits.double() / t, -1)
        top = float(p.max())
        return top <= 0.5, int((p * seeds >= 5).sum()), -abs(top - 0.3)

    return max(grid, key=score)


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


def sampling_distribution(ctx: PairRun) -> CheckOutcome:
    """Sampled decoding with the model source (the target drafts for itself, so its drafts are
    the likely tokens and acceptance, not only the residual draw, is exercised): the first
    token over ``SAMPLING_SEEDS`` seeds against the target's own softmax."""
    target = ctx.models.get("target", F32)
    engine = Engine(target, target)
    ids = random_ids(ctx.spec.draft.vocab, 16, 31)  # the context decides: a spread the chi-square has bins for
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


def sync_and_async(target: LoadedModel, draft: LoadedModel, ids: list[int], tokens: int,
                   tree: TreeConfig | None = None) -> dict[str, Any]:
    """The same greedy run with async drafting off and on: tokens, hidden share, reuse."""
    runs = {}
    for mode in ("sync", "async"):
        cfg = greedy_cfg("model", tokens, async_draft=mode == "async", tree=tree or plain())
        summary, steps = generate(Engine(target, draft), ids, cfg)
        runs[mode] = {"hidden_share": round(overlap_share(steps), 3), "steps": len(steps),
                      "predrafts_reused": sum(bool(st.predraft_reused) for st in steps),
                      "mat": round(summary.mean_accepted_tokens, 2), "tokens": summary.token_ids}
    runs["same_tokens"] = runs["sync"].pop("tokens") == runs["async"].pop("tokens")
    return runs


def async_matches_sync(ctx: PairRun) -> CheckOutcome:
    """Async against sync on the same pair and prompt, twice. The preset's pair: the same tokens.
    The draft-sized target drafting for itself in a chain (its pre-draft's bet on the whole path
    then wins whenever the path is accepted to its leaf): the same tokens, and some pre-drafts
    reused. How much drafting async hides behind verification is recorded, not required: that
    is a question of speed (the GPU speed probe's), and eager on a GPU it is small."""
    ids = prompt_ids(ctx.spec.draft.vocab, 32, 13)
    preset = sync_and_async(ctx.models.get("target", F32), ctx.models.get("draft", F32), ids, ctx.tokens)
    small = ctx.models.get("small-target", F32)
    agreeing = sync_and_async(small, small, ids, 2 * ctx.tokens, tree=plain("chain", max_depth=6))
    ok = (preset["same_tokens"] and agreeing["same_tokens"] and agreeing["async"]["predrafts_reused"] > 0
          and preset["sync"]["hidden_share"] == agreeing["sync"]["hidden_share"] == 0.0)
    return ok, {"preset_pair": preset, "draft_is_target": agreeing,
                "overlap": "recorded, not required (on the CPU the threads share the cores; on CUDA see gpu_speed)"}


def deep_run(ctx: PairRun, partner: LoadedModel) -> tuple[Any, list, list[int]]:
    """The draft-sized target verifying ``partner``'s drafts on two deep branches."""
    target = ctx.models.get("small-target", F32)
    ids = prompt_ids(ctx.spec.draft.vocab, 32, 5)
    tree = dataclasses.replace(plain(budget=24, max_depth=12), root_k=2, top_k=1)
    summary, steps = generate(Engine(target, partner), ids, greedy_cfg("model", ctx.tokens, tree=tree))
    return summary, steps, reference(target, ids, ctx.tokens)


def draft_is_target(ctx: PairRun) -> CheckOutcome:
    same, steps, want = deep_run(ctx, ctx.models.get("small-target", F32))
    # every accepted path ran to a leaf of its branch: no draft rejected (the last step may be cut)
    full_paths = all(s.bonus_kind == "bonus" for s in steps[:-1])
    ok = same.token_ids == want and full_paths and same.mean_accepted_tokens >= 6.0
    return ok, {"mat": round(same.mean_accepted_tokens, 2), "mean_depth": round(same.mean_tree_depth, 2),
                "every_path_accepted_to_its_leaf": full_paths}


def draft_is_noisy_target(ctx: PairRun) -> CheckOutcome:
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


def seeded_sampling(ctx: PairRun) -> CheckOutcome:
    engine = Engine(ctx.models.get("target", BF16), ctx.models.get("draft", BF16))
    ids = prompt_ids(ctx.spec.draft.vocab, 40, 9)
    sampled = greedy_cfg("hybrid", ctx.tokens, sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=11))
    runs = [generate(engine, ids, sampled)[0].token_ids for _ in range(2)]
    other = generate(engine, ids, sampled.replace(sampling=dataclasses.replace(sampled.sampling, seed=12)))[0].token_ids
    return runs[0] == runs[1] and len(runs[0]) == ctx.tokens, {"differs_with_another_seed": runs[0] != other}


FLAT = ({1: 0.020, 128: 0.021}, {1: 0.002, 32: 0.002})  # (verify, draft) seconds: a GPU's flat curve
STEEP = ({1: 0.020, 128: 0.020 * 64}, {1: 0.002, 32: 0.002 * 16})  # every node costs: a busy CPU's


def cost_model(ctx: PairRun) -> CheckOutcome:
    """The planner against the cost curve it is given, on a model that agrees with itself (the
    conditioned target drafting for itself, so acceptance is high and the trees' size is the
    planner's choice): it must grow trees of 8 nodes or more on a flat curve and at most half as
    many on a steep one. The curves probed on this device are recorded, with the trees the
    planner builds on them (a measurement, not judged)."""
    target = ctx.models.get("target", BF16)
    costs = probe_costs(target.model, ctx.models.get("draft", BF16).model, prefix=64 if ctx.tiny else 256,
                        max_tree=128, max_reps=3)
    curve = {n: round(1e3 * costs.verify_s(n), 2) for n in (1, 4, 16, 64, 128)}
    drafted = {w: round(1e3 * costs.draft_s(w), 2) for w in (1, 4, 16)}
    ids = prompt_ids(ctx.spec.draft.vocab, 32, 14)
    cfg = greedy_cfg("model", ctx.tokens, cost_model="fixed", tree=TreeConfig(budget=64, max_depth=12, min_conf=0.0))
    sizes, mats = {}, {}
    for label, model in (("flat", synthetic_costs(*FLAT)), ("steep", synthetic_costs(*STEEP)), ("probed", costs)):
        summary, steps = generate(Engine(target, target, costs=model), ids, cfg)
        sizes[label] = round(sum(len(s.tokens) - 1 for s in steps) / max(len(steps), 1), 1)
        mats[label] = round(summary.mean_accepted_tokens, 2)
    ok = sizes["flat"] >= 8 and sizes["steep"] <= sizes["flat"] / 2
    return ok, {"verify_ms": curve, "draft_ms": drafted, "mean_tree_nodes": sizes, "mat": mats,
                "spread": costs.provenance.spread, "rule": "flat >= 8 nodes a tree, steep <= half of flat"}


def bf16_judge(ctx: PairRun) -> CheckOutcome:
    """Every token of the bf16 pair's greedy outputs the target's choice. The judge runs on the
    target upcast in place (the draft dropped first): a float32 copy beside the bf16 target
    would not fit an 80 GB GPU for the 14B pair."""
    ids = prompt_ids(ctx.spec.draft.vocab, 40, 9)
    engine = Engine(ctx.models.get("target", BF16), ctx.models.get("draft", BF16))
    outputs = {d: generate(engine, ids, greedy_cfg(d, ctx.tokens))[0].token_ids for d in MODEL_KINDS}
    del engine
    ctx.models.keep((("target", BF16),))
    target = ctx.models.take("target", BF16)
    gate = ctx.models.gates.get(("target", BF16))  # measured bf16 drift: the judge's floor for a near-tie
    tol = max(default_tie_tol(BF16), 2 * gate.bf16_vs_fp32) if gate and gate.bf16_vs_fp32 else default_tie_tol(BF16)
    judge = TieJudge(dataclasses.replace(target, model=target.model.float()), tol, upcast=False)
    near, bad = 0, []
    for drafter, out in outputs.items():
        checked = judge.check(ids, out, ctx.tokens)
        near += len(checked.near_ties)
        if not checked.lossless:
            bad.append({"drafter": drafter, "mismatch": dataclasses.asdict(checked.first_mismatch)})
    return not bad, {"near_ties": near, "mismatches": bad, "tie_tolerance": round(tol, 4)}


# ------------------------------------------------------------------------------------ memory


def largest_settings(tiny: bool, settings: Settings) -> tuple[int, int, int]:
    """(prompt tokens, max_new_tokens, tree budget): the server's limits, or ``TINY_LIMITS``."""
    return TINY_LIMITS if tiny else (settings.max_prompt_tokens, settings.max_new_tokens_limit, MAX_BUDGET)


STEPS_AT_LIMIT = 4  # the memory check's new tokens: the prompt fills the rest of the context


def widest_tree(budget: int) -> TreeConfig:
    """A static tree that fills ``budget`` on every step (root_k + (depth - 1) * top_k**2 nodes
    before the cut), in as few draft forwards as the knobs allow."""
    root_k = min(64, budget)
    return TreeConfig(mode="static", budget=budget, root_k=root_k, top_k=16, mu=0.0, min_conf=0.0, cost_aware=False,
                      max_depth=math.ceil((budget - root_k) / 256) + 1)


def guard_verdicts(settings: Settings, preset: ModelPreset) -> CheckOutcome:
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
    caches = [run.verifier.cache] + ([run.drafter.source.cache] if run.drafter.source is not None else [])
    tensors += [t for c in caches for layer in c.layers for t in (layer.keys, layer.values) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def peak_bytes(device: torch.device, baseline: int) -> int | None:
    """Bytes allocated at the peak beyond ``baseline`` (CUDA); None on the CPU (no allocator)."""
    return torch.cuda.max_memory_allocated(device) - baseline if device.type == "cuda" else None


def run_at_limits(ctx: PairRun, limits: tuple[int, int, int], baseline: int) -> dict[str, Any]:
    """The context filled straight to the server's limit, where the peak is: a prompt of the
    limits' prompt + new tokens less ``STEPS_AT_LIMIT``, then that many greedy steps of the widest
    tree, then as many sampled ones (their (T, V) float64 buffers peak on every step). The peaks
    after each, and the bytes the pair holds after the greedy run."""
    prompt, new, budget = limits
    target, draft = ctx.models.get("target", BF16), ctx.models.get("tied-draft", BF16)  # the draft as shipped
    if ctx.device.type == "cuda":  # from here on: building random weights is not the server's work
        torch.cuda.reset_peak_memory_stats(ctx.device)
    steps = min(STEPS_AT_LIMIT, new)
    engine, ids = Engine(target, draft), prompt_ids(ctx.spec.draft.vocab, prompt + new - steps, 17)
    cfg = greedy_cfg("hybrid", steps, tree=widest_tree(budget))
    run = engine.run(ids, cfg)
    for _ in run:
        pass
    out: dict[str, Any] = {"held": pair_bytes(engine, run), "greedy": peak_bytes(ctx.device, baseline),
                           "context_tokens": len(ids) + len(run.generated) + budget}
    del run
    sampled = cfg.replace(sampling=SamplingConfig(temperature=1.0, top_p=0.9, seed=1))
    try:
        generate(engine, ids, sampled)
        out["sampled"] = peak_bytes(ctx.device, baseline)
    except Exception as err:  # noqa: BLE001 - the greedy peak above still belongs in the report
        out["sampled_error"] = f"{type(err).__name__}: {err}"
    return out


def memory_at_limits(ctx: PairRun) -> CheckOutcome:
    """The pair alone (every earlier model dropped) at the server's largest settings, against
    ``estimate_pair`` and, on CUDA, the device; and the guard's verdicts."""
    settings = Settings.from_env()
    ok, detail = guard_verdicts(settings, next(p for p in PRESETS if p.key == ctx.spec.key))
    limits = largest_settings(ctx.tiny, settings)
    estimate = estimate_pair(ctx.spec.target, ctx.spec.draft, "bfloat16", sum(limits) + 1,
                             graphs=ctx.device.type == "cuda")  # the default step there replays graphs
    capacity = device_capacity(ctx.device)
    if estimate.total > capacity:
        raise Skipped(f"needs {estimate.total / GIB:.1f} GiB, the device has {capacity / GIB:.1f} GiB")
    cuda = ctx.device.type == "cuda"
    free_memory(ctx.device)
    baseline = torch.cuda.memory_allocated(ctx.device) if cuda else 0
    got = run_at_limits(ctx, limits, baseline)
    gib = {k: round(v / GIB, 3) for k, v in got.items() if isinstance(v, int)}
    detail.update(limits=dict(zip(("prompt", "max_new_tokens", "budget"), limits)), device_gib=round(capacity / GIB, 2),
                  context_tokens=got["context_tokens"],
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

