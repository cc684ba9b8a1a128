"""Will a model pair fit? Parameter and KV-cache bytes from a model's shape, checked against a
device's memory before anything is loaded.

The shapes of the GPU presets' models are written here from their published ``config.json``
files, so the check needs no download; any other model is described from its config.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from talon.models.base import ModelLoadError
from talon.run_config import MAX_BUDGET

GIB = 1024**3
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}
OVERHEAD = 1.15  # activations, the LM head's logits over a tree, CUDA context and allocator slack


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: a decoder-only transformer (Llama / Qwen2 family)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool = False  # Qwen2 has biases on q, k and v
    qk_norm: bool = False  # Qwen3 normalises q and k per head (and has no biases)
    explicit_head_dim: int = 0  # a config's own head_dim where it is not hidden // heads (Qwen3-0.6B)
    counted: int = 0  # parameters counted from a config the fields above cannot describe (``mla_moe_parameters``)
    cached_per_layer: int = 0  # elements a layer caches per token, where not keys and values of kv_heads x head_dim

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def family(self) -> str:
        """The transformers architecture the shape's checks build: llama, qwen2 or qwen3."""
        return "qwen3" if self.qk_norm else "qwen2" if self.qkv_bias else "llama"

    @property
    def parameters(self) -> int:
        if self.counted:
            return self.counted
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = 2 * self.hidden * q + 2 * self.hidden * kv
        if self.qkv_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.layers * layer + embeddings + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        if self.cached_per_layer:
            return self.layers * self.cached_per_layer * dtype_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def config_kwargs(self) -> dict[str, Any]:
        """``LlamaConfig`` / ``Qwen2Config`` arguments for a random model of this shape."""
        return dict(
            hidden_size=self.hidden, num_hidden_layers=self.layers, num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, intermediate_size=self.intermediate,
            vocab_size=self.vocab, tie_word_embeddings=self.tie_embeddings, head_dim=self.head_dim,
        )

    @staticmethod
    def from_config(config: Any) -> "ModelShape":
        return ModelShape(
            hidden=config.hidden_size, layers=config.num_hidden_layers, heads=config.num_attention_heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            intermediate=config.intermediate_size, vocab=config.vocab_size,
            tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=config.model_type == "qwen2", qk_norm=config.model_type == "qwen3",
            explicit_head_dim=(getattr(config, "head_dim", 0) or 0)
            if getattr(config, "head_dim", 0) != config.hidden_size // config.num_attention_heads else 0,
        )


def mla_moe_parameters(c: dict[str, Any], mtp_layers: int = 0) -> int:
    """The parameters of a DeepSeek-V3-style model (latent attention in every layer, the first
    ``first_k_dense_replace`` layers dense, the rest a routed MoE with shared experts), counted
    from its ``config.json`` fields, with ``mtp_layers`` MTP layers (each an MoE layer, its
    projection and three norms) as transformers builds them."""
    h, heads, rope = c["hidden_size"], c["num_attention_heads"], c["qk_rope_head_dim"]
    qk, q_lora, kv_lora = c["qk_nope_head_dim"] + rope, c.get("q_lora_rank"), c["kv_lora_rank"]
    q = h * q_lora + q_lora + q_lora * heads * qk if q_lora else h * heads * qk
    kv = h * (kv_lora + rope) + kv_lora + kv_lora * heads * (c["qk_nope_head_dim"] + c["v_head_dim"])
    attention = q + kv + heads * c["v_head_dim"] * h + 2 * h  # o_proj, and the layer's two norms
    experts = c["n_routed_experts"]
    moe = (experts + c["n_shared_experts"]) * 3 * h * c["moe_intermediate_size"] + experts * h + experts  # + router
    dense, layers = c["first_k_dense_replace"], c["num_hidden_layers"]
    body = layers * attention + dense * 3 * h * c["intermediate_size"] + (layers - dense) * moe
    mtp = mtp_layers * (attention + moe + 2 * h * h + 3 * h)
    return body + mtp + c["vocab_size"] * h * (1 if c.get("tie_word_embeddings") else 2) + h


def mla_moe_shape(config: dict[str, Any]) -> ModelShape:
    """The memory shape of a DeepSeek-V3-style target at ``config``, its MTP layers counted (each
    caches its keys and values as a target layer does: transformers caches latent attention
    decompressed, keys of qk_nope + qk_rope and values of v_head_dim per head)."""
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"] + config["num_nextn_predict_layers"]
    return ModelShape(config["hidden_size"], layers, heads, heads, config["intermediate_size"], config["vocab_size"],
                      bool(config.get("tie_word_embeddings")), explicit_head_dim=config["v_head_dim"],
                      counted=mla_moe_parameters(config, config["num_nextn_predict_layers"]),
                      cached_per_layer=heads * (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
                                                + config["v_head_dim"]))


# GLM-4.7-Flash's config.json (zai-org/GLM-4.7-Flash, MIT): also transformers 5.23's Glm4MoeLiteConfig defaults
GLM_47_FLASH = {"vocab_size": 154_880, "hidden_size": 2048, "intermediate_size": 10_240, "moe_intermediate_size": 1536,
                "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20,
                "n_shared_experts": 1, "n_routed_experts": 64, "num_experts_per_tok": 4, "kv_lora_rank": 512,
                "q_lora_rank": 768, "qk_rope_head_dim": 64, "qk_nope_head_dim": 192, "v_head_dim": 256,
                "first_k_dense_replace": 1, "num_nextn_predict_layers": 1, "tie_word_embeddings": False}

# Published config.json values (hidden, layers, heads, kv heads, intermediate, vocab, tied).
_QWEN_05B = ModelShape(896, 24, 14, 2, 4864, 151_936, True, True)
_QWEN_7B = ModelShape(3584, 28, 28, 4, 18_944, 152_064, False, True)
KNOWN_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-0.5B-Instruct": _QWEN_05B,
    "Qwen/Qwen2.5-Coder-0.5B-Instruct": _QWEN_05B,
    "Qwen/Qwen2.5-7B-Instruct": _QWEN_7B,
    "Qwen/Qwen2.5-Coder-7B-Instruct": _QWEN_7B,
    "Qwen/Qwen2.5-14B-Instruct": ModelShape(5120, 48, 40, 8, 13_824, 152_064, False, True),
    "meta-llama/Llama-3.2-1B-Instruct": ModelShape(2048, 16, 32, 8, 8192, 128_256, True),
    "meta-llama/Llama-3.1-8B-Instruct": ModelShape(4096, 32, 32, 8, 14_336, 128_256, False),
    # an EAGLE-3 head counted as one Llama layer with a 32k embedding and head: its fc and 2h-wide
    # q/k/v (about 0.1 B) in place of that embedding (0.13 B), so an estimate from above
    "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": ModelShape(4096, 1, 32, 8, 14_336, 32_000, False),
    "Qwen/Qwen3-8B": ModelShape(4096, 36, 32, 8, 12_288, 151_936, False, qk_norm=True),
    "Qwen/Qwen3-0.6B": ModelShape(1024, 28, 16, 8, 3072, 151_936, True, qk_norm=True, explicit_head_dim=128),
    # the head counted as the Llama head above is: one layer at the target's width, a 32k draft vocabulary
    "RedHatAI/Qwen3-8B-speculator.eagle3": ModelShape(4096, 1, 32, 8, 12_288, 32_000, False),
    # 47 layers and its MTP layer, each caching keys (192 + 64) and values (256) of 20 heads; 30.6 B parameters
    "zai-org/GLM-4.7-Flash": mla_moe_shape(GLM_47_FLASH),
}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a pair needs at ``tokens`` of context (prompt + new tokens + one tree), both caches."""

    weights: int
    kv_cache: int
    tokens: int
    dtype: str
    graphs: int = 0  # CUDA-graph replay: each model's largest bucket's buffers, its slot cache's rounding

    @property
    def total(self) -> int:
        return int((self.weights + self.kv_cache + self.graphs) * OVERHEAD)

    def describe(self) -> str:
        graphs = f", CUDA-graph buffers {self.graphs / GIB:.2f} GiB" if self.graphs else ""
        return (f"about {self.total / GIB:.1f} GiB in {self.dtype} (weights {self.weights / GIB:.1f} GiB, "
                f"KV caches {self.kv_cache / GIB:.2f} GiB at {self.tokens:,} tokens{graphs}, plus "
                f"{round(100 * (OVERHEAD - 1))} % for activations and the allocator)")


GRAPH_BUCKET = MAX_BUDGET + 1  # talon.graphs.static's largest bucket: a tree's root and MAX_BUDGET nodes
SLOT_QUANTUM = 1024  # talon.graphs.pool.StaticPool rounds a slot cache up to this many slots
LOGIT_BYTES = 10  # per logit of the largest bucket: the model's dtype, the float32 copy, the allocator's rounding


def graph_bytes(shape: ModelShape, size: int, tokens: int) -> int:
    """What replaying ``shape`` as CUDA graphs adds (talon/graphs/static.py): the largest bucket's
    logits and activations, held by its graph, and the slot cache's rounding up (measured on an
    H200, 7B target: 0.68 GiB of graph pool; this gives 0.44 GiB + the rounding, inside OVERHEAD)."""
    acts = GRAPH_BUCKET * (4 * shape.hidden + 2 * shape.intermediate) * size
    rounded = -(-(tokens + GRAPH_BUCKET) // SLOT_QUANTUM) * SLOT_QUANTUM
    return GRAPH_BUCKET * shape.vocab * LOGIT_BYTES + acts + shape.kv_bytes_per_token(size) * (rounded - tokens)


def estimate_pair(target: ModelShape, draft: ModelShape | None, dtype: str, tokens: int,
                  graphs: bool = False) -> MemoryEstimate:
    """What loading ``target`` and ``draft`` in ``dtype`` and running ``tokens`` of context costs;
    ``graphs``: with every step replayed as CUDA graphs (the default on CUDA)."""
    size = DTYPE_BYTES[dtype]
    models = [m for m in (target, draft) if m is not None]
    return MemoryEstimate(
        weights=sum(m.parameters for m in models) * size,
        kv_cache=sum(m.kv_bytes_per_token(size) for m in models) * tokens,
        tokens=tokens,
        dtype=dtype,
        graphs=sum(graph_bytes(m, size, tokens) for m in models) if graphs else 0,
    )


def check_fits(estimate: MemoryEstimate, available: int, what: str, gpu_gib: float | None = None) -> None:
    """ModelLoadError, before anything is loaded, when ``estimate`` exceeds ``available`` bytes."""
    if estimate.total <= available:
        return
    need = f" (this preset is meant for a GPU with {gpu_gib:g} GB or more)" if gpu_gib else ""
    raise ModelLoadError(
        f"{what} needs {estimate.describe()}, but this device has {available / GIB:.1f} GiB free{need}. "
        "Choose a smaller pair, lower the longest prompt (TALON_MAX_PROMPT_TOKENS) or "
        "max_new_tokens (TALON_MAX_NEW_TOKENS_LIMIT), or use a larger GPU."
    )


def scaled(shape: ModelShape, factor: int) -> ModelShape:
    """The same architecture shrunk ``factor`` times in width and depth (vocabulary kept apart:
    the caller chooses it), for CPU-sized checks of the same code paths."""
    heads = max(shape.heads // factor, 2)
    kv = max(min(shape.kv_heads, heads) // max(factor // 4, 1), 1)
    while heads % kv:
        kv -= 1
    return dataclasses.replace(
        shape, hidden=heads * 16, layers=max(shape.layers // factor, 2), heads=heads, kv_heads=kv,
        intermediate=max(shape.intermediate // (factor * 8), 32), explicit_head_dim=0,
    )


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up once (the lookup costs more than a trim), or None."""
    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


def trim_host_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``): a freed model's
    memory otherwise stays with this process (2.8 GB after the full-depth tests' models, 0.4 GB
    trimmed, measured). False where the C library has no such call."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
