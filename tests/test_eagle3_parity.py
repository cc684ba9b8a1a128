"""Talon's EAGLE-3 head against a reference implementation's own (``data/eagle3_parity``, written
by ``bash scripts/eagle3_parity.sh``: the speculators library's ``Eagle3DraftModel``, saved with its
``save_pretrained``). Loaded in that layout and rewritten in the EAGLE / SpecForge one, Talon's
head gives the reference's logits and top-k at both draft levels, and its drafter's tree path
the same: a node's parent output fed back at the next position, seeing the committed pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

from talon.core.verify import additive_mask
from talon.drafters.eagle3 import HeadDrafter
from talon.models.eagle3 import Eagle3Head, load_head
from talon.tree import DraftTree
from tests.tiny import tiny_model

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "eagle3_parity"
TOL = 1e-4


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads((FIXTURE / "reference.json").read_text(encoding="utf-8"))


def target_for(ref: dict) -> torch.nn.Module:
    """A target of the head's shape: its width, vocabulary and six layers (features from 2, 3, 3)."""
    return tiny_model("llama", 0, layers=6, hidden=ref["shape"]["hidden"], vocab=ref["shape"]["vocab"])


def eagle_layout(tmp: Path) -> Path:
    """The fixture's head rewritten as EAGLE's trainer and SpecForge write one: ``midlayer.*``, a
    flat Llama config with ``draft_vocab_size``, no embedding (the target's is used)."""
    raw = json.loads((FIXTURE / "head" / "config.json").read_text(encoding="utf-8"))
    layer = raw["transformer_layer_config"]
    config = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": raw["draft_vocab_size"],
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": raw["eagle_aux_hidden_state_layer_ids"]}}
    written = load_file(str(FIXTURE / "head" / "model.safetensors"))
    tensors = {k.replace("layers.0.", "midlayer."): v for k, v in written.items() if k != "embed_tokens.weight"}
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_file(tensors, str(tmp / "model.safetensors"))
    return tmp


def loaded(ref: dict, layout: str, tmp: Path) -> Eagle3Head:
    target = target_for(ref)
    if layout == "eagle":  # no embedding of its own: the target's is the reference's
        embedding = load_file(str(FIXTURE / "head" / "model.safetensors"))["embed_tokens.weight"]
        target.get_input_embeddings().weight.data.copy_(embedding)
        return load_head(eagle_layout(tmp), target, torch.float32, torch.device("cpu"))
    return load_head(FIXTURE / "head", target, torch.float32, torch.device("cpu"))


def levels(head: Eagle3Head, ref: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's two draft levels, teacher-forced: level 0 row t is (feature t, token t + 1)
    at position t; level 1 row t is (level 0's out at t, token t + 2) at t + 1, seeing level 0's
    entries up to t and itself. (The reference's last level-1 row feeds a padding token: not compared.)"""
    features, tokens = torch.tensor(ref["features"]), torch.tensor(ref["tokens"])
    n = features.shape[0]
    cache = DynamicCache()
    causal = torch.ones(n, n, dtype=torch.bool).tril()  # (n, n)
    with torch.inference_mode():
        out, level0 = head(features, tokens[1:n + 1], torch.arange(n), cache, additive_mask(causal, torch.float32))
        visible = torch.cat([causal, torch.eye(n, dtype=torch.bool)], dim=1)  # (n, 2n)
        _, level1 = head(out, tokens[2:n + 2], torch.arange(1, n + 1), cache, additive_mask(visible, torch.float32))
    return level0, level1


@pytest.mark.parametrize("layout", ["speculators", "eagle"])
def test_the_heads_logits_and_top_k_are_the_references(reference: dict, layout: str, tmp_path: Path) -> None:
    head = loaded(reference, layout, tmp_path)
    level0, level1 = levels(head, reference)
    for got, want in ((level0, "level0_logits"), (level1[:-1], "level1_logits")):
        expected = torch.tensor(reference[want][:got.shape[0]])
        assert torch.allclose(got, expected, atol=TOL), (layout, want, float((got - expected).abs().max()))
        assert torch.equal(got.topk(4, dim=-1).indices, expected.topk(4, dim=-1).indices)


def test_the_drafters_tree_path_is_the_references(reference: dict, tmp_path: Path) -> None:
    """The root's children and a child's own children, through ``HeadDrafter``: the committed
    pairs fed in one forward, then the child fed its parent's output at the next position."""
    head = loaded(reference, "speculators", tmp_path)
    features, tokens = torch.tensor(reference["features"]), reference["tokens"]
    n = features.shape[0]
    drafter = HeadDrafter(head, head.cfg.layers_for(6))
    drafter.reset(tokens[:n])  # the root is token n - 1: its pair is (feature n - 2, token n - 1)
    drafter.add_features(features[:n - 1])
    tree = DraftTree.with_root(tokens[n - 1])
    k = 4
    d2t = head.d2t
    want0 = torch.tensor(reference["level0_logits"][n - 2]).topk(k)
    children = drafter.expand(tree, [0], k)[0]
    assert [t for t, _ in children] == (want0.indices + d2t[want0.indices]).tolist()
    node = tree.add(0, tokens[n], 0.5, "model")  # the reference's level 1 feeds token n here
    want1 = torch.tensor(reference["level1_logits"][n - 2]).topk(k)
    grandchildren = drafter.expand(tree, [node], k)[0]
    assert [t for t, _ in grandchildren] == (want1.indices + d2t[want1.indices]).tolist()
    q = torch.softmax(torch.tensor(reference["level1_logits"][n - 2]), dim=-1).topk(k).values
    assert torch.allclose(torch.tensor([p for _, p in grandchildren]), q, atol=TOL)


def test_a_residual_taken_after_the_norm_is_caught(reference: dict, tmp_path: Path) -> None:
    """Planted: ``norm_before_residual`` read as true (vLLM's default for a speculators config
    without the key; this one says false): the logits part from the reference's."""
    raw = json.loads((FIXTURE / "head" / "config.json").read_text(encoding="utf-8"))
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((FIXTURE / "head" / name).read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "norm_before_residual": True}), encoding="utf-8")
    head = load_head(tmp_path, target_for(reference), torch.float32, torch.device("cpu"))
    level0, _ = levels(head, reference)
    assert not torch.allclose(level0, torch.tensor(reference["level0_logits"]), atol=TOL)
