"""What an exported configuration will do on the engine, before deploying it: the engines'
acceptance replayed on the current prompt's atlas, beside Talon's own, and the engines' best
settings on it (the Serve it tab; Gradio-free).

The exported flags (``talon.atlas.serving``) become engine policies (``talon.atlas.serving_replay``): vLLM's
``draft_model`` and ``ngram`` chains, SGLang's STANDALONE tree, llama.cpp's ``draft-simple`` chain
and ``ngram-simple`` lookup (``talon.atlas.llamacpp``). What no policy replays (vLLM's suffix
method, SGLang's NGRAM over a corpus shared between requests) is said so, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from talon.atlas.adaptive_sweep import adaptive_advice
from talon.atlas.data import Atlas
from talon.atlas.llamacpp import DRAFT_TOP_K, LLAMACPP_CHAIN, llamacpp_policy
from talon.atlas.replay import replay
from talon.atlas.result import for_slot
from talon.atlas.serving import ServingConfig, prompt_lookup_config
from talon.atlas.serving_replay import (
    CHAIN_METHODS,
    TREE_ALGORITHMS,
    ServingPolicy,
    SglangStandalone,
    VllmDraftModel,
    VllmNgram,
)
from talon.atlas.serving_sweep import (
    DEFAULT_GRIDS,
    ServingRow,
    best_serving_row,
    serving_policies,
    sweep_serving,
    why_best,
)
from talon.run_config import ConfigError, RunConfig

DEFINITIONS = (
    "**Reading the numbers.** *Talon MAT*: tokens per target forward, the bonus token included. "
    "*vLLM mean acceptance length*: 1 + accepted draft tokens / drafts, over the steps that drafted "
    "(vLLM's `k` = `num_speculative_tokens`, draft tokens per step; llama.cpp's the same, from its "
    "`draft_n` and `draft_n_accepted`). *SGLang spec_accept_length*: "
    "output tokens / verify steps, the prefill's first token included (its `num_draft_tokens` counts "
    "the root too: k + 1). All three are replayed exactly on the atlas (greedy); tokens/s are "
    "predicted from the atlas's Talon cost curves standing in for the serving engine's, unless a "
    "measured serving cost file is used (`talon atlas sweep --engine vllm --costs`)."
)


@dataclass
class Forecast:
    """Talon's MAT on the atlas, each exported engine configuration's predicted acceptance, and
    each engine's best settings on the atlas."""

    talon_mat: float | None
    talon_rate: float | None = None  # Talon's predicted tokens/s on the atlas
    exported: list[tuple[str, ServingRow | None, str]] = field(default_factory=list)  # (engine, row, note)
    best: dict[str, str] = field(default_factory=dict)  # engine -> one line on its best settings
    note: str = ""
    talon_as: str = ""  # the drafter Talon's row replays where the controls' is the other slot's counterpart
    adaptive: list[str] = field(default_factory=list)  # each engine's adaptive draft length on the atlas

    def markdown(self) -> str:
        if self.note:
            return self.note
        lines = ["**On this prompt's atlas** (replayed exactly, no model)", "",
                 "| | acceptance, in that engine's own definition | predicted tok/s |", "| --- | ---: | ---: |"]
        if self.talon_mat is not None:
            rate = f"{self.talon_rate:.2f}" if self.talon_rate else ""
            mapped = f" (as {self.talon_as}, what the atlas's draft slot drafts)" if self.talon_as else ""
            lines.append(f"| Talon, the current controls{mapped} | MAT {self.talon_mat:.2f} | {rate} |")
        for serving, row, note in self.exported:
            if row is None:
                lines.append(f"| {serving} | {note} | |")
                continue
            metric = "spec_accept_length" if row.serving == "sglang" else "mean acceptance length"
            cover = "" if row.misses == 0 else f" ({100 * row.coverage:.0f} % of steps inside the atlas)"
            lines.append(f"| {row.policy.label()} (exported) | {metric} {row.acceptance:.2f}{cover} | "
                         f"{row.tokens_per_s:.2f} |")
        lines += ["", "**Best engine settings on this atlas**", ""]
        lines += [f"- {line}" for line in self.best.values()]
        if self.adaptive:
            lines += ["", "**Adaptive draft length on this atlas** (each rule at its best, the draft's chain)", ""]
            lines += [f"- {line}" for line in self.adaptive]
        lines += ["", DEFINITIONS]
        return "\n".join(lines)

CHAIN_KIND = {chain: kind for kind, chain in LLAMACPP_CHAIN.items()}  # a llama.cpp chain type -> what drafts it


def exported_policies(result: ServingConfig) -> list[tuple[str, ServingPolicy | None, str]]:
    """The engine policies an exported ServingConfig describes (None, with why, where no replay)."""
    out: list[tuple[str, ServingPolicy | None, str]] = []
    v = result.vllm_config
    if v.get("method") in CHAIN_METHODS:
        out.append(("vLLM", VllmDraftModel(int(v["num_speculative_tokens"]), method=v["method"]), ""))
    elif v.get("method") in ("suffix", "ngram"):
        out.append(("vLLM suffix", None, "not replayed (arctic-inference's suffix tree spans requests)"))
    flags = dict(zip(result.sglang_flags[0::2], result.sglang_flags[1::2]))
    if flags.get("--speculative-algorithm") in TREE_ALGORITHMS:
        out.append(("SGLang", SglangStandalone(int(flags["--speculative-eagle-topk"]),
                                               int(flags["--speculative-num-steps"]),
                                               int(flags["--speculative-num-draft-tokens"]),
                                               algorithm=flags["--speculative-algorithm"]), ""))
    elif flags.get("--speculative-algorithm") == "NGRAM":
        out.append(("SGLang NGRAM", None, "not replayed (its n-gram trie is shared between requests)"))
    llama = dict(zip(result.llamacpp_flags[0::2], result.llamacpp_flags[1::2]))
    kind = llama.get("--spec-type")
    if kind in CHAIN_KIND:
        out.append(("llama.cpp", llamacpp_policy({"type": "draft-simple", "n_max": int(llama["--spec-draft-n-max"]),
                                                  "n_min": int(llama["--spec-draft-n-min"]),
                                                  "p_min": float(llama["--spec-draft-p-min"])},
                                                 draft_kind=CHAIN_KIND[kind]), ""))
    elif kind == "ngram-simple":
        out.append(("llama.cpp", llamacpp_policy({"type": kind, "size_n": int(llama["--spec-ngram-simple-size-n"]),
                                                  "size_m": int(llama["--spec-ngram-simple-size-m"])}), ""))
    return out


def llamacpp_grid(atlas: Atlas) -> dict[str, list]:
    """llama.cpp's default grid, its p_min values kept only where the atlas holds the draft's chains
    wide enough to replay them (``AtlasSpec.chain_depth``)."""
    grid = dict(DEFAULT_GRIDS["llamacpp"])
    if atlas.spec.chain_depth < max(grid["n_max"]) or atlas.spec.chain_k < DRAFT_TOP_K:
        grid["p_min"] = [0.0]
    return grid


def forecast(atlas: Atlas | None, cfg: RunConfig, result: ServingConfig) -> Forecast:
    """The forecast for the controls ``cfg`` exported as ``result``, on ``atlas``."""
    if atlas is None:
        return Forecast(None, note="Record or upload this prompt's draft atlas in the **Threshold explorer** to see "
                                   "what each serving engine would accept on it, and its best settings.")
    talon_mat = talon_rate = None
    mine_cfg = for_slot(atlas, cfg)  # the controls' drafter on this atlas's draft slot (a head's counterpart)
    try:
        mine = replay(atlas, mine_cfg.replace(max_new_tokens=len(atlas.output)))
        talon_mat = mine.mat
        talon_rate = len(mine.summary.token_ids) / mine.predicted_s if mine.predicted_s > 0 else None
    except ConfigError:
        pass  # sampling or a corpus: Talon's own replay is greedy only
    exported: list[tuple[str, ServingRow | None, str]] = []
    policies = exported_policies(result)
    if cfg.drafter == "retrieval":  # vLLM's suffix is not replayed: its plain prompt-lookup alternative is
        lookup = prompt_lookup_config(cfg)
        policies.insert(0, ("vLLM ngram", VllmNgram(lookup["num_speculative_tokens"], lookup["prompt_lookup_min"],
                                                    lookup["prompt_lookup_max"]), ""))
    for serving, policy, note in policies:
        if policy is None:
            exported.append((serving, None, note))
            continue
        exported.append((serving, sweep_serving([atlas], [({}, policy)])[0], ""))
    best = {}
    for serving in ("vllm", "sglang", "llamacpp"):
        grid = llamacpp_grid(atlas) if serving == "llamacpp" else DEFAULT_GRIDS[serving]
        rows = sweep_serving([atlas], serving_policies(serving, grid, atlas.draft_kind))
        best[serving] = why_best(rows, best_serving_row(rows))
    if len(llamacpp_grid(atlas)["p_min"]) == 1:
        best["llamacpp"] += "; p_min not swept: record the atlas with --chain-depth 16 to replay it"
    return Forecast(talon_mat, talon_rate, exported, best,
                    talon_as=mine_cfg.drafter if mine_cfg.drafter != cfg.drafter else "",
                    adaptive=adaptive_advice([atlas], talon_rate))
