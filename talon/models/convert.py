"""GGUF -> float32 safetensors checkpoint, once, in the cache, a tensor at a time.

A conversion is written atomically with a marker file naming its source (so a changed source
converts again), under a file lock (so only one process converts a given model at a time).
A user's ``.gguf`` file is cached by path, size and mtime.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from talon.models.base import ModelLoadError
from talon.models.cache import MARKER_FILE, conversion_lock, is_converted

logger = logging.getLogger(__name__)

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


@contextlib.contextmanager
def _one_parse_per_file() -> Iterator[None]:
    """Within the block (a conversion), a GGUF file is parsed once however often it is opened.

    A conversion reads the file's metadata three times (config, tokenizer, the weights' names)
    through transformers' ``load_gguf_checkpoint``, which opens a ``GGUFReader`` (it parses every
    metadata field, the 150k-entry vocabulary and merges included, element by element: 7 s on a
    2-core AMD EPYC) and turns its fields into Python values (1.5 s). A reader is read-only once
    built, so they all share one; the metadata is parsed once and each caller gets its own copy.
    Mapping the weights' names builds gguf's read-only ``TensorNameMap`` once per module (319
    times for the 1.5B target, 3.2 s): built once here.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original, original_load, original_map = gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], gguf.GGUFReader] = {}
    parsed: dict[str, dict] = {}

    def shared_reader(path: str | os.PathLike[str], mode: str = "r") -> gguf.GGUFReader:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    def metadata_once(path: str | os.PathLike[str], return_tensors: bool = False, **kwargs: object) -> dict:
        if return_tensors or kwargs:
            return original_load(path, return_tensors, **kwargs)
        key = os.fspath(path)
        if key not in parsed:
            parsed[key] = original_load(path, False)
        return copy.deepcopy(parsed[key])

    gguf.GGUFReader = shared_reader  # transformers imports all three at each call
    gguf_utils.load_gguf_checkpoint = metadata_once
    gguf.get_tensor_name_map = functools.cache(original_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf_utils.load_gguf_checkpoint = original, original_load
        gguf.get_tensor_name_map = original_map


SHARD_BYTES = 1 << 30  # a converted checkpoint's safetensors shard holds at most this much


def _load_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The GGUF file's model, its parameters on the meta device (the weights stream from the file
    in ``_write_weights``), and its tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    return model, tokenizer


class _Shards:
    """float32 tensors written as safetensors shards of at most ``SHARD_BYTES`` as they come, then
    named ``model-0000i-of-0000n.safetensors`` beside their index, as ``save_pretrained`` names them."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[list[str]] = []  # the tensor names of each written shard
        self.names: set[str] = set()
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.names:
            raise ModelLoadError(f"The GGUF file maps two tensors onto {name}")
        self.names.add(name)
        self.pending[name] = tensor.to(torch.float32).contiguous()
        self.pending_bytes += self.pending[name].nbytes
        if self.pending_bytes >= SHARD_BYTES:
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save_file

        if self.pending:
            save_file(self.pending, str(self.out_dir / f".shard-{len(self.files)}"), metadata={"format": "pt"})
            self.total += self.pending_bytes
            self.files.append(list(self.pending))
            self.pending, self.pending_bytes = {}, 0

    def close(self) -> set[str]:
        """Write the last shard, name the shards and write the index; the names written."""
        self.flush()
        weight_map: dict[str, str] = {}
        for i, names in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{len(self.files):05d}.safetensors"
            (self.out_dir / f".shard-{i}").rename(self.out_dir / final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {"total_size": self.total}, "weight_map": dict(sorted(weight_map.items()))}
        (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        return self.names


def _write_weights(gguf_path: Path, model: PreTrainedModel, out_dir: Path) -> None:
    """Dequantize the file's tensors one at a time into float32 shards in ``out_dir``, renamed and
    reshaped by transformers' own GGUF tensor processors (the steps of its
    ``load_gguf_checkpoint``, which holds every tensor at once): a conversion's memory is one
    shard's, not the model's (the 1.5B target's 7.1 GB of float32 weights)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        read_field,
    )

    parsed = gguf_utils.load_gguf_checkpoint(str(gguf_path), return_tensors=False)  # the conversion's one parse
    reader = gguf.GGUFReader(gguf_path)
    parsed["tensors"] = {}  # where some processors (mixtures of experts) gather their tensors
    architecture = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    names = get_gguf_hf_weights_map(model, processor)
    shards = _Shards(out_dir)
    for tensor in reader.tensors:
        result = processor.process(weights=gguf.dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=names, parsed_parameters=parsed)
        if result.name in names:
            shards.add(names[result.name], torch.from_numpy(np.array(result.weights, dtype=np.float32)))
    for name, gathered in parsed["tensors"].items():
        shards.add(name, gathered)
    written = shards.close()
    missing = {name for name, _ in model.named_parameters()} - written  # a tied head is named once, as the embedding
    if missing:
        raise ModelLoadError(f"{gguf_path.name} holds no weights for {', '.join(sorted(missing)[:5])}")


def _check_saved_tokenizer(saved_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """The saved tokenizer must come back with the same chat template and eos token."""
    reloaded = AutoTokenizer.from_pretrained(saved_dir)
    if reloaded.chat_template != tokenizer.chat_template or reloaded.eos_token != tokenizer.eos_token:
        raise ModelLoadError(
            f"The tokenizer saved to {saved_dir} lost its chat template or eos token "
            f"(transformers {transformers.__version__}); this is a bug, please report it."
        )


def _save_atomically(
    gguf_path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path,
    marker: dict[str, object], start: float,
) -> None:
    """Write the weights, config, tokenizer and (last) the marker, with the seconds since
    ``start``, into a temporary sibling, then rename it.

    ``out_dir`` therefore either holds a complete checkpoint with its marker or does not exist.
    """
    tmp_dir = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    try:
        tmp_dir.mkdir(parents=True)
        _write_weights(gguf_path, model, tmp_dir)
        model.config.architectures = [type(model).__name__]  # as save_pretrained records it
        model.config.save_pretrained(tmp_dir)
        model.generation_config.save_pretrained(tmp_dir)
        tokenizer.save_pretrained(tmp_dir)
        _check_saved_tokenizer(tmp_dir, tokenizer)
        marker = {**marker, "seconds": round(time.perf_counter() - start, 1)}
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
    """Save ``gguf_path`` dequantized as a float32 safetensors checkpoint in ``out_dir``, its
    tensors streamed one at a time into shards (``_write_weights``).

    ``source_sha256`` goes into the marker file, so a later change of source triggers a new
    conversion; ``extra_eos_tokens`` are added to the generation config's stop tokens.
    """
    start = time.perf_counter()
    logger.info("Converting %s into %s (one-off; this takes a few minutes on a CPU)", gguf_path, out_dir)
    with _one_parse_per_file():
        _convert(gguf_path, out_dir, source_sha256, extra_eos_tokens, start)
    logger.info("Converted %s in %.1f s", gguf_path.name, time.perf_counter() - start)
    return out_dir


def _convert(gguf_path: Path, out_dir: Path, source_sha256: str, extra_eos_tokens: Sequence[str],
             start: float) -> None:
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
    marker = {"source": gguf_path.name, "source_sha256": source_sha256, "transformers": transformers.__version__}
    _save_atomically(gguf_path, model, tokenizer, out_dir, marker, start)


def prepare_gguf_file(gguf_path: Path, cache_dir: Path) -> Path:
    """A user's .gguf file, converted once into the cache (keyed by path, size and mtime)."""
    stat = gguf_path.stat()
    source_key = hashlib.sha256(
        f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()
    out_dir = cache_dir / "gguf" / f"{gguf_path.stem}-{source_key[:12]}"
    if is_converted(out_dir, source_key):
        return out_dir
    with conversion_lock(out_dir.with_name(out_dir.name + ".lock")):
        if not is_converted(out_dir, source_key):
            convert_gguf(gguf_path, out_dir, source_key)
    return out_dir


def write_float32_gguf(source: Path, out: Path) -> Path:
    """Write ``source`` again as a GGUF file whose every tensor is float32: the same dequantized
    weights Talon's float32 checkpoint holds (transformers dequantizes with the same ``gguf``
    functions), under the same metadata, so another engine can run exactly Talon's weights.
    Written to a temporary sibling, then renamed; an existing ``out`` is kept."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, dequantize

    if out.exists():
        return out
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    writer = GGUFWriter(tmp, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes these itself
        if name == "general.file_type":
            writer.add_file_type(LlamaFileType.ALL_F32)
            continue
        vtype = field.types[0]
        writer.add_key_value(name, field.contents(), vtype,
                             sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), np.float32))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        tmp.rename(out)
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("Wrote %s (float32) from %s", out.name, source.name)
    return out
