"""Serving bridge: a Talon configuration as SGLang launch flags and a vLLM ``--speculative-config``.

People tune speculation here, then serve it elsewhere. ``serving_config`` maps each knob to the
nearest server setting, says in ``notes`` how, and lists in ``not_carried`` what has no
equivalent, so nobody expects the server to behave like Talon where it cannot.

Every flag and key was checked against the engines' source, never guessed:

* SGLang 0.5.23 (PyPI wheel sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl):
  sglang/srt/arg_groups/fields/spec.py (the --speculative-* fields), arg_groups/arg_utils.py
  (field x_y -> flag --x-y), arg_groups/fields/model.py (--model-path), sglang/launch_server.py,
  arg_groups/speculative_hook.py (topk 1 forces num_draft_tokens = num_steps + 1; NGRAM rules),
  speculative/eagle_utils.py (organize_draft_results keeps the best num_draft_tokens - 1 of
  topk + (num_steps - 1) * topk**2 candidates), speculative/standalone_worker_v2.py (STANDALONE:
  the EAGLE tree worker with a separate draft model), speculative/adaptive_spec_params.py,
  sglang/kernels/jit/csrc/ngram_corpus/{param.h,trie.cpp} (num_draft_tokens - 1 drafts; PROB
  match type; windows of max_trie_depth tokens), speculative/cpp_ngram/external_corpus.py.
* vLLM 0.33.0 (PyPI sdist vllm-0.33.0.tar.gz): vllm/config/speculative.py (SpeculativeConfig),
  vllm/engine/arg_utils.py (--speculative-config), vllm/v1/spec_decode/{ngram_proposer,
  suffix_decoding}.py (one token list per request: no tree),
  docs/features/speculative_decoding/{draft_model,n_gram,suffix}.md.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field

from talon.run_config import ConfigError, RunConfig, TreeConfig
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET

SGLANG_VERSION = "0.5.23"
VLLM_VERSION = "0.33.0"

# Every flag and key this module can emit, each one checked in the sources listed above.
SGLANG_FLAGS: tuple[str, ...] = (
    "--model-path", "--speculative-algorithm", "--speculative-draft-model-path",
    "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
    "--speculative-ngram-match-type", "--speculative-ngram-max-bfs-breadth",
    "--speculative-ngram-max-trie-depth",
)
VLLM_KEYS: tuple[str, ...] = (
    "method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor",
)

# Talon's embedded pair is a dequantized GGUF copy of these Hub checkpoints.
EMBEDDED_HUB_IDS: dict[str, str] = {
    EMBEDDED_TARGET: "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    EMBEDDED_DRAFT: "Qwen/Qwen2.5-Coder-0.5B-Instruct",
}


@dataclass(frozen=True)
class ServingConfig:
    """The nearest server launch for one Talon configuration, and what it leaves behind."""

    sglang_flags: list[str]
    sglang_command: str
    vllm_config: dict
    vllm_command: str
    not_carried: list[str]
    notes: list[str]
    versions: dict[str, str]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def markdown(self) -> str:
        """Both commands, how each knob mapped, and what does not carry over."""
        gaps = self.not_carried or ["nothing: every knob has an equivalent"]
        sections = [  # blank lines between them, or a heading would continue the list above it
            f"**SGLang {self.versions['sglang']}**\n```bash\n{self.sglang_command}\n```",
            f"**vLLM {self.versions['vllm']}**\n```bash\n{self.vllm_command}\n```",
            "**How it mapped**\n" + "\n".join(f"- {note}" for note in self.notes),
            "**Does not carry over**\n" + "\n".join(f"- {gap}" for gap in gaps),
        ]
        return "\n\n".join(sections)


@dataclass(frozen=True)
class TreeShape:
    """The fixed tree a server drafts every step, in SGLang's terms.

    steps: draft forwards = tree depth; topk: children per expanded node, every layer;
    draft_tokens: verified tokens per step, the root (last committed token) included.
    """

    steps: int
    topk: int
    draft_tokens: int

    @property
    def chain_len(self) -> int:
        """Longest path: what a chain-only server drafts per step."""
        return min(self.draft_tokens - 1, self.steps)


@dataclass(frozen=True)
class _Half:
    """One drafter's share of the mapping."""

    sglang_flags: list[str]
    vllm_config: dict
    notes: list[str] = field(default_factory=list)
    not_carried: list[str] = field(default_factory=list)


def hub_id(spec: str) -> tuple[str, list[str]]:
    """The id a server can load for a model spec, with a note when it is not the spec itself."""
    if spec in EMBEDDED_HUB_IDS:
        hub = EMBEDDED_HUB_IDS[spec]
        return hub, [
            f"{spec} is Talon's offline copy of {hub} (a dequantized GGUF); the servers load the "
            "Hub checkpoint, whose logits can differ slightly"
        ]
    return spec, []


def tree_shape(tree: TreeConfig) -> TreeShape:
    """The static tree at Talon's limits: depth max_depth, width k, budget N.

    SGLang keeps the best ``draft_tokens - 1`` of ``topk + (steps - 1) * topk**2`` candidates,
    so N is capped there; with topk 1 it forces ``draft_tokens = steps + 1``, a chain as long as
    Talon's (``min(N, max_depth)``).
    """
    topk = 1 if tree.mode == "chain" else tree.top_k
    if topk == 1:
        steps = min(tree.budget, tree.max_depth)
        return TreeShape(steps, 1, steps + 1)
    candidates = topk + (tree.max_depth - 1) * topk * topk
    return TreeShape(tree.max_depth, topk, min(tree.budget, candidates) + 1)


def _model_half(cfg: RunConfig, draft: str) -> _Half:
    """A separate draft model: SGLang STANDALONE (tree), vLLM draft_model (chain)."""
    tree, shape = cfg.tree, tree_shape(cfg.tree)
    flags = [
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", draft,
        "--speculative-num-steps", str(shape.steps),
        "--speculative-eagle-topk", str(shape.topk),
        "--speculative-num-draft-tokens", str(shape.draft_tokens),
    ]
    vllm = {"method": "draft_model", "model": draft, "num_speculative_tokens": shape.chain_len}
    notes = [
        "draft model -> SGLang --speculative-algorithm STANDALONE (a separate small LM drafting "
        "with the EAGLE-2 tree worker; EAGLE/EAGLE3 need trained EAGLE heads, which Talon does "
        "not use) and vLLM method draft_model",
        f"{tree.mode} tree, depth {shape.steps} -> --speculative-num-steps {shape.steps} (one "
        f"draft forward per layer); width -> --speculative-eagle-topk {shape.topk}"
        + (" (a chain)" if shape.topk == 1 else f" (per-node width k={tree.top_k})"),
        f"budget N={tree.budget} -> --speculative-num-draft-tokens {shape.draft_tokens}: SGLang "
        "counts the root (the last verified token) too"
        + ("; with topk 1 it must be num-steps + 1" if shape.topk == 1 else "")
        + (f"; capped at the {shape.draft_tokens - 1} candidates this tree proposes"
           if shape.topk > 1 and shape.draft_tokens - 1 < tree.budget else ""),
        f"vLLM num_speculative_tokens {shape.chain_len} = the longest path of Talon's tree",
    ]
    return _Half(flags, vllm, notes, _model_gaps(cfg, shape))


def _model_gaps(cfg: RunConfig, shape: TreeShape) -> list[str]:
    """What the draft-model side of Talon does that neither server does."""
    tree, gaps = cfg.tree, []
    if tree.mode == "adaptive":
        gaps.append(
            f"the adaptive confidence gate (mu={tree.mu}): TALON grows deep where the drafter is "
            "sure and wide where it is not; both servers draft the same static shape every step, "
            "here the adaptive tree's limits"
        )
    if tree.mode != "static" and tree.min_conf > 0:
        gaps.append(f"the confidence stop min_conf={tree.min_conf}: the servers always draft to full depth")
    if tree.mode != "chain" and tree.root_k != shape.topk:
        gaps.append(
            f"root width K={tree.root_k}: SGLang uses one --speculative-eagle-topk for every "
            f"layer, so the root is {shape.topk} wide too"
        )
    if shape.topk > 1:
        gaps.append(
            f"the tree in vLLM: vLLM {VLLM_VERSION} verifies one chain of draft tokens per request, "
            f"so it drafts a chain of {shape.chain_len} tokens"
        )
    if cfg.draft_vocab:
        gaps.append(
            f"the draft head cut to the first {cfg.draft_vocab} ids (draft_vocab): SGLang's nearest, "
            f"--speculative-token-map, wants a torch-saved id list (torch.arange({cfg.draft_vocab})) "
            "you would create; vLLM has no such key"
        )
    if cfg.async_draft:
        gaps.append("async pre-drafting (drafting the next tree while the target verifies)")
    gaps.append("int8 draft weights (TALON_DRAFT_QUANT, the CPU default): the servers use the serving dtype")
    return gaps


def _retrieval_half(cfg: RunConfig) -> _Half:
    """Context lookup: SGLang NGRAM (a tree) and vLLM suffix decoding (one path)."""
    r, budget = cfg.retrieval, cfg.tree.budget
    window = r.min_match + r.max_continuation
    chain = min(budget, r.max_continuation)
    factor = round(r.max_continuation / r.min_match, 2)
    flags = [
        "--speculative-algorithm", "NGRAM",
        "--speculative-num-draft-tokens", str(budget + 1),
        "--speculative-ngram-match-type", "PROB",
        "--speculative-ngram-max-bfs-breadth", str(r.max_branches),
        "--speculative-ngram-max-trie-depth", str(window),
    ]
    vllm = {
        "method": "suffix",
        "num_speculative_tokens": chain,
        "suffix_decoding_max_tree_depth": window,
        "suffix_decoding_max_spec_factor": factor,
    }
    ngram = {"method": "ngram", "prompt_lookup_min": r.min_match, "prompt_lookup_max": window,
             "num_speculative_tokens": chain}
    notes = [
        "retrieval -> SGLang --speculative-algorithm NGRAM: a token tree from the matches of the "
        "context suffix in an n-gram trie over prompts and outputs (shared across requests; "
        "Talon's suffix automaton is per request)",
        f"budget N={budget} -> --speculative-num-draft-tokens {budget + 1} (the root counts)",
        "--speculative-ngram-match-type PROB: children ranked by count, nodes admitted by path "
        "probability, as Talon's build_trie",
        f"max_branches={r.max_branches} -> --speculative-ngram-max-bfs-breadth {r.max_branches}",
        f"min_match + max_continuation = {window} -> --speculative-ngram-max-trie-depth and vLLM "
        "suffix_decoding_max_tree_depth (both bound match + continuation)",
        "retrieval -> vLLM method suffix (pip install arctic-inference): a suffix tree over "
        "prompt and output with frequency-ranked continuations, the nearest to Talon's "
        f"retrieval; the plain prompt-lookup alternative (matches of min_match to {window} tokens) "
        f"is {json.dumps(ngram)}",
        f"vLLM num_speculative_tokens {chain} = min(N, max_continuation); max_spec_factor {factor} "
        "= max_continuation / min_match lets a minimal match draft a full continuation",
    ]
    gaps = [
        f"the minimum match min_match={r.min_match}: SGLang NGRAM and vLLM suffix draft from "
        "matches as short as one token (only vLLM's ngram method has prompt_lookup_min)",
    ]
    if r.max_branches > 1:
        gaps.append(f"the trie in vLLM (max_branches={r.max_branches}): suffix decoding proposes one path")
    if r.corpus:
        gaps.append(
            f"the retrieval corpus {r.corpus}: SGLang's nearest is --speculative-ngram-external-"
            "corpus-path with --speculative-ngram-external-sam-budget, but it reads JSONL whose "
            "lines are JSON strings; convert the corpus and add both flags yourself. vLLM has none"
        )
    return _Half(flags, vllm, notes, gaps)


def _hybrid_half(cfg: RunConfig, draft: str) -> _Half:
    """The draft-model half; the graft of retrieval into the model's tree has no equivalent."""
    model, retrieval = _model_half(cfg, draft), _retrieval_half(cfg)
    graft = (
        f"the hybrid graft: Talon grafts the retrieval trie (from a {cfg.retrieval.graft_threshold}"
        "-token match) under the draft model's tree and verifies both in one forward; a server "
        "runs one speculative algorithm, so only the draft-model half is configured. The "
        f"retrieval half alone would be SGLang {shlex.join(retrieval.sglang_flags)} or vLLM "
        f"{json.dumps(retrieval.vllm_config)}"
    )
    return dataclasses.replace(model, not_carried=[graft, *model.not_carried])


def _draft_half(cfg: RunConfig, draft: str | None) -> _Half:
    """The mapping for the drafter kind; a model drafter without a model is refused as Talon does."""
    if cfg.drafter == "none":
        return _Half([], {}, ["drafter none: plain autoregressive decoding, no speculation flags"])
    if cfg.drafter == "retrieval":
        return _retrieval_half(cfg)
    if draft is None:
        raise ConfigError(f"drafter {cfg.drafter!r} needs a draft model; pass one or use retrieval")
    return (_model_half if cfg.drafter == "model" else _hybrid_half)(cfg, draft)


def _run_notes(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """Notes and gaps that hold whatever the drafter: sampling and cost-aware planning."""
    notes, gaps, s = [], [], cfg.sampling
    if not s.greedy:
        notes.append(
            f"sampling (temperature={s.temperature}, top_p={s.top_p}, top_k={s.top_k}, "
            f"seed={s.seed}) is a per-request parameter, not a server flag: send it with each request"
        )
    if cfg.tree.cost_aware and cfg.drafter != "none":
        gaps.append(
            "cost-aware planning (growing, trimming or skipping the draft by measured cost): "
            "SGLang's --speculative-adaptive tunes num-steps from acceptance, but only for "
            "EAGLE/EAGLE3 with topk 1"
        )
    return notes, gaps


def serving_config(cfg: RunConfig, target: str, draft: str | None) -> ServingConfig:
    """The nearest SGLang and vLLM launch for ``cfg`` with ``target`` (and ``draft``) as loaded."""
    target_id, notes = hub_id(target)
    draft_id = None
    if draft is not None and cfg.drafter in ("model", "hybrid"):
        draft_id, draft_notes = hub_id(draft)
        notes += draft_notes
    half = _draft_half(cfg, draft_id)
    run_notes, run_gaps = _run_notes(cfg)
    sglang = ["python", "-m", "sglang.launch_server", "--model-path", target_id, *half.sglang_flags]
    vllm = ["vllm", "serve", target_id]
    if half.vllm_config:
        vllm += ["--speculative-config", json.dumps(half.vllm_config)]
    return ServingConfig(
        sglang_flags=half.sglang_flags,
        sglang_command=shlex.join(sglang),
        vllm_config=half.vllm_config,
        vllm_command=shlex.join(vllm),
        not_carried=[*half.not_carried, *run_gaps],
        notes=[*notes, *half.notes, *run_notes],
        versions={"sglang": SGLANG_VERSION, "vllm": VLLM_VERSION},
    )
