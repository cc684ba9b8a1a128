"""Load one model, or the target/draft pair, from a spec: an embedded name, a local checkpoint
directory, a ``.gguf`` file or a Hub id.

A spec is first resolved to a local directory where it can be (converting GGUF as needed);
only a Hub id goes to the Hub, and offline, or with the Hub unreachable, only the local Hugging
Face cache is consulted, so a missing model fails at once. Every failure a user can fix is a
``ModelLoadError`` that says what to do.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

import torch
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from talon.models import zerogpu
from talon.models.base import LoadedModel, ModelLoadError
from talon.models.cache import resolve_cache_dir
from talon.models.convert import prepare_gguf_file
from talon.models.device import resolve_device, resolve_dtype
from talon.models.eagle3 import fetch_head, load_head
from talon.models.embedded import EMBEDDED_MODELS, prepare_embedded, source_gguf
from talon.models.gguf_blocks import Q4KSource
from talon.models.head_config import read_head_config
from talon.models.prepack import prepack as prepack_linears
from talon.models.prepack import should_prepack
from talon.models.quant import quantize_draft, quantize_target, resolve_draft_quant, resolve_target_weights
from talon.models.tokenizer_check import check_tokenizers_match
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, NO_DRAFT, hub_endpoint, hub_offline

logger = logging.getLogger(__name__)

EMBEDDED_PREFIX = "embedded:"
_HINT = (
    f"Pass a local checkpoint directory or a .gguf file instead, or use the embedded offline pair "
    f"(target {EMBEDDED_TARGET!r}, draft {EMBEDDED_DRAFT!r})."
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


# ---------------------------------------------------------------------------------------------
# Resolving a spec to something from_pretrained can load
# ---------------------------------------------------------------------------------------------


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", ".", "~")) or spec.endswith(".gguf") or not _HUB_ID.match(spec)


def _local_checkpoint(spec: str, cache_dir: Path) -> str | None:
    """A local directory for ``spec`` (converting GGUF as needed), or None if it is a Hub id."""
    if spec.startswith(EMBEDDED_PREFIX):
        if spec not in EMBEDDED_MODELS:
            raise ModelLoadError(
                f"Unknown embedded model {spec!r}; the embedded models are {sorted(EMBEDDED_MODELS)}."
            )
        return str(prepare_embedded(EMBEDDED_MODELS[spec], cache_dir))
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(prepare_gguf_file(path, cache_dir))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{spec!r} is a directory but not a Hugging Face checkpoint (no config.json). {_HINT}"
            )
        return str(path.resolve())
    if path.exists():
        raise ModelLoadError(
            f"{spec!r} is a file but not a .gguf file; pass its checkpoint directory instead."
        )
    if _looks_like_path(spec):
        raise ModelLoadError(
            f"Local path {spec!r} does not exist (resolved to {path.resolve()}). {_HINT}"
        )
    return None


def _head_checkpoint(spec: str) -> Path | None:
    """The local directory of the EAGLE-3 head ``spec`` names (a directory, or a Hub id fetched
    when the Hub is reachable), or None where ``spec`` is not a head."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path if read_head_config(path) is not None else None
    if spec.startswith(EMBEDDED_PREFIX) or _looks_like_path(spec) or _offline_reason() is not None:
        return None
    return fetch_head(spec)


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """A quick TCP check of the Hub endpoint, so an offline machine fails now, not after retries."""
    url = urlparse(hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _load_error(
    spec: str, local: str | None, error: Exception, offline_reason: str | None
) -> ModelLoadError:
    """Turn a from_pretrained failure into an actionable message."""
    text = str(error)
    if "trust_remote_code" in text:
        return ModelLoadError(
            f"{spec!r} needs to run its own modelling code. If you trust it, allow it with "
            "TALON_ALLOW_REMOTE_CODE=1 (allow_remote_code=True)."
        )
    if local is not None:
        return ModelLoadError(f"Cannot load the checkpoint in {local}: {text.strip()[:400]}")
    if offline_reason is not None:
        return ModelLoadError(
            f"Cannot load {spec!r}: the Hugging Face Hub is {offline_reason}, and {spec!r} is not in "
            f"the local Hugging Face cache. {_HINT}"
        )
    if isinstance(error, RepositoryNotFoundError) or "not a valid model identifier" in text:
        return ModelLoadError(
            f"{spec!r} is not a model id on the Hugging Face Hub (or it is private or gated: log in "
            f"with `hf auth login`). {_HINT}"
        )
    return ModelLoadError(
        f"Cannot load {spec!r} from the Hugging Face Hub: {text.strip()[:400]} {_HINT}"
    )


def _offline_reason() -> str | None:
    if hub_offline():
        return "switched off (HF_HUB_OFFLINE=1 or TRANSFORMERS_OFFLINE=1)"
    if not _hub_reachable():
        return f"unreachable from this machine ({hub_endpoint()})"
    return None


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def device_map(device: torch.device, spread: bool) -> str | dict[str, torch.device]:
    """Where a model's weights go. One device, except a model allowed to ``spread`` (the target)
    on a machine with several GPUs and device "cuda": accelerate's "auto" placement, so a target
    larger than one GPU spreads over all of them. The draft always stays whole on one device (a
    split draft would pay a device hop per drafting layer for nothing). The verifier feeds inputs
    to ``model.device`` and applies the LM head where its weight lives (``verify.lm_logits``)."""
    if spread and device.type == "cuda" and device.index is None and torch.cuda.device_count() > 1:
        return "auto"
    if device.type == "cuda" and device.index is None:
        return {"": torch.device("cuda", 0)}
    return {"": device}


def _from_pretrained(
    name: str, dtype: torch.dtype, device: torch.device, allow_remote_code: bool, local_only: bool, spread: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = AutoTokenizer.from_pretrained(
        name, trust_remote_code=allow_remote_code, local_files_only=local_only
    )
    # On ZeroGPU, weights load on the CPU and move with .to("cuda"), which ZeroGPU records on the
    # main thread and replays in its GPU worker (an accelerate device map would touch CUDA itself).
    to_cuda_later = device.type == "cuda" and zerogpu.active()
    model = AutoModelForCausalLM.from_pretrained(
        name,
        dtype=dtype,
        device_map={"": torch.device("cpu")} if to_cuda_later else device_map(device, spread),
        attn_implementation="sdpa",
        trust_remote_code=allow_remote_code,
        local_files_only=local_only,
    )
    if to_cuda_later:
        model = model.to(device)
    return model.eval(), tokenizer


def load_model(
    spec: str,
    dtype: str = "auto",
    device: str = "auto",
    allow_remote_code: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    spread: bool = False,
) -> LoadedModel:
    """Load one model from an embedded name, a local directory, a .gguf file or a Hub id
    (``spread``: may spread over several GPUs, see :func:`device_map`)."""
    spec = spec.strip()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    start = time.perf_counter()
    local = _local_checkpoint(spec, resolve_cache_dir(cache_dir))
    offline_reason = None if local is not None else _offline_reason()
    try:
        model, tokenizer = _from_pretrained(
            local or spec, torch_dtype, torch_device, allow_remote_code, offline_reason is not None, spread
        )
    except (OSError, ValueError, HfHubHTTPError) as error:
        raise _load_error(spec, local, error, offline_reason) from error
    logger.info(
        "Loaded %s (%s, %s) in %.1f s", spec, torch_dtype, torch_device, time.perf_counter() - start
    )
    return LoadedModel(model, tokenizer, local or spec, torch_dtype, torch_device)


def shipped_blocks(model_dir: str, cache_dir: str | os.PathLike[str] | None) -> Q4KSource | None:
    """The Q4_K blocks ``model_dir`` was converted from (an embedded model's GGUF), if any."""
    gguf = source_gguf(model_dir, resolve_cache_dir(cache_dir)) if Path(model_dir).is_dir() else None
    return None if gguf is None else Q4KSource(gguf)


def load_pair(
    target: str,
    draft: str | None,
    dtype: str = "auto",
    device: str = "auto",
    allow_remote_code: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    draft_quant: str = "none",
    target_weights: str = "dense",
    prepack: bool | None = None,
    aux_layers: tuple[int, ...] = (),
) -> tuple[LoadedModel, LoadedModel | None]:
    """Load the target and (unless ``draft`` is None or "none") a draft sharing its tokenizer.
    ``draft_quant``: none, int8 or auto (int8 on a CPU). ``target_weights``: dense (``dtype`` as
    asked; auto is the same) or int4 (packed from float32 weights, bf16 activations; CPU; an
    embedded model keeps its own Q4_K blocks; int8 is refused: not lossless on a real model):
    the packed module is the target, so the output stays its own greedy ``generate``.
    ``prepack``: float32 weights on a CPU (a dense target, a draft not in int8) laid out once for
    oneDNN (:mod:`talon.models.prepack`): the same weights, faster trees on some hosts; None (auto)
    where this host's timed check says it pays. ``aux_layers``: the hidden states an EAGLE-3 head
    draft reads, over its config's ids (``--aux-layers``; refused for any other draft)."""
    head = None if draft is None or draft.strip().lower() in NO_DRAFT else _head_checkpoint(draft.strip())
    if aux_layers and head is None:  # before any weight loads
        raise ModelLoadError(f"--aux-layers names the target's hidden states an EAGLE-3 head reads; the draft {draft} "
                             "is not an EAGLE-3 head")
    weights = "dense" if target_weights == "dense" else resolve_target_weights(target_weights, resolve_device(device))
    if weights == "dense":  # auto resolves here too
        target_lm = load_model(target, dtype, device, allow_remote_code, cache_dir, spread=True)
        if should_prepack(target_lm.model, prepack):
            prepack_linears(target_lm.model)
            own_weights(target_lm.model)
    else:
        dense = load_model(target, "float32", device, allow_remote_code, cache_dir)
        # bf16 activations: the int4 kernel's fast path (float32 runs 10x slower)
        target_lm = quantize_target(dense, weights, torch.bfloat16, blocks=shipped_blocks(dense.name, cache_dir))
        own_weights(target_lm.model)
    if draft is None or draft.strip().lower() in NO_DRAFT:
        return target_lm, None
    if head is not None:  # an EAGLE-3 head: it drafts on the target's features, in the target's dtype
        start = time.perf_counter()
        module = load_head(head, target_lm.model, target_lm.dtype, target_lm.device, aux_layers)
        logger.info("Loaded the EAGLE-3 head %s (%s layout) in %.1f s", head, module.cfg.layout,
                    time.perf_counter() - start)
        return target_lm, LoadedModel(module, target_lm.tokenizer, str(head), target_lm.dtype, target_lm.device)
    quant = resolve_draft_quant(draft_quant, target_lm.device)
    draft_dtype = "float32" if quant == "int8" else dtype
    draft_lm = load_model(draft, draft_dtype, device, allow_remote_code, cache_dir)
    check_tokenizers_match(target_lm.tokenizer, draft_lm.tokenizer, target, draft)
    if quant == "int8":
        draft_lm = quantize_draft(draft_lm)
        own_weights(draft_lm.model)
        return target_lm, draft_lm
    if should_prepack(draft_lm.model, prepack):
        prepack_linears(draft_lm.model)
        own_weights(draft_lm.model)
    return target_lm, draft_lm


def own_weights(model: torch.nn.Module) -> None:
    """Copy what a prepacked or quantized CPU model still reads from its checkpoint (embeddings,
    norms, the head) into memory of its own. transformers maps a safetensors file into memory, and
    the whole mapping stays resident while any tensor views it, though the layers that were
    replaced read it no more: 7.5 GB for the embedded pair in float32, beside its packed copies."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.device.type == "cpu":
                tensor.data = tensor.data.clone()
