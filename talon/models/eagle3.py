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

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

from talon.models.base import ModelLoadError
from talon.models.head_config import HeadConfig, read_head_config

logger = logging.getLogger(__name__)


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

    @property
    def feature_width(self) -> int:
        """The width of the target features it reads: three layers' hidden states."""
        return 3 * self.cfg.target_hidden

    @property
    def vocab(self) -> int:
        return self.cfg.vocab

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


def load_head(path: str | Path, target: nn.Module, dtype: torch.dtype, device: torch.device,
              aux_layers: tuple[int, ...] = ()) -> Eagle3Head:
    """The EAGLE-3 head at ``path`` on ``target`` (ModelLoadError if it does not fit the target:
    its feature width, vocabulary or feature layers). ``aux_layers``: the target's hidden states
    it reads (HF indices), over what its config says (``--aux-layers``)."""
    path = Path(path)
    cfg = read_head_config(path)
    if cfg is None:
        raise ModelLoadError(f"{path} is not an EAGLE-3 head (no draft_vocab_size or speculators_model_type eagle3)")
    if aux_layers:
        cfg = cfg.overridden(aux_layers)
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
