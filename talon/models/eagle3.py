"""EAGLE-3 heads: one decoder layer on the target's own features, and loading one.

A head (EAGLE-3, arXiv 2503.01840; the drafter TALON's paper builds its trees on) reads the
target's hidden states entering three of its layers (``aux_layers``: 2, N//2 and N-3 by default,
HF ``output_hidden_states`` indices), concatenated low to high: the *features*. Checkpoints write
those layers two ways (``read_feature_layers``): speculators and vLLM as the index itself (the input of
layer i), SpecForge in ``eagle_config`` as "the output of layer i" (its default ``[1, N//2-1, N-4]``),
which SGLang reads as index i + 1. The feature at
position t pairs with token t+1, at position id t::

    g   = fc(features_t)                       (3H -> h; deeper levels: the head's own output, no fc)
    x   = cat(input_layernorm(embed(token_{t+1})), hidden_norm(g))           (2h, embedding first)
    h1  = g + o_proj(attention(x))             (residual: hidden_norm(g) where norm_before_residual)
    out = h1 + mlp(post_attention_layernorm(h1))
    logits = lm_head(norm(out))                (the draft vocabulary; target id = i + d2t[i])

A tree node at depth d >= 1 feeds its parent's ``out`` with its own token at position t + d
(``talon.drafters.eagle3.HeadSource`` drafts with it).

Two checkpoint layouts load (``load_head``): EAGLE / SpecForge (``midlayer.*``, a flat Llama
config with ``draft_vocab_size``) and ``speculators`` (``layers.0.*``, ``transformer_layer_config``).
Both name the same tensors; the attention, MLP, norms and RoPE are transformers' Llama modules.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from talon.models.base import ModelLoadError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadConfig:
    """An EAGLE-3 head's shape, as its ``config.json`` gives it (``read_head_config``)."""

    hidden: int  # h: the head's width
    target_hidden: int  # H: the target's width (features are 3H wide)
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int  # the target's vocabulary (embedding rows)
    draft_vocab: int
    rms_eps: float
    rope_theta: float
    rope_scaling: dict | None
    aux_layers: tuple[int, ...] | None  # HF hidden-state indices; None: 2, N//2, N-3 of the target
    aux_rule: str  # how the checkpoint's ids were read (``read_feature_layers``)
    norm_before_residual: bool
    layout: str  # "eagle" or "speculators"

    def llama(self) -> LlamaConfig:
        """The Llama config transformers' attention, MLP and RoPE modules are built from."""
        rope: dict = {"rope_type": "default"}
        if self.rope_scaling:  # a legacy config's {"type": ...} is transformers' {"rope_type": ...}
            rope = {k: v for k, v in self.rope_scaling.items() if k != "type"}
            rope.setdefault("rope_type", self.rope_scaling.get("type", "default"))
        rope["rope_theta"] = self.rope_theta
        cfg = LlamaConfig(hidden_size=self.hidden, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                          head_dim=self.head_dim, intermediate_size=self.intermediate, rms_norm_eps=self.rms_eps,
                          num_hidden_layers=1, vocab_size=self.vocab, hidden_act="silu", rope_parameters=rope,
                          attention_bias=False, mlp_bias=False, attn_implementation="sdpa")
        return cfg

    def layers_for(self, target_layers: int) -> tuple[int, ...]:
        """The target's hidden states the head reads (HF ``output_hidden_states`` indices)."""
        if self.aux_layers is not None:
            return self.aux_layers
        return (2, target_layers // 2, target_layers - 3)


def read_head_config(path: Path) -> HeadConfig | None:
    """The head's shape from ``path/config.json``, or None if it is not an EAGLE-3 head."""
    try:
        raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if raw.get("speculators_model_type") == "eagle3":
        layer = dict(raw.get("transformer_layer_config") or {})
        layout, default_nbr = "speculators", True  # vLLM reads an absent norm_before_residual as true here
    elif "draft_vocab_size" in raw and any("Eagle3" in a or "LlamaForCausalLM" == a
                                           for a in raw.get("architectures") or []):
        layer, layout, default_nbr = raw, "eagle", False
    else:
        return None
    refuse_unsupported(path, raw, layer)
    aux, aux_rule = read_feature_layers(raw)
    rope = dict(layer.get("rope_parameters") or {})  # transformers 5 writes rope_theta and scaling here
    scaling = layer.get("rope_scaling") or ({k: v for k, v in rope.items() if k != "rope_theta"}
                                            if rope.get("rope_type", "default") != "default" else None)
    try:
        hidden, heads = int(layer["hidden_size"]), int(layer["num_attention_heads"])
        vocab = int(layer["vocab_size"])
        return HeadConfig(
            hidden=hidden, target_hidden=int(raw.get("target_hidden_size") or hidden), heads=heads,
            kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            intermediate=int(layer["intermediate_size"]), vocab=vocab,
            draft_vocab=int(raw.get("draft_vocab_size") or vocab), rms_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta") or layer.get("rope_theta") or 10000.0),  # EAGLE: 10000 if absent
            rope_scaling=scaling,
            aux_layers=aux, aux_rule=aux_rule,
            norm_before_residual=bool(raw.get("norm_before_residual", default_nbr)), layout=layout)
    except (KeyError, TypeError, ValueError) as error:
        raise ModelLoadError(f"{path}: an EAGLE-3 config without a usable {error} (hidden_size, "
                             "num_attention_heads, intermediate_size, vocab_size)") from error


def read_feature_layers(raw: dict) -> tuple[tuple[int, ...] | None, str]:
    """The target's hidden states a head reads (HF ``output_hidden_states`` indices: 0 is the
    embedding, i the output of layer i - 1), as the serving engines read the checkpoint's ids:

    * top-level ``eagle_aux_hidden_state_layer_ids`` (speculators, vLLM): the index as written;
    * nested ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SpecForge, SGLang): SGLang's
      ``set_eagle3_layers_to_capture`` as of sglang PR #25454 (main, 2026-05): ids whose first is 1
      are "the output of layer i" (SpecForge's default ``[1, N//2-1, N-4]``), read as i + 1; any
      other list is already an index. (SGLang before it added 1 always; vLLM reads nested ids as
      written, one layer early for SpecForge's.)
    * none: 2, N//2 and N-3, every engine's default."""
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    if top:
        return tuple(int(i) for i in top), "top-level ids, as written (speculators, vLLM)"
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested:
        ids = [int(i) for i in nested]
        if ids[0] == 1:
            return tuple(i + 1 for i in ids), "eagle_config ids as layer outputs, each + 1 (SpecForge, SGLang)"
        return tuple(ids), "eagle_config ids as written (SGLang: a list not starting at 1)"
    return None, "none written: 2, N//2, N-3 (every engine's default)"


UNSUPPORTED_TENSORS = {"q_norm": "q/k norms in its attention", "k_norm": "q/k norms in its attention",
                       "q_proj.bias": "attention biases", "fc.bias": "a bias on fc"}


def refuse_unsupported(path: Path, raw: dict, layer: dict) -> None:
    """ModelLoadError, before any weight loads, for heads Talon's layer would run wrongly: EAGLE 3.1
    options, several layers, attention biases, q/k norms (read from the checkpoint's tensor names),
    quantized (compressed-tensors) weights."""
    why = [f"{k} (an EAGLE 3.1 option)" for k in ("norm_before_fc", "fc_norm", "norm_output") if raw.get(k)]
    if int(layer.get("num_hidden_layers") or 1) != 1:
        why.append(f"{layer.get('num_hidden_layers')} layers")
    if layer.get("attention_bias") or raw.get("attention_bias"):
        why.append("attention biases (attention_bias: true)")
    quant = raw.get("quantization_config") or layer.get("quantization_config")
    if quant:
        why.append(f"{(quant or {}).get('quant_method', 'quantized')} weights")
    names = tensor_names(path)
    why += sorted({what for name in names for key, what in UNSUPPORTED_TENSORS.items() if name.endswith(key + ".weight")
                   or name.endswith(key)})
    if why:
        raise ModelLoadError(f"{path}: an EAGLE-3 head with {', '.join(why)} is not supported; Talon runs the "
                             "one-layer Llama head EAGLE-3, SpecForge and speculators train (no biases, no q/k "
                             "norms, unquantized)")


def tensor_names(path: Path) -> list[str]:
    """The checkpoint's tensor names from its safetensors headers alone (no weight is read); a
    ``pytorch_model.bin`` is opened memory-mapped. Empty where there is no checkpoint yet."""
    names: list[str] = []
    for f in sorted(path.glob("*.safetensors")):
        with f.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            names += [k for k in json.loads(fh.read(size)) if k != "__metadata__"]
    if not names and (path / "pytorch_model.bin").is_file():
        names = list(torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True, mmap=True))
    return names


class Eagle3Head(nn.Module):
    """The head's weights and one forward (see the module docstring). ``embed``: the target's
    input embedding, shared unless the checkpoint brings its own."""

    def __init__(self, cfg: HeadConfig, embed: nn.Module) -> None:
        super().__init__()
        h, llama = cfg.hidden, cfg.llama()
        self.cfg = cfg
        self.fc = nn.Linear(3 * cfg.target_hidden, h, bias=False)
        self.input_layernorm = LlamaRMSNorm(h, eps=cfg.rms_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=cfg.rms_eps)
        self.self_attn = LlamaAttention(llama, layer_idx=0)
        for name, rows in (("q_proj", cfg.heads), ("k_proj", cfg.kv_heads), ("v_proj", cfg.kv_heads)):
            setattr(self.self_attn, name, nn.Linear(2 * h, rows * cfg.head_dim, bias=False))  # the 2h input
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=cfg.rms_eps)
        self.mlp = LlamaMLP(llama)
        self.norm = LlamaRMSNorm(h, eps=cfg.rms_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab, bias=False)
        self.rotary = LlamaRotaryEmbedding(llama)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long))  # target id = i + d2t[i]
        self.__dict__["embed"] = embed  # the target's (or the checkpoint's): not the head's to move or save

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def forward(self, g: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """g: (T, 3H) target features or (T, h) a parent's output; ids, positions: (T,) long;
        mask: (1, 1, T, S + T) additive float over the cache and the new entries. Appends the T
        entries to ``cache``; returns ``out`` (T, h), fed to children, and (T, Vd) float32 logits."""
        device = self.device
        g = g.to(device, self.dtype)
        if g.shape[-1] != self.cfg.hidden:  # the target's features (EAGLE's own test: by width)
            g = self.fc(g)  # (T, h)
        table = self.embed.weight
        embeds = self.input_layernorm(self.embed(ids.to(table.device)).to(device, self.dtype))  # (T, h)
        normed = self.hidden_norm(g)
        residual = normed if self.cfg.norm_before_residual else g
        x = torch.cat([embeds, normed], dim=-1)[None]  # (1, T, 2h)
        cos_sin = self.rotary(x, positions.to(device)[None])
        attn, _ = self.self_attn(x, cos_sin, attention_mask=mask.to(device, self.dtype), past_key_values=cache)
        h1 = residual + attn[0]  # (T, h)
        out = h1 + self.mlp(self.post_attention_layernorm(h1))
        return out, self.lm_head(self.norm(out)).float()


def head_state(raw: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors under ``Eagle3Head``'s names (``midlayer.`` / ``layers.0.`` dropped)."""
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    state = {}
    for name, tensor in raw.items():
        if name.startswith(prefix):
            state[name[len(prefix):]] = tensor
        elif name in ("fc.weight", "norm.weight", "lm_head.weight", "d2t", "embed_tokens.weight"):
            state[name] = tensor
    return state


def checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the head's checkpoint (safetensors, else a torch pickle of tensors only)."""
    files = sorted(path.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        out: dict[str, torch.Tensor] = {}
        for f in files:
            out.update(load_file(str(f)))
        return out
    bin_file = path / "pytorch_model.bin"
    if bin_file.is_file():
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise ModelLoadError(f"{path}: an EAGLE-3 config but no model.safetensors or pytorch_model.bin beside it")


def load_head(path: str | Path, target: nn.Module, dtype: torch.dtype, device: torch.device) -> Eagle3Head:
    """The EAGLE-3 head at ``path`` on ``target`` (ModelLoadError if it does not fit the target:
    its feature width, vocabulary or feature layers)."""
    path = Path(path)
    cfg = read_head_config(path)
    if cfg is None:
        raise ModelLoadError(f"{path} is not an EAGLE-3 head (no draft_vocab_size or speculators_model_type eagle3)")
    tcfg = target.config
    layers = int(tcfg.num_hidden_layers)
    problems = []
    if cfg.target_hidden != tcfg.hidden_size:
        problems.append(f"it reads {cfg.target_hidden}-wide features, the target is {tcfg.hidden_size} wide")
    target_rows = target.get_input_embeddings().weight.shape[0]
    if cfg.vocab != target_rows and cfg.vocab != tcfg.vocab_size:
        problems.append(f"its vocabulary has {cfg.vocab} ids, the target's {tcfg.vocab_size}")
    if any(not 0 < i < layers for i in cfg.layers_for(layers)):
        problems.append(f"it reads layers {cfg.layers_for(layers)}, the target has {layers}")
    raw = checkpoint_tensors(path)
    state = head_state(raw, cfg.layout)
    own_embed = state.pop("embed_tokens.weight", None)
    if own_embed is None and cfg.hidden != tcfg.hidden_size:
        problems.append(f"it is {cfg.hidden} wide and brings no embedding; the target's is {tcfg.hidden_size} wide")
    if problems:
        raise ModelLoadError(f"the EAGLE-3 head {path} does not fit this target: " + "; ".join(problems))
    embed: nn.Module = target.get_input_embeddings()
    if own_embed is not None:
        embed = nn.Embedding.from_pretrained(own_embed.to(device, dtype), freeze=True)
    head = Eagle3Head(cfg, embed)
    missing, unexpected = head.load_state_dict({**state}, strict=False)
    identity = cfg.draft_vocab == cfg.vocab  # speculators writes no d2t then: the ids are the target's
    missing = [m for m in missing if not m.startswith(("embed.", "rotary.")) and not (m == "d2t" and identity)]
    if missing or unexpected:
        raise ModelLoadError(f"the EAGLE-3 head {path} ({cfg.layout} layout): missing {missing}, "
                             f"unexpected {unexpected}")
    if "d2t" not in state and cfg.draft_vocab != cfg.vocab:
        raise ModelLoadError(f"the EAGLE-3 head {path} drafts over {cfg.draft_vocab} ids but has no d2t map")
    head.talon_name = str(path)  # type: ignore[assignment]
    logger.info("EAGLE-3 head %s (%s layout) reads the target's hidden states %s: %s", path, cfg.layout,
                cfg.layers_for(layers), cfg.aux_rule)
    return head.to(device=device, dtype=dtype).eval()


def is_head(model: Any) -> bool:
    """Is ``model`` an EAGLE-3 head (the pair's draft slot may hold one)?"""
    return isinstance(model, Eagle3Head)


def fetch_head(repo_id: str) -> Path | None:
    """The Hub repository ``repo_id`` fetched to the local cache if its ``config.json`` is an
    EAGLE-3 head's, else None (the model loader then loads it as a model, or says why not)."""
    try:  # its config first, the weights only if it is a head
        from huggingface_hub import hf_hub_download, snapshot_download

        config = Path(hf_hub_download(repo_id, "config.json"))
        if read_head_config(config.parent) is None:
            return None
        return Path(snapshot_download(repo_id, allow_patterns=["config.json", "*.safetensors", "*.bin"]))
    except Exception:  # noqa: BLE001 - offline or not a repo: the model loader says why
        return None
