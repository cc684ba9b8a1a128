"""The layerskip drafter (``talon.drafters.layer_skip``): the target drafts for itself with a
block of its layers skipped. It shares the target's weights, leaves the target as it was, and
the loop stays lossless on every tree mode, with and without async drafting, on both steps,
with no draft model loaded."""

from __future__ import annotations

import pytest
import torch

from talon.drafters.layer_skip import layer_skip_view, skipped_layers, view_of
from talon.engine.engine import Engine, generate
from talon.models import LoadedModel
from talon.run_config import ConfigError, RunConfig, TreeConfig
from tests.tiny import MAT_FLOOR, byte_tokenizer, tiny_model

LAYERS = 6
SKIP_TOKENS = 24
SKIP_PROMPTS = ["def add(a, b):", "1, 2, 3, 4, 5,"]


@pytest.fixture(scope="module")
def target() -> LoadedModel:
    """Six layers; the middle two (the ones ``skip_layers=0.3`` skips) write little into the
    residual stream, so the view drafts close to the target and drafts get accepted."""
    model = tiny_model("qwen2", 41, layers=LAYERS)
    with torch.no_grad():
        for i in skipped_layers(LAYERS, 0.3):
            model.model.layers[i].self_attn.o_proj.weight.mul_(0.05)
            model.model.layers[i].mlp.down_proj.weight.mul_(0.05)
    return LoadedModel(model, byte_tokenizer(), "tiny-qwen2-6", torch.float32, torch.device("cpu"))


def test_the_view_shares_weights_and_leaves_the_target_alone(target: LoadedModel) -> None:
    model = target.model
    ids = torch.tensor([[5, 9, 2, 7, 1]])
    with torch.no_grad():
        before = model(ids).logits
        view = layer_skip_view(model, (2, 3))
        after, skipped = model(ids).logits, view(ids).logits
    assert torch.equal(before, after), "building a view must not change the target"
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(LAYERS))
    assert [layer.self_attn.layer_idx for layer in view.model.layers] == [0, 1, 2, 3]
    assert view.config.num_hidden_layers == 4 and model.config.num_hidden_layers == LAYERS
    assert view.model.layers[2].mlp.up_proj.weight.data_ptr() == model.model.layers[4].mlp.up_proj.weight.data_ptr()
    assert not torch.allclose(skipped, before), "a view that skips layers computes something else"
    assert view_of(model, 0.3) is view_of(model, 0.3), "one view per target and share"


def test_the_skipped_block_sits_in_the_middle() -> None:
    assert skipped_layers(28, 0.3) == tuple(range(10, 18))
    assert skipped_layers(6, 0.05) == (2,) and skipped_layers(6, 0.9) == (1, 2, 3, 4)
    assert skipped_layers(3, 0.05) == (1,) and skipped_layers(4, 0.3) == (1,)


def test_a_model_too_shallow_to_skip_a_layer_is_refused() -> None:
    """Two layers: the first and last are kept, so nothing could be skipped and the "draft"
    would be the target itself."""
    with pytest.raises(ConfigError, match="at least 3"):
        skipped_layers(2, 0.3)


def skip_reference(target: LoadedModel, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = target.model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                                    pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("step", ["dynamic", "static"])
@pytest.mark.parametrize("async_draft", [False, True])
@pytest.mark.parametrize("mode", ["adaptive", "static", "chain"])
def test_layerskip_is_lossless_without_a_draft_model(target: LoadedModel, mode: str, async_draft: bool,
                                                     step: str) -> None:
    engine = Engine(target, None, forward=step)
    cfg = RunConfig(drafter="layerskip", max_new_tokens=SKIP_TOKENS, async_draft=async_draft, skip_layers=0.3,
                    tree=TreeConfig(mode=mode, budget=8, root_k=3, top_k=2, min_conf=0.0, cost_aware=False))
    for prompt in SKIP_PROMPTS[:2]:
        summary, steps = generate(engine, prompt, cfg)
        # the reference's length is the run's asked length, not what the run gave: a cut run fails
        assert summary.token_ids == skip_reference(target, summary.prompt_token_ids, SKIP_TOKENS)
        assert summary.stop_reason == "max_new_tokens"
        assert summary.mean_accepted_tokens >= MAT_FLOOR, (prompt, summary.mean_accepted_tokens)
