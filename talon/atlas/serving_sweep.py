"""Sweeping an engine's own knobs on atlases: ``python -m talon atlas sweep ATLAS --engine vllm``.

Every combination of the engine's knobs is replayed under that engine's drafting on every atlas
(:mod:`talon.atlas.serving_replay`; llama.cpp's in :mod:`talon.atlas.llamacpp`), and ranked by
predicted tokens/s: the engine's own counters, the step cost of an engine cost file
(``talon-engine-cost/1``: vLLM's from ``scripts/serve_check.sh``, llama.cpp's from its own
``llama-bench`` through ``talon costs --llama-bench``) or, without one, the atlases' own Talon cost
curves standing in (said so in the output).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from talon.atlas.data import Atlas
from talon.atlas.llamacpp import LLAMACPP_CHAIN, LLAMACPP_TYPES, llamacpp_policy, replay_llamacpp
from talon.atlas.serving_costs import StepCosts, TalonCurves, predicted_seconds
from talon.atlas.serving_replay import (
    CHAIN_METHODS,
    SERVINGS,
    SGLANG_ALGORITHM,
    VLLM_METHOD,
    Serving,
    ServingPolicy,
    ServingRun,
    SglangStandalone,
    VllmDraftModel,
    VllmNgram,
    replay_serving,
)
from talon.run_config import ConfigError

ENGINES: tuple[Serving, ...] = SERVINGS  # the atlas sweep's --engine choices
# Each engine's knobs (its own names) and the grid swept when the command names none.
DEFAULT_GRIDS: dict[str, dict[str, list[Any]]] = {
    "vllm": {"method": ["draft_model", "ngram"], "k": [1, 2, 3, 4, 6, 8],
             "prompt_lookup_min": [2], "prompt_lookup_max": [5]},
    "sglang": {"topk": [1, 2, 4], "num_steps": [1, 2, 3, 4, 6], "num_draft_tokens": [4, 8, 16]},
    # llama.cpp: type with its own knobs; a knob another type does not read is left at its default
    "llamacpp": {"type": ["none", "draft-simple", "ngram-simple", "ngram-mod"], "n_max": [2, 3, 4, 8, 16],
                 "n_min": [0], "p_min": [0.0, 0.5, 0.75, 0.9], "size_n": [12], "size_m": [48],
                 "n_match": [24], "ngram_n_min": [48], "ngram_n_max": [64]},
}
# the knobs each llama.cpp type reads (the others are dropped from its row)
LLAMACPP_KNOBS: dict[str, tuple[str, ...]] = {
    "none": (), "draft-simple": ("n_max", "n_min", "p_min"), "draft-eagle3": ("n_max", "n_min", "p_min"),
    "draft-mtp": ("n_max", "n_min", "p_min"),
    "ngram-simple": ("size_n", "size_m"), "ngram-mod": ("n_match", "ngram_n_min", "ngram_n_max"),
}
KNOB_TYPES: dict[str, dict[str, type]] = {
    "vllm": {"method": str, "k": int, "prompt_lookup_min": int, "prompt_lookup_max": int},
    "sglang": {"topk": int, "num_steps": int, "num_draft_tokens": int},
    "llamacpp": {"type": str, "n_max": int, "n_min": int, "p_min": float, "size_n": int, "size_m": int,
                 "n_match": int, "ngram_n_min": int, "ngram_n_max": int},
}
# draft_model and eagle3 both name the chain of the atlas's draft slot: the one it was recorded with runs
VLLM_METHODS = ("draft_model", "eagle3", "ngram")


def parse_serving_grid(serving: Serving, items: Sequence[str]) -> dict[str, list[Any]]:
    """``KEY=V1,V2`` items over the engine's default grid (ConfigError names a bad item)."""
    if serving not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {serving!r}")
    grid = {k: list(v) for k, v in DEFAULT_GRIDS[serving].items()}
    types = KNOB_TYPES[serving]
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in types:
            raise ConfigError(f"grid item {item!r}: with --engine {serving} write KEY=V1,V2, "
                              f"KEY one of {', '.join(types)}")
        try:
            values = [types[key](v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"grid {key}: {text!r} holds a value that is not a {types[key].__name__}") from None
        if not values:
            raise ConfigError(f"grid {key}: give at least one value")
        if key == "method" and any(v not in VLLM_METHODS for v in values):
            raise ConfigError(f"grid method: one of {', '.join(VLLM_METHODS)} (vLLM's suffix method is not replayed)")
        if serving == "llamacpp" and key == "type" and any(v not in LLAMACPP_TYPES for v in values):
            raise ConfigError(f"grid type: one of {', '.join(LLAMACPP_TYPES)} (llama.cpp's other types are not "
                              "replayed)")
        grid[key] = list(dict.fromkeys(values))
    return grid


def serving_policies(serving: Serving, grid: dict[str, list[Any]],
                     draft_kind: str = "draft") -> list[tuple[dict[str, Any], ServingPolicy]]:
    """Every valid combination of the grid as a policy, each with its knobs. Combinations the
    engine itself would rewrite are rewritten as it does (SGLang: topk 1 forces num_draft_tokens =
    num_steps + 1; a draft-token count above the tree's candidates is capped); ones it would
    refuse (prompt_lookup_min above max) are left out; duplicates once; llama.cpp's plain decoding
    always comes first, as the baseline. ``draft_kind``: what the
    atlases' model nodes came from ("draft", "head" or "mtp", ``Atlas.draft_kind``), so which of vLLM's
    ``draft_model`` / ``eagle3`` / ``mtp`` and SGLang's ``STANDALONE`` / ``EAGLE3`` / ``NEXTN`` drafts."""
    out: dict[str, tuple[dict[str, Any], ServingPolicy]] = {}
    keys = list(grid)
    for combo in itertools.product(*(grid[k] for k in keys)):
        knobs = dict(zip(keys, combo))
        try:
            found = _policy(serving, knobs, draft_kind)
        except ConfigError:
            continue
        if found is not None:
            out.setdefault(found[1].label(), found)
    if serving == "llamacpp" and out:  # plain decoding is always the baseline a setting has to beat
        plain = _policy(serving, {**{k: v[0] for k, v in grid.items()}, "type": "none"}, "draft")
        if plain is not None:
            out = {plain[1].label(): plain, **out}
    if not out:
        raise ConfigError(f"no valid {serving} configuration in the grid")
    return list(out.values())


def _policy(serving: Serving, knobs: dict[str, Any], draft_kind: str) -> tuple[dict[str, Any], ServingPolicy] | None:
    if serving == "llamacpp":
        kind = "draft-simple" if knobs["type"] in LLAMACPP_CHAIN.values() else knobs["type"]
        own = {"type": LLAMACPP_CHAIN[draft_kind] if kind == "draft-simple" else kind}
        own.update({k: knobs[k] for k in LLAMACPP_KNOBS[kind]})
        return own, llamacpp_policy(own, draft_kind)
    if serving == "vllm":
        if knobs["method"] in CHAIN_METHODS:
            method = VLLM_METHOD[draft_kind]
            return {"method": method, "k": knobs["k"]}, VllmDraftModel(knobs["k"], method=method)
        lo, hi = knobs["prompt_lookup_min"], knobs["prompt_lookup_max"]
        if lo > hi:
            return None
        return ({"method": "ngram", "k": knobs["k"], "prompt_lookup_min": lo, "prompt_lookup_max": hi},
                VllmNgram(knobs["k"], lo, hi))
    topk, steps = knobs["topk"], knobs["num_steps"]
    most = topk + (steps - 1) * topk ** 2
    tokens = steps + 1 if topk == 1 else min(knobs["num_draft_tokens"], most + 1)
    return ({"topk": topk, "num_steps": steps, "num_draft_tokens": tokens},
            SglangStandalone(topk, steps, tokens, algorithm=SGLANG_ALGORITHM[draft_kind]))


@dataclass
class ServingRow:
    """One engine configuration over all atlases, in that engine's own terms."""

    knobs: dict[str, Any]
    policy: ServingPolicy
    runs: list[ServingRun]
    predicted_s: float

    @property
    def serving(self) -> str:
        return self.policy.serving

    @property
    def tokens(self) -> int:
        return sum(r.output_tokens for r in self.runs)

    @property
    def steps(self) -> int:
        return sum(len(r.steps) for r in self.runs)

    @property
    def num_drafts(self) -> int:
        return sum(r.num_drafts for r in self.runs)

    @property
    def num_accepted(self) -> int:
        return sum(r.num_accepted_tokens for r in self.runs)

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's: 1 + accepted / drafts (steps that drafted nothing left out)."""
        return 1.0 + self.num_accepted / self.num_drafts if self.num_drafts else 1.0

    @property
    def spec_accept_length(self) -> float:
        """SGLang's: output tokens / verify steps (the prefill's token in the output)."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def num_draft_tokens(self) -> int:
        """llama.cpp's ``draft_n`` (vLLM's ``num_draft_tokens``): every draft's length."""
        return sum(r.num_draft_tokens for r in self.runs)

    @property
    def acceptance(self) -> float:
        """The engine's headline acceptance: vLLM's and llama.cpp's mean acceptance length (1 +
        accepted / drafts) or SGLang's spec_accept_length."""
        return self.spec_accept_length if self.serving == "sglang" else self.mean_acceptance_length

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.predicted_s if self.predicted_s > 0 else 0.0

    @property
    def misses(self) -> int:
        return sum(r.misses for r in self.runs)

    @property
    def coverage(self) -> float:
        return 1.0 - self.misses / self.steps if self.steps else 1.0

    @property
    def near_ties(self) -> int:
        return sum(len(r.near_ties) for r in self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.serving, "knobs": self.knobs, "label": self.policy.label(),
                "acceptance": self.acceptance, "mean_acceptance_length": self.mean_acceptance_length,
                "spec_accept_length": self.spec_accept_length, "tokens": self.tokens, "steps": self.steps,
                "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted,
                "predicted_s": self.predicted_s, "tokens_per_s": self.tokens_per_s,
                "coverage": self.coverage, "misses": self.misses, "near_ties": self.near_ties,
                "per_atlas": [{"steps": len(r.steps), "tokens": r.output_tokens, "num_drafts": r.num_drafts,
                               "num_draft_tokens": r.num_draft_tokens, "num_accepted_tokens": r.num_accepted_tokens,
                               "accepted_per_step": [s.accepted for s in r.drafts]} for r in self.runs]}


def sweep_serving(atlases: Sequence[Atlas], policies: Sequence[tuple[dict[str, Any], ServingPolicy]],
                 costs: StepCosts | None = None, max_tokens: int | None = None) -> list[ServingRow]:
    """Replay every policy on every atlas; time each run under ``costs`` (None: each atlas's own
    Talon curves). ``max_tokens`` None: every policy stops at the same point of each atlas, as far
    before its end as the deepest draft reaches, so no last step looks past the recorded text."""
    reach = max(policy.reach() for _, policy in policies) + 1
    capped = all(policy.serving == "llamacpp" for _, policy in policies)  # its drafts stop at n_predict
    limits = [max_tokens if max_tokens is not None else len(a.output) if capped else max(len(a.output) - reach, 2)
              for a in atlases]
    rows = []
    for knobs, policy in policies:
        runs = [replay_llamacpp(atlas, policy, limit) if policy.serving == "llamacpp"  # type: ignore[arg-type]
                else replay_serving(atlas, policy, limit) for atlas, limit in zip(atlases, limits)]
        seconds = sum(predicted_seconds(run, costs or TalonCurves(atlas.cost_model()), policy.width())
                      for run, atlas in zip(runs, atlases))
        rows.append(ServingRow(knobs, policy, runs, seconds))
    return rows


def best_serving_row(rows: Sequence[ServingRow]) -> ServingRow:
    """The most predicted tokens/s; ties: the higher acceptance, then the first."""
    return max(rows, key=lambda r: (round(r.tokens_per_s, 9), r.acceptance, -rows.index(r)))


def why_best(rows: Sequence[ServingRow], best: ServingRow) -> str:
    """One line on why the best configuration wins over its neighbours."""
    kind = "type" if best.serving == "llamacpp" else "method"
    same = [r for r in rows if r is not best and r.knobs.get(kind) == best.knobs.get(kind)]
    longer = [r for r in same if r.acceptance > best.acceptance]
    metric = "spec_accept_length" if best.serving == "sglang" else "mean acceptance length"
    plain = next((r for r in rows if r.knobs.get("type") == "none"), None)
    if best is plain:
        spec = max((r for r in rows if r is not best), key=lambda r: r.tokens_per_s, default=None)
        line = f"no setting beats plain decoding on this host ({best.tokens_per_s:.2f} tok/s predicted)"
        if spec is not None:
            line += (f"; the best, {spec.policy.label()}, keeps {spec.acceptance:.2f} tokens a draft but its steps "
                     f"cost more than they return ({spec.tokens_per_s:.2f} tok/s, "
                     f"{spec.tokens_per_s / best.tokens_per_s:.2f}x)")
        return line
    line = f"{best.policy.label()}: {metric} {best.acceptance:.2f}, {best.tokens_per_s:.2f} tok/s predicted"
    if plain is not None:
        line += f" ({best.tokens_per_s / plain.tokens_per_s:.2f}x plain decoding)"
    if longer:
        top = max(longer, key=lambda r: r.acceptance)
        line += (f"; {top.policy.label()} accepts more ({top.acceptance:.2f}) but its longer drafts cost more "
                 f"than they return ({top.tokens_per_s:.2f} tok/s)")
    elif len(same) > 0:
        line += "; nothing it was swept against accepts more per step"
    others = sorted((r for r in rows if r is not best), key=lambda r: -r.tokens_per_s)
    if others:
        line += f"; next: {others[0].policy.label()} at {others[0].tokens_per_s:.2f} tok/s"
    return line
