"""EAGLE-3 heads: the head drafts on the target's own features, lossless with drafts accepted.

A tiny target and a head trained here, in seconds, on the target's own features and greedy text
(what SpecForge and EAGLE's trainer do at scale): greedy decoding with the head equals the
target's ``generate`` on every tree mode, alone and with retrieval, accepting drafts above the
floor; features from the wrong position, or draft ids read without the vocabulary map, drop it
below. Both checkpoint layouts load to the same head, and a head that does not fit is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import DynamicCache

from talon.cli.main import main as cli_main
from talon.core.forward import additive_mask
from talon.drafters.eagle3 import HeadSource
from talon.engine.engine import Engine, generate
from talon.gpucheck.head import features_of
from talon.models import LoadedModel, ModelLoadError, load_pair
from talon.models.eagle3 import Eagle3Head, load_head
from talon.models.head_config import read_head_config
from talon.run_config import ConfigError, RunConfig, TreeConfig
from tests.tiny import (
    HEAD_LAYERS as LAYERS,
)
from tests.tiny import (
    HEAD_PROMPTS as PROMPTS,
)
from tests.tiny import (
    assert_decodes_own_generate,
    greedy_text,
    tiny_head,
    trained_pair,
)


@pytest.fixture(scope="module")
def head_pair() -> tuple[LoadedModel, LoadedModel]:
    return trained_pair()


@pytest.mark.parametrize("drafter", ["eagle3", "eagle3-hybrid"])
@pytest.mark.parametrize("tree", ["adaptive", "static", "chain"])
def test_the_head_decodes_the_targets_own_greedy_text(head_pair: tuple[LoadedModel, LoadedModel], drafter: str,
                                                      tree: str) -> None:
    target, head = head_pair
    assert_decodes_own_generate(target, head, drafter, tree)


@pytest.mark.parametrize("tree", ["adaptive", "chain"])
def test_the_head_on_the_static_forward_decodes_the_same(head_pair: tuple[LoadedModel, LoadedModel], tree: str) -> None:
    """The static forward (the buckets CUDA graphs replay on a GPU) returns the features too."""
    target, head = head_pair
    engine = Engine(target, head, costs=None, forward="static")
    ids = greedy_text(target, PROMPTS[0], 16)
    cfg = RunConfig(drafter="eagle3", max_new_tokens=32, chat_template=False,
                    tree=TreeConfig(mode=tree, budget=12, cost_aware=False))
    summary, _ = generate(engine, ids, cfg)
    assert summary.token_ids == greedy_text(target, PROMPTS[0], 48)[-32:]
    assert summary.mean_accepted_tokens >= 1.5 and summary.forward_path == "static+fold"


def handed_features(target: LoadedModel, head: LoadedModel,
                    forward: str = "dynamic") -> tuple[torch.Tensor, torch.Tensor]:
    """After a greedy run with the head: the features it was handed, one per committed position
    (the prefill's, then each step's root and accepted nodes'), and the target's own at those
    positions from one plain causal forward over the committed text."""
    engine = Engine(target, head, costs=None, forward=forward)
    cfg = RunConfig(drafter="eagle3", max_new_tokens=32, chat_template=False,
                    tree=TreeConfig(mode="adaptive", budget=12, cost_aware=False))
    run = engine.run(greedy_text(target, PROMPTS[0], 16), cfg)
    steps = list(run)
    assert sum(s.accept_len for s in steps) > 0, "the steps must accept drafts: several features a step"
    source = run.drafter.source
    committed = run.prompt_ids + run.generated
    return torch.stack(source.features), features_of(target, committed[:-1], source.feature_layers)


@pytest.mark.parametrize("forward", ["dynamic", "static"])
def test_the_head_is_handed_the_targets_features_at_their_own_positions(head_pair: tuple[LoadedModel, LoadedModel],
                                                                       forward: str) -> None:
    """Feature t is the target's hidden states entering the head's layers at position t, read off
    the prefill and the tree forwards (tree masks, not a causal one): equal to a plain forward's,
    on the dynamic cache and on the static forward (whose buckets CUDA graphs replay)."""
    got, want = handed_features(*head_pair, forward=forward)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-4)


def test_features_one_position_late_are_caught(head_pair: tuple[LoadedModel, LoadedModel],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: every feature handed over one position late (feature t - 1 beside token t + 1)."""
    handed = HeadSource.add_features
    late: dict[int, torch.Tensor] = {}

    def one_late(self: HeadSource, features: torch.Tensor) -> None:
        previous = late.get(id(self), torch.zeros_like(features[:1]))
        late[id(self)] = features[-1:]
        handed(self, torch.cat([previous, features[:-1]]))

    monkeypatch.setattr(HeadSource, "add_features", one_late)
    got, want = handed_features(*head_pair)
    assert got.shape == want.shape and not torch.allclose(got, want, atol=1e-4)


def test_draft_ids_go_through_the_vocabulary_map(head_pair: tuple[LoadedModel, LoadedModel]) -> None:
    """Planted: the draft's ids read as target ids (d2t zeroed): the drafts stop being accepted."""
    target, head = head_pair
    saved = head.model.d2t.clone()
    assert saved.any(), "the test's head must draft over a mapped vocabulary"
    try:
        head.model.d2t.zero_()
        with pytest.raises(AssertionError, match="MAT"):
            assert_decodes_own_generate(target, head, "eagle3", "adaptive")
    finally:
        head.model.d2t.copy_(saved)


def test_a_cost_aware_run_probes_the_heads_own_forward(head_pair: tuple[LoadedModel, LoadedModel]) -> None:
    target, head = head_pair
    engine = Engine(target, head)
    summary, steps = generate(engine, PROMPTS[0], RunConfig(drafter="eagle3", max_new_tokens=24, chat_template=False))
    costs = engine.cost_snapshot()
    assert costs.draft is not None and costs.draft_s(4) > 0 and summary.mean_accepted_tokens > 1.0
    assert summary.token_ids == greedy_text(target, PROMPTS[0], 24)[-24:][: len(summary.token_ids)]


# ---------------------------------------------------------------------------------------------
# Checkpoints: both layouts, and what does not fit
# ---------------------------------------------------------------------------------------------


def save_head(head: Eagle3Head, path: Path, layout: str, target_layers: int = LAYERS, **config: object) -> Path:
    """``head`` written as its trainers write it: EAGLE / SpecForge (``midlayer.*``, a flat Llama
    config) or speculators (``layers.0.*``, ``transformer_layer_config``, its own embedding)."""
    c = head.cfg
    layer = {"hidden_size": c.hidden, "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads,
             "head_dim": c.head_dim, "intermediate_size": c.intermediate, "vocab_size": c.vocab,
             "rms_norm_eps": c.rms_eps, "num_hidden_layers": 1, "hidden_act": "silu", "model_type": "llama"}
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    tensors = {}
    for name, tensor in head.state_dict().items():
        top = name.split(".")[0] in ("fc", "norm", "lm_head", "d2t")
        tensors[name if top else prefix + name] = tensor.contiguous()
    tensors["t2d"] = torch.zeros(c.vocab, dtype=torch.bool).index_fill_(0, torch.arange(c.draft_vocab) + head.d2t,
                                                                        True)
    if layout == "eagle":
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], **layer, "draft_vocab_size": c.draft_vocab,
               "tie_word_embeddings": False}
    else:
        tensors["embed_tokens.weight"] = head.embed.weight.detach().clone()
        cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
               "transformer_layer_config": layer, "draft_vocab_size": c.draft_vocab,
               "norm_before_residual": c.norm_before_residual}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**cfg, **config}), encoding="utf-8")
    save_file(tensors, str(path / "model.safetensors"))
    return path


def head_logits(head: Eagle3Head, target: LoadedModel) -> torch.Tensor:
    ids = greedy_text(target, PROMPTS[1], 8)
    g = features_of(target, ids, head.cfg.layers_for(LAYERS))[:-1]
    n = g.shape[0]
    mask = additive_mask(torch.ones(n, n, dtype=torch.bool).tril(), torch.float32)
    with torch.inference_mode():
        return head(g, torch.tensor(ids[1:]), torch.arange(n), DynamicCache(), mask)[1]


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_both_layouts_load_to_the_same_head(head_pair: tuple[LoadedModel, LoadedModel], layout: str,
                                            tmp_path: Path) -> None:
    target, head = head_pair
    loaded = load_head(save_head(head.model, tmp_path / layout, layout), target.model, torch.float32,
                       torch.device("cpu"))
    assert loaded.cfg.layout == layout and torch.equal(loaded.d2t, head.model.d2t)
    assert torch.equal(head_logits(loaded, target), head_logits(head.model, target))


def test_speculators_reads_an_absent_norm_before_residual_as_true(head_pair: tuple[LoadedModel, LoadedModel],
                                                                  tmp_path: Path) -> None:
    """vLLM's reading of a speculators config; an EAGLE / SpecForge config has no such switch."""
    _, head = head_pair
    path = save_head(head.model, tmp_path / "s", "speculators")
    raw = json.loads((path / "config.json").read_text())
    del raw["norm_before_residual"]
    (path / "config.json").write_text(json.dumps(raw))
    assert read_head_config(path).norm_before_residual
    assert not read_head_config(save_head(head.model, tmp_path / "e", "eagle")).norm_before_residual
    assert read_head_config(tmp_path) is None  # no config at all: not a head


@pytest.mark.parametrize(("change", "message"), [
    ({"target_hidden_size": 32}, "reads 32-wide features, the target is 64 wide"),
    ({"eagle_aux_hidden_state_layer_ids": [2, 3, 9]}, "reads layers (2, 3, 9), the target has 6"),
])
def test_a_head_that_does_not_fit_the_target_is_refused(head_pair: tuple[LoadedModel, LoadedModel], tmp_path: Path,
                                                        change: dict, message: str) -> None:
    target, head = head_pair
    path = save_head(head.model, tmp_path / "h", "eagle", **change)
    with pytest.raises(ModelLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_head(path, target.model, torch.float32, torch.device("cpu"))


def test_aux_layers_set_the_hidden_states_a_head_reads(head_pair: tuple[LoadedModel, LoadedModel],
                                                        tmp_path: Path) -> None:
    """A config whose ids read a layer early (a SpecForge list taken as written, as vLLM's runner
    takes it) drafts other logits; ``--aux-layers`` with the trained layers gives the head's own
    back, and is checked against the target like the config's ids."""
    target, head = head_pair
    trained = head.model.cfg.layers_for(LAYERS)
    early = tuple(i - 1 for i in trained)
    path = save_head(head.model, tmp_path / "h", "speculators", eagle_aux_hidden_state_layer_ids=list(early))
    cpu = torch.device("cpu")
    as_written = load_head(path, target.model, torch.float32, cpu)
    assert as_written.cfg.layers_for(LAYERS) == early
    assert not torch.allclose(head_logits(as_written, target), head_logits(head.model, target), atol=1e-4)
    fixed = load_head(path, target.model, torch.float32, cpu, aux_layers=trained)
    assert fixed.cfg.layers_for(LAYERS) == trained and "--aux-layers" in fixed.cfg.aux_rule
    assert torch.equal(head_logits(fixed, target), head_logits(head.model, target))
    with pytest.raises(ModelLoadError, match="the target has 6"):
        load_head(path, target.model, torch.float32, cpu, aux_layers=(2, 3, 9))


def test_aux_layers_are_refused_without_a_head_and_when_malformed(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Before any weight loads: the target named here does not exist."""
    with pytest.raises(ModelLoadError, match="is not an EAGLE-3 head"):
        load_pair(str(tmp_path / "no-such-target"), "none", aux_layers=(2, 3, 4))
    for bad, why in (("2,x,4", "a comma list of integers"), ("-1,2", "indices of at least 0")):
        with pytest.raises(SystemExit):
            cli_main(["generate", "--prompt", "a", f"--aux-layers={bad}"])
        assert why in capsys.readouterr().err


def test_a_head_is_refused_where_it_cannot_draft(head_pair: tuple[LoadedModel, LoadedModel]) -> None:
    target, head = head_pair
    engine = Engine(target, head)
    with pytest.raises(ConfigError, match="EAGLE-3 head, not a model"):
        engine.prepare("abc", RunConfig(drafter="hybrid"))
    with pytest.raises(ConfigError, match="async_draft off"):
        engine.prepare("abc", RunConfig(drafter="eagle3", async_draft=True))
    with pytest.raises(ConfigError, match="needs an EAGLE-3 head"):
        Engine(target, None).prepare("abc", RunConfig(drafter="eagle3"))


def test_the_command_line_drafts_with_a_head_directory(head_pair: tuple[LoadedModel, LoadedModel], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m talon generate --target T --draft H --drafter eagle3 --json``: the target's own greedy text."""
    from talon.cli.main import main

    target, head = head_pair
    target.model.save_pretrained(tmp_path / "target")
    target.tokenizer.save_pretrained(tmp_path / "target")
    head_dir = save_head(head.model, tmp_path / "head", "speculators")
    code = main(["generate", "--prompt", PROMPTS[0], "--target", str(tmp_path / "target"), "--draft", str(head_dir),
                 "--drafter", "eagle3", "--device", "cpu", "--dtype", "float32", "--max-new-tokens", "24",
                 "--no-chat-template", "--cost-aware", "off", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["draft"] == str(head_dir)
    assert summary["token_ids"] == greedy_text(target, PROMPTS[0], 24)[-24:]
    assert summary["mean_accepted_tokens"] > 1.5


def test_serve_it_maps_a_head_to_sglang_eagle3_and_vllm_eagle3() -> None:
    from talon.atlas.serving import serving_config

    target, head = "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    cfg = RunConfig(drafter="eagle3", tree=TreeConfig(mode="static", budget=16, top_k=4, max_depth=5))
    served = serving_config(cfg, target, head)
    flags = dict(zip(served.sglang_flags[::2], served.sglang_flags[1::2]))
    assert flags["--speculative-algorithm"] == "EAGLE3" and flags["--speculative-draft-model-path"] == head
    assert flags["--speculative-num-steps"] == "5" and flags["--speculative-eagle-topk"] == "4"
    assert served.vllm_config == {"method": "eagle3", "model": head, "num_speculative_tokens": 5}
    hybrid = serving_config(cfg.replace(drafter="eagle3-hybrid"), target, head)
    assert hybrid.vllm_config["method"] == "eagle3" and any("hybrid graft" in g for g in hybrid.not_carried)
    assert serving_config(cfg.replace(drafter="model"), target, "d").vllm_config["method"] == "draft_model"


def test_the_app_offers_a_heads_kinds_where_the_draft_slot_holds_one(head_pair: tuple[LoadedModel, LoadedModel],
                                                                     tmp_path: Path) -> None:
    """The Models menu's pair decides the drafter radio: a draft model's kinds, or a head's (a head
    preset, or the server's TALON_DRAFT a head's directory), hybrid turning into eagle3-hybrid."""
    from talon.knobs import HEAD_PAIR_KINDS, MODEL_PAIR_KINDS
    from talon.server.offer import drafter_choices, holds_head
    from talon.server.presets import PRESETS
    from talon.settings import Settings

    _, head = head_pair
    assert drafter_choices(Settings(), "default", "hybrid") == (MODEL_PAIR_KINDS, "hybrid")
    assert "eagle3" not in MODEL_PAIR_KINDS and {"eagle3", "eagle3-hybrid", "retrieval"} <= set(HEAD_PAIR_KINDS)
    server_head = Settings(draft=str(save_head(head.model, tmp_path / "h", "eagle")))
    assert drafter_choices(server_head, "default", "hybrid") == (HEAD_PAIR_KINDS, "eagle3-hybrid")
    assert drafter_choices(server_head, "default", "retrieval") == (HEAD_PAIR_KINDS, "retrieval")
    assert drafter_choices(Settings(), "default", "eagle3") == (MODEL_PAIR_KINDS, "model")
    assert [p.key for p in PRESETS if holds_head(Settings(), p)] == ["llama-3.1-8b-eagle3", "qwen3-8b-eagle3"]


def test_the_memory_guard_counts_the_head() -> None:
    from talon.models.memory import KNOWN_SHAPES, estimate_pair
    from talon.server.presets import PRESETS

    preset = next(p for p in PRESETS if p.head)
    target, head = KNOWN_SHAPES[preset.target], KNOWN_SHAPES[preset.draft]
    alone = estimate_pair(target, None, "bfloat16", 4096, graphs=True).total
    with_head = estimate_pair(target, head, "bfloat16", 4096, graphs=True).total
    assert 0.7e9 < with_head - alone < 1.5e9, "a head of about 0.43 B parameters in bf16, counted from above"
    assert 0.4e9 < head.parameters < 0.6e9


def test_a_head_over_the_whole_vocabulary_needs_no_map(head_pair: tuple[LoadedModel, LoadedModel],
                                                        tmp_path: Path) -> None:
    """speculators writes no ``d2t`` when the draft vocabulary is the target's: the ids are the same."""
    from safetensors.torch import load_file

    target, _ = head_pair
    head = tiny_head(target.model, seed=7)
    path = save_head(head, tmp_path / "full", "speculators")
    tensors = load_file(str(path / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}, str(path / "model.safetensors"))
    loaded = load_head(path, target.model, torch.float32, torch.device("cpu"))
    assert not loaded.d2t.any() and torch.equal(head_logits(loaded, target), head_logits(head, target))


def test_the_app_draws_head_nodes_as_the_heads(head_pair: tuple[LoadedModel, LoadedModel], tmp_path: Path) -> None:
    """A head's nodes are "head" in the trace (a file reads back), the tree's legend, the
    inspector, the committed-source bars and the walk; a draft model's stay "model"."""
    from talon.figures import accepted_per_step_figure, node_inspector_html, tree_figure, walk_html
    from talon.trace import dump_trace, parse_trace

    target, head = head_pair
    summary, steps = generate(Engine(target, head, costs=None), greedy_text(target, PROMPTS[0], 16),
                              RunConfig(drafter="eagle3-hybrid", max_new_tokens=24, chat_template=False))
    step = max(steps, key=lambda s: s.sources.count("head"))
    assert "head" in step.sources and "model" not in {s for st in steps for s in st.sources}
    dump_trace(str(tmp_path / "t.json"), summary, steps)
    assert parse_trace(json.loads((tmp_path / "t.json").read_text()))[1][step.step].sources == step.sources
    legend = [t.name for t in tree_figure(step).data if t.showlegend is not False]
    assert "EAGLE-3 head" in legend and "draft model" not in legend
    node = step.sources.index("head")
    assert "EAGLE-3 head" in node_inspector_html(step, node)
    bars = [t.name for t in accepted_per_step_figure(steps).data if t.type == "bar"]
    assert "EAGLE-3 head" in bars and "draft model" not in bars
    assert "from the EAGLE-3 head" in walk_html(0, summary, steps, step.step)
