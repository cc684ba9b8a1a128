"""The memory guard: parameter counts from the presets' shapes, and a pair that would not fit is
refused with a clear message before anything loads."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from talon.models import ModelLoadError
from talon.models.memory import GIB, KNOWN_SHAPES, ModelShape, check_fits, estimate_pair
from talon.server.pair import check_preset_memory
from talon.server.presets import PRESETS
from talon.settings import Settings
from tests.tiny import RSS_FIELDS, rss_kib

# Published parameter counts (model cards), in billions.
PUBLISHED = {
    "Qwen/Qwen2.5-0.5B-Instruct": 0.494, "Qwen/Qwen2.5-7B-Instruct": 7.62,
    "Qwen/Qwen2.5-14B-Instruct": 14.7, "meta-llama/Llama-3.2-1B-Instruct": 1.24,
    "meta-llama/Llama-3.1-8B-Instruct": 8.03,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_model_cards(name: str) -> None:
    assert KNOWN_SHAPES[name].parameters / 1e9 == pytest.approx(PUBLISHED[name], rel=0.01)


def test_a_shape_reads_a_config_and_counts_what_the_model_holds() -> None:
    from transformers import AutoModelForCausalLM

    for config in (LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False),
                   Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True)):
        model = AutoModelForCausalLM.from_config(config)
        assert ModelShape.from_config(config).parameters == sum(p.numel() for p in model.parameters())


def test_every_gpu_preset_fits_the_gpu_it_names_and_no_smaller_one() -> None:
    settings = Settings()
    for preset in (p for p in PRESETS if p.needs_cuda):
        assert preset.gpu_gib, preset.key
        check_preset_memory(settings, preset, "bfloat16", int(preset.gpu_gib * GIB * 0.95))  # fits
        with pytest.raises(ModelLoadError, match=f"meant for a GPU with {preset.gpu_gib:g} GB"):
            check_preset_memory(settings, preset, "bfloat16", int(preset.gpu_gib * GIB * 0.45))


def test_the_refusal_says_what_it_needs_and_what_to_do() -> None:
    big = next(p for p in PRESETS if p.key == "qwen2.5-14b")
    with pytest.raises(ModelLoadError) as caught:
        check_preset_memory(Settings(), big, "bfloat16", 22 * GIB)  # an A10G's free memory
    text = str(caught.value)
    assert "Qwen2.5-14B" in text and "GiB in bfloat16" in text and "22.0 GiB free" in text
    assert "TALON_MAX_PROMPT_TOKENS" in text and "smaller pair" in text
    longer = estimate_pair(KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"], None, "bfloat16", 32_000)
    shorter = estimate_pair(KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"], None, "bfloat16", 1_000)
    assert longer.kv_cache > 30 * shorter.kv_cache and longer.weights == shorter.weights
    check_fits(shorter, shorter.total, "x")  # exactly enough is enough


def test_cuda_graphs_add_their_buffers_to_the_guards_estimate() -> None:
    """On CUDA every step replays graphs (talon.graphs.static.resolve_forward): the largest bucket's
    logits and activations and the slot cache's rounding are counted, and the guard counts them."""
    qwen7, qwen05 = KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"], KNOWN_SHAPES["Qwen/Qwen2.5-0.5B-Instruct"]
    plain = estimate_pair(qwen7, qwen05, "bfloat16", 5377)
    graphs = estimate_pair(qwen7, qwen05, "bfloat16", 5377, graphs=True)
    assert plain.graphs == 0 and graphs.weights == plain.weights and graphs.kv_cache == plain.kv_cache
    assert 0.5 * GIB < graphs.graphs < 1.5 * GIB, "the H200 measured 0.68 + 0.22 GiB of graph pool for this pair"
    assert "CUDA-graph buffers" in graphs.describe() and "CUDA-graph" not in plain.describe()
    preset = next(p for p in PRESETS if p.key == "qwen2.5-7b")
    settings = Settings()
    tokens = settings.max_prompt_tokens + settings.max_new_tokens_limit + 257
    needed = estimate_pair(qwen7, qwen05, "bfloat16", tokens, graphs=True).total
    check_preset_memory(settings, preset, "bfloat16", needed)
    with pytest.raises(ModelLoadError, match="CUDA-graph buffers"):
        check_preset_memory(settings, preset, "bfloat16", needed - 1)


@pytest.mark.parametrize("name", sorted(KNOWN_SHAPES))
def test_every_known_shape_counts_what_its_architecture_holds(name: str) -> None:
    """Each shape, built at its real size on the meta device by the architecture its checks use
    (``ModelShape.family``), holds exactly the parameters the guard counts (Qwen3: per-head q and k
    norms, and the 0.6B's head_dim of 128, not hidden / heads)."""
    import torch
    from transformers import AutoModelForCausalLM

    from talon.gpucheck.check_model import config_for

    shape = KNOWN_SHAPES[name]
    if shape.counted:  # latent attention and a routed MoE (GLM-4.7-Flash): its own classes, its MTP layer too
        assert shape.parameters == mla_moe_target_size(name)
        return
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_for(shape, shape.family))
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert model.config.model_type == shape.family


def mla_moe_target_size(name: str) -> int:
    """Parameters of an MTP preset's target as transformers builds it from its published config
    (on the meta device), with its MTP layers (``MtpModel``: the shared embedding and head not
    counted twice) and the routers' score-correction biases (buffers, but checkpoint tensors)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_layers import MtpModel

    from talon.gpucheck.mtp import MTP_TARGETS
    from talon.models.mtp import declare_mtp_layers, mtp_layer_count

    kind, published = MTP_TARGETS[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **published))
        declare_mtp_layers(model.config)
        mtp = MtpModel(model, mtp_layer_count(model.config))
    own = [p for n, p in mtp.named_parameters() if not n.startswith(("embed_tokens.", "shared_head."))]
    biases = [b for n, b in [*model.named_buffers(), *mtp.named_buffers()] if n.endswith("e_score_correction_bias")]
    return sum(t.numel() for t in [*model.parameters(), *own, *biases])


def test_qwen3_shapes_match_the_model_cards() -> None:
    assert KNOWN_SHAPES["Qwen/Qwen3-8B"].parameters / 1e9 == pytest.approx(8.19, rel=0.01)
    assert KNOWN_SHAPES["Qwen/Qwen3-0.6B"].parameters / 1e9 == pytest.approx(0.596, rel=0.01)


def anonymous_mib() -> int:
    return rss_kib()[RSS_FIELDS.index("RssAnon")] // 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")
def test_a_freed_models_memory_goes_back_to_the_system() -> None:
    """Many medium tensors (a model's layers) freed under one kept at the heap's top stay this
    process's memory until the heap is trimmed (what ``release_memory`` and the suite do)."""
    from talon.models.memory import trim_host_heap

    torch.empty(64 * 2**20, dtype=torch.uint8).fill_(1)  # glibc's mmap threshold rises past what follows
    layers = [torch.ones(2**20, dtype=torch.uint8) for _ in range(400)]
    kept = torch.ones(2**20, dtype=torch.uint8)  # on top of them
    before = anonymous_mib()
    del layers
    gc.collect()
    freed = anonymous_mib()
    assert trim_host_heap()
    trimmed = anonymous_mib()
    assert freed > before - 100, "a plain free keeps the pages"
    assert trimmed < freed - 300, (before, freed, trimmed)
    del kept
