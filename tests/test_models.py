"""Model loading: device/dtype resolution, clear errors, tokenizer checks, GGUF part assembly,
and (marked ``embedded``) the real offline model pair."""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import talon.models.convert as tm_convert
import talon.models.device as tm_device
import talon.models.embedded as tm_embedded
import talon.models.loading as tm_loading
from talon.models.base import ModelLoadError
from talon.models.device import resolve_device, resolve_dtype
from talon.models.embedded import (
    EmbeddedModel,
    GgufPart,
    assemble_gguf,
    embedded_parts,
    prepare_embedded,
)
from talon.models.loading import load_model
from talon.models.tokenizer_check import check_tokenizers_match
from talon.run_config import ConfigError
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, ENV_VARS, Settings
from tests.tiny import CPU

# --- device and dtype ---------------------------------------------------------------------------


def test_resolve_device_auto_and_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == CPU
    assert resolve_device("cpu") == CPU


def test_resolve_device_cuda_without_cuda_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="no CUDA GPU"):
        resolve_device("cuda")


def test_resolve_device_unknown_name() -> None:
    with pytest.raises(ModelLoadError, match="auto, cpu, cuda"):
        resolve_device("tpu9")


def test_resolve_dtype_explicit_names() -> None:
    assert resolve_dtype("float32", CPU) == torch.float32
    assert resolve_dtype("bfloat16", CPU) == torch.bfloat16
    assert resolve_dtype(" Float16 ", CPU) == torch.float16


def test_resolve_dtype_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(tm_device, "_cpu_prefers_bf16", lambda: True)
    assert resolve_dtype("auto", CPU) == torch.bfloat16
    monkeypatch.setattr(tm_device, "_cpu_prefers_bf16", lambda: False)
    assert resolve_dtype("auto", CPU) == torch.float32


def test_resolve_dtype_bad_string() -> None:
    with pytest.raises(ModelLoadError, match="Unknown dtype 'fp8'.*auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", CPU)


def test_the_cpu_dtype_check_follows_its_timings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    assert 0.0 < tm_device.time_linear(torch.float32, reps=3) < 1.0
    # the AMX Xeon's kind: a tree's rows 4.5x, one row barely faster (memory-bound): bf16
    assert tm_device.bf16_pays({1: (1.35, 1.28), 16: (6.09, 1.34)})
    assert tm_device.bf16_pays({1: (1.0, 1.09), 16: (1.0, 0.86)})  # within both allowances
    assert not tm_device.bf16_pays({1: (1.0, 1.12), 16: (2.0, 1.0)})  # one token 12 % slower
    assert not tm_device.bf16_pays({1: (1.0, 0.8), 16: (1.0, 1.7)})  # no avx512_bf16: a tree 1.7x slower
    monkeypatch.setenv("TALON_COST_CACHE", str(tmp_path))  # verdicts are kept beside the cost curves
    for f32, bf16, expected in (((0.0014, 0.0061), (0.0012, 0.0013), True), ((0.010, 0.010), (0.005, 0.017), False)):
        monkeypatch.setattr(tm_device, "time_linear",
                            lambda dtype, rows=8, f=f32, b=bf16: (f if dtype == torch.float32 else b)[rows > 1])
        monkeypatch.setattr(tm_device, "host_key", lambda e=expected: {"host": str(e)})  # one host per case
        tm_device._cpu_prefers_bf16.cache_clear()
        with caplog.at_level(logging.INFO, logger="talon.models.device"):
            assert tm_device._cpu_prefers_bf16() is expected
        line = next(r.getMessage() for r in caplog.records if "CPU dtype check" in r.getMessage())
        assert "3 rounds" in line and line.endswith("bfloat16" if expected else "float32"), line
        # a later start on the same host reads the kept verdict, whatever its timings say now
        monkeypatch.setattr(tm_device, "time_linear", lambda dtype, rows=8: pytest.fail("checked again"))
        caplog.clear()
        tm_device._cpu_prefers_bf16.cache_clear()
        with caplog.at_level(logging.INFO, logger="talon.models.device"):
            assert tm_device._cpu_prefers_bf16() is expected
        assert any("dtype verdict kept in" in r.getMessage() for r in caplog.records)
    assert len(list((tmp_path / "dtype").glob("verdict-*.json"))) == 2
    tm_device._cpu_prefers_bf16.cache_clear()


def test_a_dtype_verdict_inside_the_noise_is_float32(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TALON_COST_CACHE", str(tmp_path))
    calls = iter(range(100))  # the second of three rounds sees bf16 slow for one token: the rounds disagree

    def timed(dtype: torch.dtype, rows: int = 8) -> float:
        i = next(calls)  # each round: float32 then bfloat16 at 1 row, then at 16
        if dtype == torch.float32:
            return 0.001
        return 0.0015 if i == 5 else (0.0009 if rows == 1 else 0.0005)

    monkeypatch.setattr(tm_device, "time_linear", timed)
    tm_device._cpu_prefers_bf16.cache_clear()
    assert tm_device._cpu_prefers_bf16() is False
    assert not list(tmp_path.glob("dtype/verdict-*.json")), "a verdict inside the noise is not kept"
    tm_device._cpu_prefers_bf16.cache_clear()  # the next start checks again: its rounds agree, and it is kept
    assert tm_device._cpu_prefers_bf16() is True
    assert len(list(tmp_path.glob("dtype/verdict-*.json"))) == 1
    tm_device._cpu_prefers_bf16.cache_clear()


# --- specs that cannot load -----------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["/no/such/checkpoint", "./missing-model", "~/nowhere/model.gguf"])
def test_missing_local_path(spec: str, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist.*embedded"):
        load_model(spec, dtype="float32", device="cpu", cache_dir=tmp_path)


def test_directory_without_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path), dtype="float32", device="cpu", cache_dir=tmp_path)


def test_unknown_embedded_name(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="Unknown embedded model"):
        load_model("embedded:gpt-9", dtype="float32", device="cpu", cache_dir=tmp_path)


def test_unknown_hub_id_offline_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as info:
        load_model("talon-tests/no-such-model", dtype="float32", device="cpu", cache_dir=tmp_path)
    assert time.perf_counter() - start < 15.0
    message = str(info.value)
    assert "HF_HUB_OFFLINE" in message and "not in the local Hugging Face cache" in message
    assert "talon-tests/no-such-model" in message and EMBEDDED_TARGET in message


def test_unreachable_hub_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(tm_loading, "_hub_reachable", lambda: False)
    with pytest.raises(ModelLoadError, match="unreachable"):
        load_model("talon-tests/no-such-model", dtype="float32", device="cpu", cache_dir=tmp_path)


# --- tokenizer compatibility ----------------------------------------------------------------------


def word_tokenizer(words: list[str], eos: str = "<eos>") -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over ``words`` (ids in list order) plus ``eos``."""
    vocab = {word: i for i, word in enumerate(words)}
    vocab.setdefault(eos, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=words[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=eos)


GGUF_WORDS = ["<unk>", "def", "return", "(", ")", ":"]


def test_matching_tokenizers_pass() -> None:
    check_tokenizers_match(word_tokenizer(GGUF_WORDS), word_tokenizer(GGUF_WORDS), "t", "d")


def test_gguf_padding_rows_are_ignored() -> None:
    check_tokenizers_match(word_tokenizer([*GGUF_WORDS, "<eos>", "[PAD7]"]), word_tokenizer(GGUF_WORDS), "t", "d")


def test_vocab_mismatch_names_models_and_token() -> None:
    swapped = ["<unk>", "return", "def", "(", ")", ":"]
    with pytest.raises(ModelLoadError) as info:
        check_tokenizers_match(
            word_tokenizer(GGUF_WORDS), word_tokenizer(swapped), "big-model", "small-model"
        )
    message = str(info.value)
    assert "big-model" in message and "small-model" in message
    assert "'def' is id 1 in the target but id 2 in the draft" in message


def test_missing_token_is_a_mismatch() -> None:
    with pytest.raises(ModelLoadError, match="':' is id 5 in the target but missing"):
        check_tokenizers_match(word_tokenizer(GGUF_WORDS), word_tokenizer(GGUF_WORDS[:-1]), "t", "d")


def test_eos_mismatch() -> None:
    words = [*GGUF_WORDS, "<eos>", "<end>"]
    target, draft = word_tokenizer(words, eos="<eos>"), word_tokenizer(words, eos="<end>")
    with pytest.raises(ModelLoadError, match="eos token"):
        check_tokenizers_match(target, draft, "t", "d")


# --- GGUF part assembly ---------------------------------------------------------------------------


def fake_parts(tmp_path: Path, chunks: list[bytes]) -> list[GgufPart]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, chunk in enumerate(chunks, start=1):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(chunk)
        parts.append(GgufPart(path, f"talon-fake-part{i}", "1.0"))
    return parts


CHUNKS = [b"GGUF-head-", b"middle-", b"tail"]
JOINED = b"".join(CHUNKS)
JOINED_SHA = hashlib.sha256(JOINED).hexdigest()


def test_assemble_joins_in_order(tmp_path: Path) -> None:
    dest = assemble_gguf(
        fake_parts(tmp_path, CHUNKS), tmp_path / "out" / "m.gguf", len(JOINED), JOINED_SHA
    )
    assert dest.read_bytes() == JOINED
    assert not list(dest.parent.glob("*.partial"))


def test_assemble_missing_part_names_package(tmp_path: Path) -> None:
    parts = fake_parts(tmp_path, CHUNKS)
    parts[1].path.unlink()
    with pytest.raises(ModelLoadError) as info:
        assemble_gguf(parts, tmp_path / "m.gguf", len(JOINED), JOINED_SHA)
    message = str(info.value)
    assert "talon-fake-part2" in message and "missing" in message
    assert "pip install --force-reinstall talon-fake-part2==1.0" in message


def test_assemble_wrong_size(tmp_path: Path) -> None:
    parts = fake_parts(tmp_path, [CHUNKS[0], CHUNKS[1] + b"!", CHUNKS[2]])
    with pytest.raises(ModelLoadError, match="add up to .* expected") as info:
        assemble_gguf(parts, tmp_path / "m.gguf", len(JOINED), JOINED_SHA)
    assert "pip install --force-reinstall talon-fake-part1==1.0 talon-fake-part2==1.0" in str(info.value)


def test_assemble_corrupt_content(tmp_path: Path) -> None:
    parts = fake_parts(tmp_path, [CHUNKS[0], b"MIDDLE-", CHUNKS[2]])
    dest = tmp_path / "m.gguf"
    with pytest.raises(ModelLoadError, match="sha256 .* expected .*force-reinstall"):
        assemble_gguf(parts, dest, len(JOINED), JOINED_SHA)
    assert not dest.exists() and not dest.with_name("m.gguf.partial").exists()


def test_missing_part_package_names_it() -> None:
    ghost = EmbeddedModel("ghost", "talon-no-such-package-part", 2, "3.1.4", 10, "0" * 64)
    with pytest.raises(ModelLoadError, match="talon-no-such-package-part1==3.1.4"):
        embedded_parts(ghost)


def test_installed_part_matches_its_record() -> None:
    part = embedded_parts(tm_embedded.EMBEDDED_MODELS[EMBEDDED_DRAFT])[-1]
    assert tm_embedded._record_sha256(part) is not None
    assert tm_embedded._diagnose_part(part) is None
    moved = GgufPart(part.path.with_name("elsewhere.bin"), part.package, part.version)
    assert "missing" in (tm_embedded._diagnose_part(moved) or "")


def test_embedded_parts_add_up() -> None:
    for embedded in tm_embedded.EMBEDDED_MODELS.values():
        parts = embedded_parts(embedded)
        assert [p.package for p in parts] == list(embedded.packages)
        assert sum(p.path.stat().st_size for p in parts) == embedded.size


# --- GGUF conversion, on a tiny random qwen2 GGUF ---------------------------------------------------

TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def _tiny_tokenizer_metadata(writer: gguf.GGUFWriter) -> int:
    """Byte-level BPE vocabulary (256 bytes, one merge, 3 specials) in GGUF form; returns its size."""
    tokens = [*sorted(pre_tokenizers.ByteLevel.alphabet()), "de", *TINY_SPECIALS]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 3) + [3] * 3)
    writer.add_token_merges(["d e"])
    writer.add_bos_token_id(len(tokens) - 3)
    writer.add_pad_token_id(len(tokens) - 3)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_add_bos_token(False)
    writer.add_chat_template(TINY_TEMPLATE)
    return len(tokens)


def write_tiny_gguf(path: Path, hidden: int = 32, layers: int = 2, ffn: int = 64, arch: str = "qwen2",
                    tied: bool = False, q8: bool = False, leave_out: str = "") -> None:
    """A random float32 ``arch`` GGUF (qwen2 or llama; 4 heads, 2 KV heads) with a tokenizer and chat
    template; ``tied``: no output weight (the LM head is the embedding); ``q8``: the 2D weights in Q8_0;
    ``leave_out``: a tensor the file lacks."""
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), arch)
    for add, value in [
        ("block_count", layers),
        ("context_length", 128),
        ("embedding_length", hidden),
        ("feed_forward_length", ffn),
        ("head_count", 4),
        ("head_count_kv", 2),
        ("rope_freq_base", 10000.0),
        ("layer_norm_rms_eps", 1e-6),
        ("file_type", 0),
    ]:
        getattr(writer, f"add_{add}")(value)
    vocab, kv_dim = _tiny_tokenizer_metadata(writer), hidden // 2
    shapes = {"token_embd.weight": (vocab, hidden), "output_norm.weight": (hidden,)}
    if not tied:
        shapes["output.weight"] = (vocab, hidden)
    biases = arch == "qwen2"
    for i in range(layers):
        shapes |= {
            f"blk.{i}.{name}": shape
            for name, shape in [
                ("attn_norm.weight", (hidden,)),
                ("ffn_norm.weight", (hidden,)),
                ("attn_q.weight", (hidden, hidden)),
                ("attn_q.bias", (hidden,)),
                ("attn_k.weight", (kv_dim, hidden)),
                ("attn_k.bias", (kv_dim,)),
                ("attn_v.weight", (kv_dim, hidden)),
                ("attn_v.bias", (kv_dim,)),
                ("attn_output.weight", (hidden, hidden)),
                ("ffn_gate.weight", (ffn, hidden)),
                ("ffn_up.weight", (ffn, hidden)),
                ("ffn_down.weight", (hidden, ffn)),
            ]
            if biases or not name.endswith(".bias")
        }
    for name, shape in shapes.items():
        if name == leave_out:
            continue
        values = weight(*shape)
        if q8 and len(shape) == 2:
            blocks = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf"
    write_tiny_gguf(path)
    return path


def test_gguf_file_converts_exactly_and_once(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = load_model(str(tiny_gguf), dtype="float32", device="cpu", cache_dir=tmp_path)
    assert (Path(lm.name) / tm_convert.MARKER_FILE).is_file()
    assert lm.tokenizer.chat_template == TINY_TEMPLATE and lm.tokenizer.eos_token == "<|im_end|>"
    assert lm.tokenizer("de").input_ids == [256]  # the merge survived
    source = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(tiny_gguf)).tensors}
    k_proj = lm.model.model.layers[1].self_attn.k_proj.weight.detach().numpy()
    np.testing.assert_array_equal(k_proj, source["blk.1.attn_k.weight"])
    reloaded = AutoModelForCausalLM.from_pretrained(lm.name)  # the name loads the same weights
    assert torch.equal(reloaded.lm_head.weight, lm.model.lm_head.weight)

    monkeypatch.setattr(tm_convert, "convert_gguf", lambda *args, **kwargs: pytest.fail("converted twice"))
    assert load_model(str(tiny_gguf), dtype="float32", device="cpu", cache_dir=tmp_path).name == lm.name


def test_a_conversion_parses_the_gguf_metadata_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Config, tokenizer and weights each ask transformers for the file's metadata: one reader is
    built and its fields are turned into values once (7 s and 1.5 s a time on the embedded target),
    and the tensor name map is built once, not once per module."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    readers, parses, maps = [], [], []
    real_reader, real_load, real_map = gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: readers.append(a) or real_reader(*a, **k))
    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint", lambda *a, **k: parses.append(a) or real_load(*a, **k))
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda *a: maps.append(a) or real_map(*a))
    patched = (gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map)
    tm_convert.convert_gguf(path, tmp_path / "out", "sha")
    assert len(readers) == 1 and len(parses) == 1 and len(maps) == 1
    assert (gguf.GGUFReader, gguf_utils.load_gguf_checkpoint, gguf.get_tensor_name_map) == patched  # put back


def test_the_tensor_table_reads_a_gguf_as_the_gguf_package_does(tmp_path: Path) -> None:
    """``read_table`` (which walks past the vocabulary) finds every tensor ``gguf.GGUFReader`` does,
    with its type, dimensions and bytes, and every scalar and string; a string array is its length."""
    from talon.models.gguf_table import read_table

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, q8=True)
    table, reader = read_table(path), gguf.GGUFReader(str(path))
    assert list(table.tensors) == [t.name for t in reader.tensors]
    for theirs in reader.tensors:
        ours = table.tensors[theirs.name]
        assert (ours.tensor_type, ours.shape) == (theirs.tensor_type, tuple(int(d) for d in theirs.shape))
        assert ours.data.dtype == theirs.data.dtype and np.array_equal(ours.data, theirs.data), theirs.name
    assert {t.tensor_type.name for t in reader.tensors} == {"Q8_0", "F32"}
    strings = gguf.GGUFValueType.STRING
    for key, field in ((k, f) for k, f in reader.fields.items() if not k.startswith("GGUF.")):
        if field.types == [gguf.GGUFValueType.ARRAY, strings]:
            assert table.metadata[key] == len(field.data), key
        elif field.types == [strings]:
            assert table.metadata[key] == bytes(field.parts[field.data[0]]).decode(), key
        elif field.types[0] == gguf.GGUFValueType.ARRAY:
            assert table.metadata[key] == [field.parts[i][0] for i in field.data], key
        else:
            assert table.metadata[key] == field.parts[field.data[0]][0], key
    assert table.architecture == "qwen2" and table.metadata["tokenizer.ggml.tokens"] > 256
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_table(bad)


@pytest.mark.parametrize("arch,tied", [("qwen2", False), ("llama", True)])
def test_a_streamed_conversion_holds_transformers_own_weights(arch: str, tied: bool, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensor by tensor into shards, the checkpoint holds exactly what transformers' own GGUF
    loader builds all at once: names, llama's q/k row order, Q8_0 dequantized, the tied head."""
    path = tmp_path / f"tiny-{arch}.gguf"
    write_tiny_gguf(path, arch=arch, tied=tied, q8=True)
    monkeypatch.setattr(tm_convert, "SHARD_BYTES", 40_000)
    out = tm_convert.convert_gguf(path, tmp_path / "converted", "sha")
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 2 and not list(out.glob(".shard-*"))
    want = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    got = AutoModelForCausalLM.from_pretrained(out)
    assert got.config.tie_word_embeddings == want.config.tie_word_embeddings == tied
    assert got.dtype == torch.float32 and got.config.model_type == want.config.model_type == arch
    assert got.config.architectures == [type(want).__name__]
    want_sd, got_sd = want.state_dict(), got.state_dict()
    assert want_sd.keys() == got_sd.keys()
    for name, tensor in want_sd.items():
        assert torch.equal(got_sd[name], tensor), name


def test_a_gguf_without_a_weight_the_model_needs_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "holed.gguf"
    write_tiny_gguf(path, leave_out="blk.1.ffn_down.weight")
    with pytest.raises(ModelLoadError, match=r"holed.gguf holds no weights for model.layers.1.mlp.down_proj.weight"):
        tm_convert.convert_gguf(path, tmp_path / "converted", "sha")
    assert not (tmp_path / "converted").exists() and not list(tmp_path.glob(".converted.tmp-*"))


def test_prepare_embedded_assembles_converts_and_cleans_up(tiny_gguf: Path, tmp_path: Path) -> None:
    data = tiny_gguf.read_bytes()
    cut = len(data) // 3
    parts = fake_parts(tmp_path / "parts", [data[:cut], data[cut : 2 * cut], data[2 * cut :]])
    embedded = EmbeddedModel(
        "tiny",
        "talon-fake-part",
        3,
        "1.0",
        len(data),
        hashlib.sha256(data).hexdigest(),
        extra_eos_tokens=("<|endoftext|>",),
    )
    cache = tmp_path / "cache"
    out_dir = prepare_embedded(embedded, cache, parts)
    assert out_dir == cache / "tiny" and (out_dir / tm_convert.MARKER_FILE).is_file()
    assert not list(cache.glob("*.gguf*")) and not list(cache.glob(".tiny.tmp-*"))
    model = AutoModelForCausalLM.from_pretrained(out_dir)
    end_of_text, im_end = (model.config.vocab_size - 3, model.config.vocab_size - 1)
    assert list(model.generation_config.eos_token_id) == [im_end, end_of_text]
    assert prepare_embedded(embedded, cache, parts=[]) == out_dir  # converted: parts are not read again


# --- settings -------------------------------------------------------------------------------------


def test_settings_defaults_follow_env_vars() -> None:
    settings = Settings.from_env({})
    assert settings.target == EMBEDDED_TARGET == ENV_VARS["TALON_TARGET"][0]
    assert settings.draft == EMBEDDED_DRAFT == ENV_VARS["TALON_DRAFT"][0]
    assert settings.cache_dir == Path("~/.cache/talon").expanduser()
    assert (settings.device, settings.dtype, settings.allow_remote_code) == ("auto", "auto", False)
    assert (settings.max_new_tokens_limit, settings.max_prompt_tokens) == (1024, 4096)


def test_settings_from_env_values_and_errors(tmp_path: Path) -> None:
    env = {"TALON_CACHE": str(tmp_path), "TALON_DRAFT": "none", "TALON_ALLOW_REMOTE_CODE": "1"}
    settings = Settings.from_env(env)
    assert (settings.cache_dir, settings.draft, settings.allow_remote_code) == (tmp_path, "none", True)
    with pytest.raises(ConfigError, match="TALON_MAX_PROMPT_TOKENS"):
        Settings.from_env({"TALON_MAX_PROMPT_TOKENS": "lots"})
    with pytest.raises(ConfigError, match="TALON_DTYPE"):
        Settings.from_env({"TALON_DTYPE": "int4"})


# --- the embedded pair ----------------------------------------------------------------------------


def test_the_int8_draft_head_is_the_float_head_quantized() -> None:
    """An int8 draft also gets an int8 LM head, one per draft vocabulary size, built once: its
    probabilities stay within int8 rounding of the float head's and never touch the tied
    embedding it was copied from."""
    from talon.models import quantize_draft
    from talon.models.head import lm_logits
    from tests.tiny import tiny_loaded

    lm = tiny_loaded("qwen2", seed=3)
    float_head = lm.model.get_output_embeddings().weight.detach().clone()
    hidden = torch.randn(5, float_head.shape[1])
    exact = torch.softmax(torch.nn.functional.linear(hidden, float_head[:200]), dim=-1)
    int8 = quantize_draft(lm).model
    probs = torch.softmax(lm_logits(int8, hidden, 200), dim=-1)
    assert probs.shape == (5, 200)
    assert (probs - exact).abs().max() < 0.02
    assert (probs.argmax(-1) == exact.argmax(-1)).all()
    assert lm_logits(int8, hidden, 0).shape == (5, float_head.shape[0])
    assert lm_logits(int8, hidden, 10**6).shape == (5, float_head.shape[0]), "a draft vocabulary above the head's"
    assert set(int8.talon_heads) == {200, 0, 10**6}
    head = int8.talon_heads[200]
    lm_logits(int8, hidden, 200)
    assert int8.talon_heads[200] is head, "built once per size"
    assert torch.equal(int8.get_output_embeddings().weight, float_head)
