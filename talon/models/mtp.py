"""Multi-token-prediction (MTP) layers: the drafter a model ships inside its own checkpoint, and loading it.

DeepSeek-V3/R1, GLM-4.5/4.7, Mellum2, MiMo and others train one or more MTP layers beside the
model (``num_nextn_predict_layers``). transformers 5 builds them as ``MtpModel``: per layer an
``MtpLayer`` over the target's own decoder-layer class, sharing the target's embedding, LM head
and rotary embedding. One MTP step, as ``MtpLayer.forward`` computes it::

    x   = eh_proj(cat(enorm(embed(token_{t+1})), hnorm(h_t)))      (2H -> H; embedding first,
                                                                      hidden first where the config
                                                                      says mtp_hidden_states_first)
    out = post_norm(block(x, position t + 1))                        (the target's layer class)
    logits = lm_head(out)                                            (the target's own head)

``h_t`` is the target's last hidden state at position t (after its final norm: transformers'
``hidden_states[-1]``, HF ``output_hidden_states`` index N), so the pair (h_t, token t + 1)
predicts token t + 2, at position id t + 1, one ahead of an EAGLE-3 head's pairing. A deeper draft
level feeds a parent's ``out`` as ``h`` with its own token (``talon.drafters.mtp.MtpSource``).

Loading (``load_mtp``) reads only the MTP tensors of the target's own checkpoint, in its family's
naming, and maps them onto ``MtpModel`` with transformers' own conversion mapping:

* DeepSeek-V3, GLM-4-MoE and GLM-4-MoE-Lite (GLM-4.7-Flash): ``model.layers.{N + k}.*`` (N the
  target's layer count; the block's tensors beside ``enorm``, ``hnorm``, ``eh_proj`` and
  ``shared_head.norm``);
* Mellum and Qwen3.5: ``mtp.*`` (``mtp.fc``, ``mtp.pre_fc_norm_embedding``,
  ``mtp.pre_fc_norm_hidden``, ``mtp.norm`` and ``mtp.layers.0.*``).

``mtp_refusal`` says, from the config and the checkpoint's tensor names alone (before any weight
loads), why a target cannot draft with its MTP: no MTP weights, or layers that are linear or
recurrent (Qwen3.5/3.6's Gated DeltaNet, Qwen3-Next): tree verification keeps one state per
branch, which a recurrent layer does not have (docs/design.md).
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel

from talon.models.base import ModelLoadError

logger = logging.getLogger(__name__)

ATTENTION_TYPES = ("full_attention", "sliding_attention")  # the layer types a tree's 4D mask serves
MTP_PREFIX = "mtp."  # Mellum and Qwen3.5 keep their MTP tensors under it
SHARED = ("embed_tokens.", "shared_head.", "rotary_emb.")  # MtpModel's modules that are the target's own


def mtp_layer_count(config: PretrainedConfig) -> int:
    """How many MTP layers ``config`` declares (``num_nextn_predict_layers``; 0: none)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    count = getattr(text, "num_mtp_layers", None)
    if count is None:
        count = getattr(text, "num_nextn_predict_layers", None)
    return int(count or 0)


def declare_mtp_layers(config: PretrainedConfig) -> None:
    """Give a config that declares its MTP layers only as its checkpoint does (GLM-4-MoE-Lite's
    ``num_nextn_predict_layers``, which transformers 5.23 does not map) the fields transformers'
    ``MtpModel`` reads: ``num_mtp_layers`` and, beside per-layer MLP types, the MTP layers' own
    (a routed MoE: transformers builds every MTP layer so). A config that has them is left alone."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    count = mtp_layer_count(config)
    if getattr(text, "num_mtp_layers", None) is None:
        text.num_mtp_layers = count
    if getattr(text, "mlp_layer_types", None) is not None and getattr(text, "mtp_mlp_layer_types", None) is None:
        text.mtp_mlp_layer_types = ["sparse"] * count


def is_mtp_key(name: str, layers: int, mtp_layers: int) -> bool:
    """Is checkpoint tensor ``name`` one of the MTP layers' (either family's naming)?"""
    if name.startswith(MTP_PREFIX):
        return True
    found = re.match(r"model\.layers\.(\d+)\.", name)
    return found is not None and layers <= int(found.group(1)) < layers + mtp_layers


def mtp_refusal(config: PretrainedConfig, tensor_names: list[str] | None) -> str | None:
    """Why this target cannot draft with its own MTP layers, in one line (None: it can).
    ``tensor_names``: the checkpoint's tensor names (None: not known, not checked)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kind = getattr(config, "model_type", type(config).__name__)
    types = [*(getattr(text, "layer_types", None) or []), *(getattr(text, "mtp_layer_types", None) or [])]
    recurrent = sorted({t for t in types if t not in ATTENTION_TYPES})
    if recurrent:
        return (f"{kind} has {', '.join(recurrent)} layers: a draft tree needs one state per branch, which a "
                "recurrent layer does not keep; Talon verifies trees on attention-only targets")
    if "sliding_attention" in (getattr(text, "layer_types", None) or []):
        return (f"{kind} has sliding-window layers: Talon's verifier gives every target layer one tree mask, "
                "so a sliding layer would see past its window; only its MTP layer may slide")
    count = mtp_layer_count(config)
    if count < 1:
        return f"{kind}'s config declares no MTP layers (num_nextn_predict_layers): use another drafter"
    if tensor_names is not None:
        layers = int(text.num_hidden_layers)
        if not any(is_mtp_key(n, layers, count) for n in tensor_names):
            return (f"the checkpoint holds no MTP weights (no model.layers.{layers}.* or mtp.* tensors): it was "
                    "published without its MTP layers; use another drafter")
    return None


def checkpoint_tensor_names(path: Path) -> list[str] | None:
    """The tensor names of the safetensors checkpoint in directory ``path`` (its index, else each
    file's header); None where it has none."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return list(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    from safetensors import safe_open

    names: list[str] = []
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            names.extend(handle.keys())
    return names


def check_mtp_target(path: str | Path) -> None:
    """Refuse (ModelLoadError, one line) a checkpoint directory whose target cannot draft with its
    MTP: read before any weight loads."""
    from transformers import AutoConfig

    path = Path(path)
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"{path}: no readable config.json for an MTP target ({error})") from error
    reason = mtp_refusal(config, checkpoint_tensor_names(path))
    if reason is not None:
        raise ModelLoadError(f"--drafter mtp: {reason}")


class MtpLayers(nn.Module):
    """A target's MTP layers (transformers' ``MtpModel``) as a draft module: one forward of tree
    nodes on a KV cache of its own under a 4D mask, through any one of its layers (which layer
    drafts which depth is the source's rule: ``talon.drafters.mtp``)."""

    def __init__(self, mtp: nn.Module, target: PreTrainedModel) -> None:
        super().__init__()
        self.mtp = mtp
        text = target.config.get_text_config()
        self.feature_width = int(text.hidden_size)
        self.vocab = int(target.get_input_embeddings().weight.shape[0])
        self.layers = len(mtp.layers)
        self.feature_layers = (int(text.num_hidden_layers),)  # hidden_states[N]: the last, after the final norm
        mtp_types = getattr(mtp.config, "layer_types", None) or ["full_attention"] * self.layers
        window = getattr(mtp.config, "sliding_window", None)
        # per MTP layer: its sliding window (0: full attention)
        self.windows = tuple(int(window) if window and kind == "sliding_attention" else 0 for kind in mtp_types)
        self.window = self.windows[0]
        self.talon_name = "mtp"

    @property
    def device(self) -> torch.device:
        return self.mtp.layers[0].eh_proj.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.mtp.layers[0].eh_proj.weight.dtype

    def forward(self, g: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
                mask: torch.Tensor, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """g: (T, H) the target's last hidden states, or parents' outputs; ids, positions: (T,) long
        (each pair's next token, at that token's position); mask: (1, 1, T, S + T) additive over
        layer ``layer``'s cache entries and the new ones. MTP layer ``layer`` drafts (0 unless a
        source chains layer k at depth k + 1); appends T entries to that layer's part of ``cache``
        (its block's own layer index); returns ``out`` (T, H), fed to children, and (T, V) float32 logits."""
        device = self.device
        embeds = self.mtp.embed_tokens(ids.to(self.mtp.embed_tokens.weight.device)[None]).to(device, self.dtype)
        pos = positions.to(device)[None]  # (1, T)
        rope: dict[str, Any] = {}
        if self.mtp.has_per_layer_rope:
            rope["layer_type"] = self.mtp.config.layer_types[layer]
        cos_sin = self.mtp.rotary_emb(embeds, position_ids=pos, **rope) if self.mtp.rotary_emb is not None else None
        out = self.mtp.layers[layer](embeds, g.to(device, self.dtype)[None], position_embeddings=cos_sin,
                                     attention_mask=mask.to(device, self.dtype), position_ids=pos,
                                     past_key_values=cache)
        if self.mtp.use_shared_post_norm:
            out = self.mtp.shared_post_norm(out)
        return out[0], self.logits(out[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(T, H) -> (T, V) float32: the target's head as the target applies it (a muP width
        multiplier, a padded vocabulary cut to its real size), as ``MtpModel`` projects."""
        config = self.mtp.config
        multiplier = getattr(config, "logits_mup_width_multiplier", None)
        logits = self.mtp.shared_head(hidden / multiplier if multiplier is not None else hidden)
        unpadded = getattr(config, "unpadded_vocab_size", None)
        return (logits[..., :unpadded] if unpadded is not None else logits).float()


def is_mtp(model: Any) -> bool:
    """Is ``model`` a target's MTP layers (``MtpLayers``)?"""
    return isinstance(model, MtpLayers)


def mtp_tensors(path: Path, layers: int, mtp_layers: int) -> dict[str, Any]:
    """The MTP tensors of the checkpoint in ``path``, as lazy slices (nothing else is read)."""
    from safetensors import safe_open

    found: dict[str, Any] = {}
    for file in sorted(path.glob("*.safetensors")):
        handle = safe_open(str(file), framework="pt", device="cpu")
        for name in handle.keys():
            if is_mtp_key(name, layers, mtp_layers):
                found[name] = handle.get_slice(name)
    return found


def load_mtp(target: PreTrainedModel, path: str | Path) -> MtpLayers:
    """The MTP layers of ``target``'s checkpoint directory ``path``, on the target's last layer's
    device and in its dtype (ModelLoadError, one line, where it has none or they do not fit)."""
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_layers import MtpModel
    from transformers.modeling_utils import LoadStateDictConfig

    path = Path(path)
    reason = mtp_refusal(target.config, checkpoint_tensor_names(path))
    if reason is not None:
        raise ModelLoadError(f"--drafter mtp: {reason}")
    text = target.config.get_text_config()
    count = mtp_layer_count(target.config)
    last = target.get_decoder().layers[-1]
    device = next(last.parameters()).device
    declare_mtp_layers(target.config)
    mtp = MtpModel(target, count)
    state = mtp_tensors(path, int(text.num_hidden_layers), count)
    info, _ = convert_and_load_state_dict_in_model(
        model=mtp, state_dict=state,
        load_config=LoadStateDictConfig(weight_mapping=mtp.get_weight_conversions(target),
                                        device_map={"": device}, dtype=target.dtype))
    missing = sorted(k for k in info.missing_keys if not k.startswith(SHARED))
    if missing:
        raise ModelLoadError(f"--drafter mtp: {path}'s MTP layers lack {missing[:4]} "
                             "(a checkpoint naming Talon does not read)")
    mtp.tie_with_main_model(target)
    # only its own modules move: the embedding, head and rotary are the target's (a packed head keeps its layout)
    for own in (mtp.layers, getattr(mtp, "shared_post_norm", None)):
        if own is not None:
            own.to(device=device, dtype=target.dtype)
    drafter = MtpLayers(mtp.eval(), target)
    drafter.talon_name = f"{path.name}:mtp"
    logger.info("MTP layers of %s: %d (the source picks which drafts which depth), window %s", path, count,
                drafter.window or "none")
    return drafter


def checkpoint_dir(spec: str) -> Path:
    """The local directory of checkpoint ``spec`` (a directory, or a Hub id in the local cache or
    fetched: its configs and safetensors files, which a loaded target already holds)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors"]
    try:
        return Path(snapshot_download(spec, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached yet: fetch (or say why not)
        try:
            return Path(snapshot_download(spec, allow_patterns=patterns))
        except Exception as error:  # noqa: BLE001 - offline, no such repository
            raise ModelLoadError(f"--drafter mtp: {spec} is not a local checkpoint and could not be fetched "
                                 f"({type(error).__name__})") from error


def check_mtp_spec(spec: str) -> None:
    """Refuse, in one line and before any weight loads, a target spec whose model cannot draft with
    its own MTP layers (``mtp_refusal``); the embedded pair's target has none. A Hub id is read from
    its config and its safetensors headers (``get_safetensors_metadata``: no weights fetched)."""
    if spec.strip().startswith("embedded:") or spec.strip().lower().endswith(".gguf"):
        raise ModelLoadError(f"--drafter mtp: {spec} ships no MTP layers (GGUF weights of a model without them); "
                             "give --target a checkpoint with MTP layers (docs/cli.md)")
    path = Path(spec).expanduser()
    if path.is_dir():
        check_mtp_target(path)
        return
    from huggingface_hub import get_safetensors_metadata, hf_hub_download
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(Path(hf_hub_download(spec, "config.json")).parent))
    except Exception as error:  # noqa: BLE001 - offline, no such repository
        raise ModelLoadError(f"--drafter mtp: {spec} is not a local checkpoint and its config could not be read "
                             f"({type(error).__name__})") from error
    try:
        names: list[str] | None = list(get_safetensors_metadata(spec).weight_map)
    except Exception:  # noqa: BLE001 - offline: the tensors are checked when the layers load
        names = None
    reason = mtp_refusal(config, names)
    if reason is not None:
        raise ModelLoadError(f"--drafter mtp: {reason}")
