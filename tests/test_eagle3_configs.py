"""EAGLE-3 head configs read as the serving engines read them: which of the target's hidden states
the head takes (speculators' ids as written, SpecForge's nested ids as SGLang reads them), RoPE
(a flat theta, ``llama3`` scaling), ``norm_before_residual``, the draft vocabulary and the target's
width, on the published configs in ``data/eagle3_configs``; heads Talon's layer would run wrongly
are refused before a weight loads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from talon.models import ModelLoadError
from talon.models.eagle3 import Eagle3Head
from talon.models.head_config import read_head_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "eagle3_configs"
LLAMA_LAYER = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
               "vocab_size": 300, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "model_type": "llama"}


def written(tmp: Path, config: dict, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if tensors:
        save_file(tensors, str(tmp / "model.safetensors"))
    return tmp


def specforge(**extra: object) -> dict:
    return {"architectures": ["LlamaForCausalLMEagle3"], **LLAMA_LAYER, "draft_vocab_size": 96, **extra}


def speculators(**extra: object) -> dict:
    return {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": LLAMA_LAYER, "draft_vocab_size": 96, **extra}


@pytest.mark.parametrize("layers", [16, 28, 32, 36, 61, 94])
def test_specforges_default_ids_are_read_as_sglang_reads_them(layers: int, tmp_path: Path) -> None:
    """SpecForge's ``[1, N//2-1, N-4]`` ("the output of layer i") are the hidden states every engine
    reads by default: 2, N//2, N-3 (HF indices)."""
    ids = [1, layers // 2 - 1, layers - 4]
    cfg = read_head_config(written(tmp_path, specforge(eagle_config={"eagle_aux_hidden_state_layer_ids": ids})))
    assert cfg.layers_for(layers) == (2, layers // 2, layers - 3)
    assert "SpecForge" in cfg.aux_rule  # how the ids were read travels with the config (and the load log)
    assert cfg.layers_for(layers) == read_head_config(written(tmp_path / "none", specforge())).layers_for(layers)


@pytest.mark.parametrize(("config", "want"), [
    (speculators(eagle_aux_hidden_state_layer_ids=[1, 15, 28]), (1, 15, 28)),  # vLLM: as written
    (speculators(eagle_aux_hidden_state_layer_ids=None), (2, 16, 29)),  # Red Hat's heads write null
    (specforge(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 46, 90]}), (2, 47, 91)),  # SpecForge's Qwen3-235B
    (specforge(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}), (3, 17, 30)),  # layer outputs too
])
def test_each_layout_reads_its_ids_its_engines_way(config: dict, want: tuple[int, ...], tmp_path: Path) -> None:
    """SpecForge captures ``hidden_states[i + 1]`` for its id i whatever the list (its capture test
    and SGLang's Llama and Qwen models, which add 1 to every id), so a nested list is read + 1
    even where it does not start at 1."""
    cfg = read_head_config(written(tmp_path, config))
    assert cfg.layers_for(32) == want
    assert cfg.overridden((4, 5, 6)).layers_for(32) == (4, 5, 6)  # --aux-layers, whatever the config says
    assert "--aux-layers 4,5,6" in cfg.overridden((4, 5, 6)).aux_rule


def specforge_export(source: Path, out: Path) -> Path:
    """``config.json`` written as SpecForge's exporter writes it (sgl-project/SpecForge a6b6b02,
    ``specforge/export/to_sglang.py``): the training run's draft config read by
    ``AutoDraftModelConfig.from_file`` (untied embeddings, ``draft_vocab_size`` defaulting to the
    vocabulary) into the registered ``LlamaConfig``, saved by ``save_pretrained``, then
    ``apply_legacy_rope_scaling`` (``export/checkpoint_io.py``) mirroring ``rope_theta`` to the
    top level and rewriting the file sorted, indented by 2."""
    from transformers import LlamaConfig

    config = json.loads(source.read_text(encoding="utf-8"))
    if "tie_word_embeddings" in config:
        config["tie_word_embeddings"] = False
    if config.get("draft_vocab_size") is None:
        config["draft_vocab_size"] = config.get("vocab_size")
    LlamaConfig.from_dict(config).save_pretrained(out)
    written_config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    rope = written_config.get("rope_parameters") or {}
    if "rope_theta" in rope and written_config.get("rope_theta") != rope["rope_theta"]:
        written_config["rope_theta"] = rope["rope_theta"]
        (out / "config.json").write_text(json.dumps(written_config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out


def test_specforges_exported_config_reads_the_hidden_states_it_trained_on(tmp_path: Path) -> None:
    """SpecForge's Qwen3-235B-A22B draft config (``configs/qwen3-235B-A22B-eagle3.json``, ids
    ``[1, 46, 90]`` on 94 layers), exported the way SpecForge exports it: the committed
    ``config.json`` is what that export writes, and it reads the hidden states SpecForge
    captured in training (``hidden_states[i + 1]``: 2, 47, 91), not the ids as written."""
    folder = CONFIGS / "specforge-qwen3-235b"
    exported = json.loads((specforge_export(folder / "source.json", tmp_path) / "config.json").read_text())
    committed = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in exported.items() if k != "transformers_version"} == \
        {k: v for k, v in committed.items() if k != "transformers_version"}
    cfg = read_head_config(folder)
    assert cfg.layers_for(94) == (2, 47, 91) and "SpecForge" in cfg.aux_rule
    assert (cfg.layout, cfg.hidden, cfg.target_hidden, cfg.heads, cfg.kv_heads, cfg.head_dim) == \
        ("eagle", 4096, 4096, 64, 4, 128)
    assert (cfg.vocab, cfg.draft_vocab, cfg.rope_theta, cfg.rope_scaling) == (151936, 32000, 1e6, None)


@pytest.mark.parametrize("folder", ["eagle-llama3.1-8b", "speculators-llama3.1-8b"])
def test_the_llama_heads_published_configs_read_to_the_engines_values(folder: str) -> None:
    """The ``llama-3.1-8b-eagle3`` preset's head in both layouts: RoPE base 10000 with no scaling
    (EAGLE trained it so; vLLM and SGLang default to it), residual before the norm, the default
    feature layers of Llama-3.1-8B's 32, a 32,000-token draft vocabulary over 128,256 ids."""
    cfg = read_head_config(CONFIGS / folder)
    assert (cfg.rope_theta, cfg.rope_scaling, cfg.norm_before_residual) == (10000.0, None, False)
    assert cfg.layers_for(32) == (2, 16, 29)
    assert (cfg.hidden, cfg.target_hidden, cfg.heads, cfg.kv_heads, cfg.head_dim) == (4096, 4096, 32, 8, 128)
    assert (cfg.intermediate, cfg.vocab, cfg.draft_vocab, cfg.rms_eps) == (14336, 128256, 32000, 1e-5)
    assert cfg.layout == ("eagle" if folder.startswith("eagle") else "speculators")


def llama3_inv_freq(dim: int, theta: float, factor: float, low: float, high: float, original: int) -> torch.Tensor:
    """Llama 3.1's frequency scaling, written from its reference: long wavelengths divided by
    ``factor``, short ones kept, a smooth blend between."""
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / theta ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(freq)
        elif wavelen > original / low:
            out.append(freq / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float64)


def test_a_flat_theta_and_llama3_scaling_reach_the_heads_rope(tmp_path: Path) -> None:
    """SpecForge's Llama-3 70B config writes ``rope_theta`` 5e5 and ``rope_scaling`` of type llama3
    at the top; a speculators head writes them in ``transformer_layer_config``."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    want = llama3_inv_freq(16, 5e5, 8.0, 1.0, 4.0, 64)
    layer = {**LLAMA_LAYER, "rope_theta": 5e5, "rope_scaling": scaling}
    for config in (specforge(rope_theta=5e5, rope_scaling=scaling), speculators(transformer_layer_config=layer)):
        cfg = read_head_config(written(tmp_path / config["architectures"][0], config))
        assert cfg.rope_theta == 5e5 and cfg.rope_scaling["rope_type"] == "llama3"
        head = Eagle3Head(cfg, torch.nn.Embedding(300, 64))
        assert torch.allclose(head.rotary.inv_freq.double(), want, rtol=1e-5)
        assert not torch.allclose(want, llama3_inv_freq(16, 1e4, 8.0, 1.0, 4.0, 64))  # theta matters


def test_a_flat_theta_of_a_million_without_scaling(tmp_path: Path) -> None:
    """SpecForge's Qwen3-8B config: ``rope_theta`` 1e6, ``rope_scaling`` null."""
    cfg = read_head_config(written(tmp_path, specforge(rope_theta=1000000, rope_scaling=None)))
    head = Eagle3Head(cfg, torch.nn.Embedding(300, 64))
    assert cfg.rope_scaling is None
    assert torch.allclose(head.rotary.inv_freq.double(), 1.0 / 1e6 ** (torch.arange(0, 16, 2).double() / 16))


def test_a_head_narrower_than_its_target_reads_features_of_the_targets_width(tmp_path: Path) -> None:
    cfg = read_head_config(written(tmp_path, speculators(target_hidden_size=96)))
    head = Eagle3Head(cfg, torch.nn.Embedding(300, 64))
    assert (cfg.hidden, cfg.target_hidden) == (64, 96) and head.fc.weight.shape == (64, 3 * 96)


@pytest.mark.parametrize(("config", "tensors", "why"), [
    (speculators(transformer_layer_config={**LLAMA_LAYER, "attention_bias": True}), None, "attention biases"),
    (specforge(quantization_config={"quant_method": "compressed-tensors"}), None, "compressed-tensors weights"),
    (speculators(), {"layers.0.self_attn.q_norm.weight": torch.ones(16)}, "q/k norms"),
    (specforge(), {"midlayer.self_attn.q_proj.bias": torch.zeros(64)}, "attention biases"),
    (speculators(norm_before_fc=True), None, "EAGLE 3.1 option"),
    (specforge(num_hidden_layers=2), None, "2 layers"),
])
def test_a_head_talon_would_run_wrongly_is_refused_before_it_loads(config: dict, tensors: dict | None, why: str,
                                                                   tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=why):
        read_head_config(written(tmp_path, config, tensors))

