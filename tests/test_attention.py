"""Grouped-query attention folded (talon/models/attention.py): the query heads that share a key/value
head folded into its rows give transformers' ``sdpa`` result (which repeats the keys and values)
for every step size and mask; the static forward folds (``repeat_kv`` never runs in it) and
equals itself unfolded, and so does a tree's forward on the dynamic cache; a model switched to
the implementation computes what it did before wherever the flag is not passed; a mask folded in
the wrong order fails."""

from __future__ import annotations

import pytest
import torch
import transformers.integrations.sdpa_attention as hf_sdpa
from transformers import DynamicCache

import talon.models.attention
from talon.core.forward import forward_hidden
from talon.graphs.static import StaticForward
from talon.models.attention import NAME, folded_sdpa, resolve_fold, set_fold
from tests.tiny import tiny_model

PREFIX = torch.arange(3, 40)


class Heads(torch.nn.Module):
    """What the attention function reads of its module."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def masks(t: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random additive float mask and the same as booleans, (1, 1, t, length); every row sees
    its own slot."""
    g = torch.Generator().manual_seed(seed)
    seen = torch.rand(t, length, generator=g) < 0.4
    seen[torch.arange(t), length - t + torch.arange(t)] = True
    return torch.where(seen, 0.0, torch.finfo(torch.float32).min).view(1, 1, t, length), seen.view(1, 1, t, length)


@pytest.mark.parametrize("heads,kv,t", [(4, 2, 1), (4, 2, 5), (14, 2, 8), (28, 4, 33), (6, 6, 4)])
def test_the_fold_is_sdpa(heads: int, kv: int, t: int) -> None:
    length, d = 70, 16
    g = torch.Generator().manual_seed(heads * 100 + t)
    q = torch.randn(1, heads, t, d, generator=g)
    k, v = torch.randn(1, kv, length, d, generator=g), torch.randn(1, kv, length, d, generator=g)
    module = Heads(heads // kv)
    for mask in masks(t, length, t):
        want, _ = hf_sdpa.sdpa_attention_forward(module, q, k, v, mask, scaling=d ** -0.5)
        got, _ = folded_sdpa(module, q, k, v, mask, scaling=d ** -0.5, fold_gqa=True)
        assert got.shape == want.shape == (1, t, heads, d)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def folded_model():  # noqa: ANN201
    return tiny_model("qwen2", seed=5, layers=2)


def steps(folded_model, fold: bool) -> list[torch.Tensor]:  # noqa: ANN001
    """Logits of a 1-node, a 5-node tree and a 16-node step on a slot cache of 128."""
    set_fold(folded_model, fold)  # a static forward reads the switch once, when it is made
    sf = StaticForward(folded_model, max_len=128, buckets=(1, 8, 16))
    sf.prefill(PREFIX)
    out, length = [], len(PREFIX)
    for t in (1, 5, 16):
        vis = torch.ones(t, t, dtype=torch.bool).tril()
        if t > 2:
            vis[2:, 1] = False  # a branch: the later nodes do not see node 1
        out.append(sf.forward(torch.arange(50, 50 + t), torch.arange(length, length + t), vis, length).clone())
    return out


def test_the_static_forward_folds_and_equals_itself_unfolded(folded_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    calls = []
    real = hf_sdpa.repeat_kv
    monkeypatch.setattr(hf_sdpa, "repeat_kv", lambda x, n: calls.append(n) or real(x, n))
    unfolded = steps(folded_model, fold=False)
    assert calls, "the unfolded forward repeats the keys and values (else this test compares nothing)"
    calls.clear()
    folded = steps(folded_model, fold=True)
    assert not calls, "the static forward repeated keys and values"
    assert folded_model.config._attn_implementation == NAME
    for want, got in zip(unfolded, folded):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_tree_on_the_dynamic_cache_folds_too(folded_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    calls = []
    real = hf_sdpa.repeat_kv
    monkeypatch.setattr(hf_sdpa, "repeat_kv", lambda x, n: calls.append(n) or real(x, n))
    tree = torch.ones(6, 6, dtype=torch.bool).tril()
    tree[3:, 1] = False  # two branches

    def verify() -> torch.Tensor:
        cache = DynamicCache(config=folded_model.config)
        forward_hidden(folded_model, cache, PREFIX, torch.arange(len(PREFIX)), None)
        visible = torch.cat([torch.ones(6, len(PREFIX), dtype=torch.bool), tree], dim=1)
        positions = torch.arange(len(PREFIX), len(PREFIX) + 6)
        return forward_hidden(folded_model, cache, torch.arange(60, 66), positions, visible)

    set_fold(folded_model, False)
    want = verify()
    assert calls, "unfolded, the tree's forward repeats the keys and values"
    calls.clear()
    set_fold(folded_model, True)
    got = verify()
    assert not calls, "the tree's forward repeated the keys and values"
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_switched_model_computes_what_it_did(folded_model) -> None:  # noqa: ANN001
    fresh = tiny_model("llama", seed=6, layers=2)
    ids = torch.arange(3, 30).view(1, -1)

    def logits() -> torch.Tensor:
        return fresh(input_ids=ids, past_key_values=DynamicCache(config=fresh.config)).logits

    before = logits()
    assert set_fold(fresh, True) and fresh.config._attn_implementation == NAME
    assert torch.equal(logits(), before)  # no flag: transformers' sdpa, bit for bit
    assert not set_fold(fresh, False) and fresh.config._attn_implementation == "sdpa"
    eager = tiny_model("llama", seed=6, layers=2)
    eager.set_attn_implementation("eager")
    assert not set_fold(eager, True) and eager.config._attn_implementation == "eager"


def test_the_engine_folds_where_its_device_kind_was_proven_to() -> None:
    """``TALON_FOLD``: auto folds where a run proved it (a CPU, and CUDA since an H200 ran it
    lossless in the loop); the engine switches both models, and a run's summary says which path ran."""
    from talon.engine.engine import Engine, generate
    from talon.run_config import RunConfig
    from talon.settings import PROVEN, Settings
    from tests.tiny import tiny_loaded

    assert resolve_fold(None, torch.device("cpu")) and resolve_fold(None, torch.device("cuda"))
    assert PROVEN[("fold", "cuda")].value == "on" and not resolve_fold(False, torch.device("cuda"))
    assert Settings.from_env({}).fold is None and Settings.from_env({"TALON_FOLD": "0"}).fold is False
    target, draft = tiny_loaded("qwen2", 0), tiny_loaded("qwen2", 1)
    for fold, implementation, path in ((None, NAME, "dynamic+fold"), (False, "sdpa", "dynamic")):
        engine = Engine(target, draft, fold=fold)
        assert {lm.model.config._attn_implementation for lm in (target, draft)} == {implementation}
        assert engine.forward_path == path
        assert generate(engine, "abc", RunConfig(max_new_tokens=2, chat_template=False))[0].forward_path == path


def test_a_mask_folded_in_the_wrong_order_fails(folded_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    def wrong(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):  # noqa: ANN001, ANN202
        kwargs.pop("fold_gqa", None)
        b, h, t, d = query.shape
        kv, length = key.shape[1], key.shape[2]
        groups = h // kv
        rows = query.reshape(b, kv, groups * t, d)
        mask = attention_mask[:, :, :, None].expand(b, 1, t, groups, length).reshape(b, 1, groups * t, length)
        out = torch.nn.functional.scaled_dot_product_attention(rows, key, value, attn_mask=mask, scale=scaling)
        return out.reshape(b, h, t, d).transpose(1, 2).contiguous(), None

    want = steps(folded_model, fold=True)
    monkeypatch.setitem(talon.models.attention.AttentionInterface._global_mapping, NAME, wrong)
    got = steps(folded_model, fold=True)
    assert not all(torch.allclose(g, w, atol=1e-3) for g, w in zip(got, want))  # the prefill's chunk too


def test_the_timing_script_runs_both_ways_with_the_same_logits(tmp_path) -> None:  # noqa: ANN001
    """``experiments/gqa_fold.py`` (the first GPU measurement in ``scripts/gpu_all.sh``), at the 7B
    preset's head counts shrunk: both ways, the same logits, a report."""
    import json

    from experiments import gqa_fold as script

    out = tmp_path / "fold.json"
    assert script.main(["--tiny", "--lens", "384", "--sizes", "1,8", "--reps", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    for role in ("target", "draft"):
        run = report[role]["L=384"]
        assert run["same_argmax"] and set(run["repeat"]) == set(run["folded"]) == {"1", "8"}
        assert max(run["max_logit_diff"].values()) < 1e-4
