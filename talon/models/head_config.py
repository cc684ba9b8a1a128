"""An EAGLE-3 head's shape, read from its ``config.json`` and its tensor names alone: which target
layers it reads (``read_feature_layers``, as each serving engine reads the ids), and the options
Talon refuses before any weight loads. No torch at import: the app's preset policy asks whether a
directory holds a head (``talon.server.policy.holds_head``). The head itself: ``talon.models.eagle3``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from talon.models.base import ModelLoadError

if TYPE_CHECKING:
    from transformers import LlamaConfig


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
        from transformers import LlamaConfig  # (building the head, not reading its shape)

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

    def overridden(self, aux_layers: tuple[int, ...]) -> HeadConfig:
        """This config reading ``aux_layers`` (HF hidden-state indices) whatever its own ids say
        (``--aux-layers``)."""
        return dataclasses.replace(self, aux_layers=tuple(aux_layers),
                                   aux_rule=f"--aux-layers {','.join(map(str, aux_layers))} (HF hidden-state indices)")

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
    embedding, i the output of layer i - 1), as the head's trainer captured them:

    * top-level ``eagle_aux_hidden_state_layer_ids`` (speculators, vLLM): the index as written.
      vLLM 0.33.0 captures the residual stream entering layer i (``models/llama.py`` with
      ``interfaces.py``'s ``_maybe_add_hidden_state``), and speculators trains on vLLM's capture.
    * nested ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SpecForge): "the output of layer
      i", read as i + 1. SpecForge (sgl-project/SpecForge a6b6b02) captures
      ``hidden_states[i + 1]`` for id i (its ``set_capture_layers`` hands the ids to SGLang, whose
      Llama and Qwen models capture before layer i + 1: ``layers_to_capture = [val + 1 ...]`` in
      ``srt/models/llama.py``, sglang 0.5.23). SpecForge never writes the key itself: an exported
      config carries it only where the draft config it trained from did (its default, where
      absent, is ``[1, N//2-1, N-4]``, the hidden states 2, N//2, N-3).
    * none: 2, N//2 and N-3, every engine's default.

    Where an engine reads them otherwise (vLLM's runner takes nested ids as written, a layer
    early; SGLang's DeepSeek-V2 and GLM-4-MoE-Lite models add 1 only to a list starting at 1),
    ``--aux-layers`` sets the indices outright (``HeadConfig.overridden``)."""
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    if top:
        return tuple(int(i) for i in top), "top-level ids, as written (speculators, vLLM)"
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if nested:
        return tuple(int(i) + 1 for i in nested), "eagle_config ids as layer outputs, each + 1 (SpecForge, SGLang)"
    return None, "none written: 2, N//2, N-3 (every engine's default)"


def specforge_ids_note(head: str) -> list[str]:
    """What vLLM makes of a local head whose config names its layers only in SpecForge's numbering
    (nested ``eagle_config`` ids, "the output of layer i"; ``read_feature_layers``): a note, or none."""
    try:
        raw = json.loads((Path(head) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") if isinstance(raw, dict) else None
    if not nested or raw.get("eagle_aux_hidden_state_layer_ids"):
        return []
    ids = [int(i) for i in nested]
    return [f"the head names its layers in SpecForge's numbering (eagle_config ids {ids}: the output of layer i), "
            "which SGLang reads so; vLLM 0.33 reads them as written, a layer early: before serving it with vLLM, "
            f"add \"eagle_aux_hidden_state_layer_ids\": {[i + 1 for i in ids]} at the top level of its config.json"]


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
        import torch  # only for a pickled checkpoint: reading a head's config imports no torch

        names = list(torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True, mmap=True))
    return names
