"""Float32 weights laid out once for oneDNN (``talon.models.prepack``, ``TALON_PREPACK``): the
same products as torch's matmul up to the order of the sums, a row's result the same in a tree of
any width from two rows up, and a prepacked target decoding token for token its own greedy
``generate`` for every drafter and tree mode."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import talon.models.prepack
from talon.cost.probe import cost_key
from talon.models import load_pair
from talon.models.head import head_rows, lm_logits
from talon.models.prepack import (
    PREPACKED,
    PrepackedLinear,
    decide,
    is_prepacked,
    pays,
    prepack,
    prepack_supported,
    should_prepack,
)
from talon.models.quant import quantize_draft
from talon.run_config import ConfigError
from talon.settings import Settings
from tests.tiny import assert_decodes_own_generate, save_tiny_pair, tiny_loaded

pytestmark = pytest.mark.skipif(not prepack_supported(), reason="this torch build has no oneDNN CPU linear")


@pytest.mark.parametrize("bias", [False, True])
def test_a_prepacked_layer_computes_the_layer(bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(320, 200, bias=bias)
    packed = PrepackedLinear(linear)
    assert not hasattr(packed, "weight")  # the plain copy is not kept (only a head keeps it)
    for shape in ((1, 320), (5, 320), (1, 7, 320), (2, 3, 320)):
        x = torch.randn(shape)
        got, want = packed(x), linear(x)
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()
    x = torch.randn(320, 6).t()  # a non-contiguous input
    assert torch.allclose(packed(x), linear(x), rtol=1e-5, atol=1e-5)


def test_a_row_is_the_same_in_a_tree_of_any_width_from_two_rows() -> None:
    torch.manual_seed(1)
    packed = PrepackedLinear(nn.Linear(512, 384, bias=True))
    rows = torch.randn(40, 512)
    together = packed(rows)
    for width in (2, 3, 4, 8, 17, 33):
        assert torch.equal(packed(rows[:width]), together[:width]), width  # exact, not close


def prepacked_target(seed: int = 0):
    lm = tiny_loaded("llama", seed)
    plain = tiny_loaded("llama", seed)
    assert prepack(lm.model) == 2 * 7 + 1  # 7 Linear layers a decoder layer, and the head
    return lm, plain


def test_prepacking_a_model_keeps_the_model() -> None:
    lm, plain = prepacked_target()
    assert is_prepacked(lm.model) and lm.model.talon_quant == PREPACKED
    assert not any(type(m) is nn.Linear for m in lm.model.modules())
    head = lm.model.get_output_embeddings()
    assert isinstance(head, PrepackedLinear) and head.weight is not None  # rows sliced for a draft's vocabulary
    assert head_rows(lm.model) == head_rows(plain.model)
    ids = torch.tensor([[5, 9, 77, 3, 200, 41, 41, 7]])
    with torch.inference_mode():
        got, want = lm.model(ids).logits, plain.model(ids).logits
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), (got - want).abs().max()
        hidden = lm.model.model(ids).last_hidden_state[0]
        assert torch.allclose(lm_logits(lm.model, hidden), got[0], rtol=1e-5, atol=1e-5)
        assert torch.allclose(lm_logits(lm.model, hidden, 100), got[0, :, :100], rtol=1e-4, atol=1e-4)
    assert cost_key(lm.model, None, ("t", "none")) != cost_key(plain.model, None, ("t", "none"))  # re-measured


def quiet_layer(lm, i: int):  # noqa: ANN001, ANN201
    with torch.no_grad():
        lm.model.model.layers[i].self_attn.o_proj.weight.mul_(0.05)
        lm.model.model.layers[i].mlp.down_proj.weight.mul_(0.05)
    return lm


@pytest.mark.parametrize("drafter", ["hybrid", "model", "retrieval", "layerskip"])
@pytest.mark.parametrize("tree", ["adaptive", "static", "chain"])
def test_a_prepacked_target_decodes_its_own_greedy_generate(drafter: str, tree: str) -> None:
    # 4 layers (layerskip keeps the first and last), the one it skips writing little into the
    # residual stream, so the view drafts close to the target; the draft model is the same weights
    target, draft = (quiet_layer(tiny_loaded("llama", 0, layers=4), 1) for _ in range(2))
    prepack(target.model)
    prepack(draft.model)
    assert_decodes_own_generate(target, None if drafter == "layerskip" else draft, drafter, tree)


def test_what_gets_prepacked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALON_COST_CACHE", str(tmp_path))  # verdicts are kept beside the cost curves
    talon.models.prepack.prepack_pays.cache_clear()
    lm = tiny_loaded("llama", 0)
    assert should_prepack(lm.model) and not should_prepack(lm.model, enabled=False)
    assert should_prepack(lm.model, enabled=None) == talon.models.prepack.prepack_pays()
    assert not should_prepack(quantize_draft(tiny_loaded("llama", 1)).model)  # int8 keeps its own kernels
    assert not should_prepack(tiny_loaded("llama", 2).model.to(torch.bfloat16))
    prepack(lm.model)
    assert not should_prepack(lm.model)  # once


def test_load_pair_prepacks_unless_told_not_to(tmp_path: Path) -> None:
    target_dir, draft_dir = save_tiny_pair(tmp_path)
    t, d = load_pair(str(target_dir), str(draft_dir), "float32", "cpu", draft_quant="none", prepack=True)
    assert is_prepacked(t.model) and is_prepacked(d.model)
    t, d = load_pair(str(target_dir), str(draft_dir), "float32", "cpu", draft_quant="int8", prepack=True)
    assert is_prepacked(t.model) and d.model.talon_quant == "int8"
    t, d = load_pair(str(target_dir), str(draft_dir), "float32", "cpu", draft_quant="none", prepack=False)
    assert not is_prepacked(t.model) and not is_prepacked(d.model)
    assert any(type(m) is nn.Linear for m in t.model.modules())


def test_the_setting() -> None:
    assert Settings().prepack is None and Settings.from_env({}).prepack is None  # auto: the host decides
    assert Settings.from_env({"TALON_PREPACK": "1"}).prepack is True
    assert Settings.from_env({"TALON_PREPACK": "0"}).prepack is False
    with pytest.raises(ConfigError, match="TALON_PREPACK must be auto, 0 or 1"):
        Settings.from_env({"TALON_PREPACK": "maybe"})


def test_auto_follows_the_hosts_measurement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """``TALON_PREPACK=auto`` prepacks where the timed check of one layer says it pays; the check
    says it in the log, with its figures, and its verdict is kept for the host's next start."""
    target_dir, draft_dir = save_tiny_pair(tmp_path)
    for measured, packed in ((True, True), (False, False)):
        monkeypatch.setattr(talon.models.prepack, "prepack_pays", lambda measured=measured: measured)
        t, d = load_pair(str(target_dir), str(draft_dir), "float32", "cpu", draft_quant="none", prepack=None)
        assert is_prepacked(t.model) == packed and is_prepacked(d.model) == packed
    monkeypatch.undo()
    monkeypatch.setenv("TALON_COST_CACHE", str(tmp_path / "cache"))
    talon.models.prepack.prepack_pays.cache_clear()
    with caplog.at_level(logging.INFO, logger="talon.models.prepack"):
        choice = talon.models.prepack.prepack_pays()
    line = next(r.getMessage() for r in caplog.records if "CPU layout check" in r.getMessage())
    assert re.search(r"3 rounds: 1 rows [\d.]+ / [\d.]+ ms .*16 rows [\d.]+ / [\d.]+ ms", line), line
    assert line.endswith("auto = " + ("on" if choice else "off"))
    kept = list((tmp_path / "cache" / "prepack").glob("verdict-*.json"))
    assert len(kept) == ("inside the noise" not in line)  # a busy host's split rounds: off, and not kept
    for path in kept:
        path.unlink()
    # a busy start (one round of three slower prepacked at one row): off, not kept; then a quiet one: kept
    rounds = iter([(0.001, 0.002), (0.002, 0.001)] + [(0.002, 0.001)] * 10)
    monkeypatch.setattr(talon.models.prepack, "time_layer", lambda rows: next(rounds))
    talon.models.prepack.prepack_pays.cache_clear()
    assert talon.models.prepack.prepack_pays() is False
    assert not list((tmp_path / "cache" / "prepack").glob("verdict-*.json"))
    talon.models.prepack.prepack_pays.cache_clear()
    choice = talon.models.prepack.prepack_pays()
    assert choice is True
    monkeypatch.setattr(talon.models.prepack, "time_layer", lambda rows: pytest.fail("checked again"))
    kept = list((tmp_path / "cache" / "prepack").glob("verdict-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["on"] == choice
    caplog.clear()
    talon.models.prepack.prepack_pays.cache_clear()  # a new start on the same host: the kept verdict
    with caplog.at_level(logging.INFO, logger="talon.models.prepack"):
        assert talon.models.prepack.prepack_pays() == choice
    assert any("verdict kept in" in r.getMessage() for r in caplog.records)
    assert not any("CPU layout check" in r.getMessage() for r in caplog.records)
    talon.models.prepack.prepack_pays.cache_clear()


def test_a_verdict_inside_the_noise_is_off() -> None:
    pays_clearly = {1: (1.0, 0.7), 16: (2.0, 1.0)}
    slower = {1: (1.0, 1.2), 16: (2.0, 1.0)}
    assert decide([pays_clearly] * 3) == (True, pytest.approx(1.05 / 0.7))  # the one-row allowance is the nearer
    on, least = decide([pays_clearly, slower, pays_clearly])  # one round of three misses: noise, so off
    assert not on and least == pytest.approx(1.05 / 1.2)
    assert decide([slower] * 3)[0] is False


def test_the_rule_takes_a_tree_speedup_and_no_one_row_slowdown() -> None:
    assert pays({1: (1.0, 0.7), 16: (2.0, 1.0)})  # the AVX2 EPYC's kind: faster at both
    assert pays({1: (1.0, 1.04), 16: (2.0, 1.5)})  # a tree much faster, one row within 5 %
    assert not pays({1: (1.0, 1.2), 16: (2.0, 1.0)})  # one row 20 % slower: plain decoding would lose
    assert not pays({1: (1.0, 1.0), 16: (1.0, 0.95)})  # a tree barely faster: not worth the layout


def test_a_prepacked_pair_decodes_a_stock_models_greedy_generate(tmp_path: Path) -> None:
    """The pair as ``load_pair`` prepacks it, against the checkpoint loaded by transformers'
    own ``from_pretrained`` with nothing of Talon's: token for token, drafts accepted."""
    from transformers import AutoModelForCausalLM

    from talon.engine.engine import Engine, generate
    from talon.run_config import RunConfig, TreeConfig
    from tests.tiny import MAT_FLOOR

    lm = tiny_loaded("llama", 0, layers=3)
    for name in ("target", "draft"):  # the draft is the target's checkpoint: its drafts are accepted
        lm.model.save_pretrained(tmp_path / name)
        lm.tokenizer.save_pretrained(tmp_path / name)
    target, draft = load_pair(str(tmp_path / "target"), str(tmp_path / "draft"), "float32", "cpu",
                              draft_quant="none", prepack=True)
    assert is_prepacked(target.model) and is_prepacked(draft.model)
    stock = AutoModelForCausalLM.from_pretrained(tmp_path / "target", dtype=torch.float32).eval()
    ids = torch.tensor([[97, 98, 99, 32, 97, 98, 99]])
    with torch.inference_mode():
        ids = stock.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
        want = stock.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=24)[0, ids.shape[1]:].tolist()
    engine = Engine(target, draft)
    for drafter in ("hybrid", "model", "retrieval", "layerskip"):
        cfg = RunConfig(drafter=drafter, max_new_tokens=24, chat_template=False,
                        tree=TreeConfig(budget=12, cost_aware=False))
        summary, _ = generate(engine, ids[0].tolist(), cfg)
        assert summary.token_ids == want, drafter
        assert summary.mean_accepted_tokens >= MAT_FLOOR, (drafter, summary.mean_accepted_tokens)
