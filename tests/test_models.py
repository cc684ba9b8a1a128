"""Model loading: device/dtype resolution, clear errors, tokenizer checks, GGUF part assembly,
and (marked ``embedded``) the real offline model pair."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import talon.models as tm
from talon.config import ConfigError
from talon.models import (
    EMBEDDED_DRAFT,
    EMBEDDED_TARGET,
    EmbeddedModel,
    GgufPart,
    LoadedModel,
    ModelLoadError,
    assemble_gguf,
    check_tokenizers_match,
    embedded_parts,
    load_model,
    load_pair,
    resolve_device,
    resolve_dtype,
)
from talon.settings import ENV_VARS, Settings

CPU = torch.device("cpu")


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
    monkeypatch.setattr(tm, "_cpu_prefers_bf16", lambda: True)
    assert resolve_dtype("auto", CPU) == torch.bfloat16
    monkeypatch.setattr(tm, "_cpu_prefers_bf16", lambda: False)
    assert resolve_dtype("auto", CPU) == torch.float32


def test_resolve_dtype_bad_string() -> None:
    with pytest.raises(ModelLoadError, match="Unknown dtype 'fp8'.*auto, float32, bfloat16, float16"):
        resolve_dtype("fp8", CPU)


def test_cpu_bf16_measurement_is_quick_and_positive() -> None:
    assert 0.0 < tm.time_linear(torch.float32, reps=3) < 1.0
    assert isinstance(tm._cpu_prefers_bf16(), bool)


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
    monkeypatch.setattr(tm, "_hub_reachable", lambda: False)
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


WORDS = ["<unk>", "def", "return", "(", ")", ":"]


def test_matching_tokenizers_pass() -> None:
    check_tokenizers_match(word_tokenizer(WORDS), word_tokenizer(WORDS), "t", "d")


def test_gguf_padding_rows_are_ignored() -> None:
    check_tokenizers_match(word_tokenizer(WORDS + ["<eos>", "[PAD7]"]), word_tokenizer(WORDS), "t", "d")


def test_vocab_mismatch_names_models_and_token() -> None:
    swapped = ["<unk>", "return", "def", "(", ")", ":"]
    with pytest.raises(ModelLoadError) as info:
        check_tokenizers_match(word_tokenizer(WORDS), word_tokenizer(swapped), "big-model", "small-model")
    message = str(info.value)
    assert "big-model" in message and "small-model" in message
    assert "'def' is id 1 in the target but id 2 in the draft" in message


def test_missing_token_is_a_mismatch() -> None:
    with pytest.raises(ModelLoadError, match="':' is id 5 in the target but missing"):
        check_tokenizers_match(word_tokenizer(WORDS), word_tokenizer(WORDS[:-1]), "t", "d")


def test_eos_mismatch() -> None:
    words = WORDS + ["<eos>", "<end>"]
    target, draft = word_tokenizer(words, eos="<eos>"), word_tokenizer(words, eos="<end>")
    with pytest.raises(ModelLoadError, match="eos token"):
        check_tokenizers_match(target, draft, "t", "d")


# --- GGUF part assembly ---------------------------------------------------------------------------


def fake_parts(tmp_path: Path, chunks: list[bytes]) -> list[GgufPart]:
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
    dest = assemble_gguf(fake_parts(tmp_path, CHUNKS), tmp_path / "out" / "m.gguf", len(JOINED), JOINED_SHA)
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
    part = embedded_parts(tm.EMBEDDED_MODELS[EMBEDDED_DRAFT])[-1]
    assert tm._record_sha256(part) is not None
    assert tm._diagnose_part(part) is None
    moved = GgufPart(part.path.with_name("elsewhere.bin"), part.package, part.version)
    assert "missing" in (tm._diagnose_part(moved) or "")


def test_embedded_parts_add_up() -> None:
    for embedded in tm.EMBEDDED_MODELS.values():
        parts = embedded_parts(embedded)
        assert [p.package for p in parts] == list(embedded.packages)
        assert sum(p.path.stat().st_size for p in parts) == embedded.size


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


@pytest.mark.embedded
def test_embedded_pair(embedded_pair: tuple[LoadedModel, LoadedModel]) -> None:
    target, draft = embedded_pair
    for lm in (target, draft):
        assert (lm.dtype, lm.device) == (torch.float32, CPU)
        assert not lm.model.training and lm.model.dtype == torch.float32
        assert (Path(lm.name) / tm.MARKER_FILE).is_file()
        assert lm.tokenizer.chat_template and "<|im_start|>" in lm.tokenizer.chat_template
        assert lm.tokenizer.eos_token == "<|im_end|>"
        im_end = lm.tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert im_end in list(lm.model.generation_config.eos_token_id)
    assert target.model.config.num_hidden_layers == 28 and draft.model.config.num_hidden_layers == 24

    messages = [{"role": "user", "content": "Write a Python function add(a, b) that returns a + b."}]
    inputs = target.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = target.model.generate(**inputs, max_new_tokens=20, do_sample=False)
    text = target.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "def add(a, b)" in text, text
