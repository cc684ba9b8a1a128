"""Talon's EAGLE-3 head against a reference implementation's own (``data/eagle3_parity``, written
by ``bash scripts/eagle3_parity.sh``: the speculators library's ``Eagle3DraftModel``, saved with its
``save_pretrained``). Two heads: ``head`` (ids written, the residual before the norm) and
``variant`` (``norm_before_residual``, a flat theta of 1e6 with ``llama3`` scaling, a head narrower
than its target). Loaded in that layout and rewritten in the EAGLE / SpecForge one (ids written
SpecForge's way), Talon's head gives the reference's logits and top-k at four draft levels, and its
drafter the same over a branching tree and four steps, three of them after a commit that cuts the
head's cache back and feeds the accepted tokens again with the target's features."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

from talon.core.forward import additive_mask
from talon.core.kv import gather_entries
from talon.drafters.eagle3 import HeadSource
from talon.drafters.model import path_key
from talon.models.eagle3 import Eagle3Head, load_head
from talon.tree import DraftTree
from tests.tiny import tiny_model

PARITY_DIR = Path(__file__).resolve().parents[1] / "data" / "eagle3_parity"
HEADS = ("head", "variant")
LAYOUTS = ("speculators", "eagle")
TOL = 1e-4
TARGET_LAYERS = 6  # the head reads the hidden states entering layers 2, 3 and 3 (variant: 2, 3, 3 by default too)
K = 4


@pytest.fixture(scope="module", params=HEADS)
def parity_reference(request: pytest.FixtureRequest) -> dict:
    return json.loads((PARITY_DIR / f"{request.param}.json").read_text(encoding="utf-8"))


def target_for(ref: dict) -> torch.nn.Module:
    """A target of the head's feature width and vocabulary, six layers deep."""
    return tiny_model("llama", 0, layers=TARGET_LAYERS, hidden=ref["shape"]["target_hidden"],
                      vocab=ref["shape"]["vocab"])


def eagle_layout(ref: dict, tmp: Path, as_bin: bool = False) -> Path:
    """The fixture's head rewritten as EAGLE's trainer and SpecForge write one: ``midlayer.*``, a
    flat Llama config with ``draft_vocab_size``, ids in ``eagle_config`` as "the output of layer
    i" (one less than speculators' index), no embedding where the target's fits."""
    src = PARITY_DIR / ref["head"]
    raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    layer = raw["transformer_layer_config"]
    config = {**layer, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": raw["draft_vocab_size"],
              "norm_before_residual": raw["norm_before_residual"], "target_hidden_size": raw["target_hidden_size"]}
    if raw["eagle_aux_hidden_state_layer_ids"]:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in
                                                                       raw["eagle_aux_hidden_state_layer_ids"]]}
    narrow = ref["shape"]["target_hidden"] != ref["shape"]["hidden"]
    tensors = {k.replace("layers.0.", "midlayer."): v for k, v in load_file(str(src / "model.safetensors")).items()
               if narrow or k != "embed_tokens.weight"}
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if as_bin:  # yuhuili's heads: a torch pickle, no embedding
        torch.save(tensors, tmp / "pytorch_model.bin")
    else:
        save_file(tensors, str(tmp / "model.safetensors"))
    return tmp


def parity_loaded(ref: dict, layout: str, tmp: Path, as_bin: bool = False) -> Eagle3Head:
    target = target_for(ref)
    if layout == "eagle":
        if ref["shape"]["target_hidden"] == ref["shape"]["hidden"]:  # the target's embedding is the reference's
            embedding = load_file(str(PARITY_DIR / ref["head"] / "model.safetensors"))["embed_tokens.weight"]
            target.get_input_embeddings().weight.data.copy_(embedding)
        return load_head(eagle_layout(ref, tmp, as_bin), target, torch.float32, torch.device("cpu"))
    return load_head(PARITY_DIR / ref["head"], target, torch.float32, torch.device("cpu"))


def teacher_forced(head: Eagle3Head, ref: dict) -> list[torch.Tensor]:
    """The reference's draft levels, teacher-forced: level k row t is (level k - 1's out at t,
    token t + k + 1) at position t + k, seeing level 0 up to t and its own chain."""
    features, tokens = torch.tensor(ref["features"]), torch.tensor(ref["tokens"])
    n = features.shape[0]
    cache = DynamicCache()
    causal = torch.ones(n, n, dtype=torch.bool).tril()  # (n, n)
    out, levels = features, []
    with torch.inference_mode():
        for k in range(len(ref["levels"])):
            visible = torch.cat([causal] + [torch.eye(n, dtype=torch.bool)] * k, dim=1)  # (n, (k + 1) n)
            out, logits = head(out, tokens[k + 1:k + 1 + n], torch.arange(k, k + n), cache,
                               additive_mask(visible, torch.float32))
            levels.append(logits[:n - k])  # the reference's last k rows fed padding
    return levels


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_heads_logits_and_top_k_are_the_references_at_four_levels(parity_reference: dict, layout: str,
                                                                      tmp_path: Path) -> None:
    head = parity_loaded(parity_reference, layout, tmp_path)
    for k, got in enumerate(teacher_forced(head, parity_reference)):
        want = torch.tensor(parity_reference["levels"][k][:got.shape[0]])
        assert torch.allclose(got, want, atol=TOL), (parity_reference["head"], layout, k,
                                                     float((got - want).abs().max()))
        assert torch.equal(got.topk(K, dim=-1).indices, want.topk(K, dim=-1).indices)


def topk(logits: list[float], d2t: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The reference's top-k children of a node: target ids and q."""
    q, ids = torch.softmax(torch.tensor(logits), dim=-1).topk(K)
    return (ids + d2t[ids]).tolist(), q


def drafted_steps(head: Eagle3Head, ref: dict, drafter: HeadSource, accepts: tuple[int, ...] = (2, 3, 0)) -> float:
    """Talon's drafter over ``len(accepts) + 1`` steps, each a branching tree four levels deep: the
    root's children, then the reference's chain (tokens m + 1, m + 2, m + 3) with a sibling branch
    fed beside it in every layer, which the chain must not see. After each step the chain's first
    ``a`` nodes are accepted (with the bonus token) and committed, their features handed over as
    the target's verification would. Asserts the top-k ids; returns the largest q difference."""
    features, tokens, levels = torch.tensor(ref["features"]), ref["tokens"], ref["levels"]
    m = 4  # the root's index: the prompt is tokens[:m + 1]
    drafter.reset(tokens[:m + 1])
    drafter.add_features(features[:m])
    worst = 0.0
    for accept in (*accepts, None):
        tree = DraftTree.with_root(tokens[m])
        chain, side = 0, 0
        for depth in range(4):
            nodes = [side, chain] if depth else [0]
            got = drafter.expand(tree, nodes, K)[-1]
            want_ids, want_q = topk(levels[depth][m - 1], head.d2t)
            assert [t for t, _ in got] == want_ids, (ref["head"], m, depth)
            worst = max(worst, float((torch.tensor([q for _, q in got]) - want_q).abs().max()))
            if depth < 3:
                chain = tree.add(chain, tokens[m + depth + 1], 0.5, "model")
                other = next(t for t, _ in got if t != tokens[m + depth + 1])
                side = tree.add(side if depth else 0, other, 0.5, "model")
        if accept is None:
            return worst
        path = tree.path(chain)[1:accept + 1]
        drafter.commit(tree, path, tokens[m + 1:m + accept + 2])  # the accepted tokens and the bonus
        drafter.add_features(features[m:m + accept + 1])  # the verification's features: root and accepted
        m += accept + 1
    return worst


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_drafters_trees_are_the_references_over_four_steps(parity_reference: dict, layout: str,
                                                               tmp_path: Path) -> None:
    head = parity_loaded(parity_reference, layout, tmp_path)
    drafter = HeadSource(head, head.cfg.layers_for(TARGET_LAYERS))
    with torch.inference_mode():
        assert drafted_steps(head, parity_reference, drafter) < TOL


def test_a_commit_that_keeps_the_draft_time_states_is_caught(parity_reference: dict, tmp_path: Path) -> None:
    """Planted: the accepted nodes' cache entries kept as committed pairs (their inputs were the
    head's own outputs, not the target's features), so nothing is fed again."""

    class Planted(HeadSource):
        def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
            keep = list(range(self.fed)) + [self.slots[path_key(tree, n)] for n in accepted]
            gather_entries(self.cache, keep)
            self.fed += len(accepted)
            self.slots, self.outs = {}, {}
            self.context.extend(new_tokens)

    head = parity_loaded(parity_reference, "speculators", tmp_path)
    with torch.inference_mode(), pytest.raises(AssertionError):
        assert drafted_steps(head, parity_reference, Planted(head, head.cfg.layers_for(TARGET_LAYERS))) < TOL


def test_specforges_ids_read_the_same_hidden_states_as_speculators(tmp_path: Path) -> None:
    """The ``head`` fixture's ids, 2, 3 and 3 in speculators' top-level field, are 1, 2 and 2 in
    SpecForge's ``eagle_config``: both read the same target hidden states, so the same logits on
    a real target's features; read as written, SpecForge's would take a layer earlier."""
    ref = json.loads((PARITY_DIR / "head.json").read_text(encoding="utf-8"))
    heads = {layout: parity_loaded(ref, layout, tmp_path / layout) for layout in LAYOUTS}
    assert heads["eagle"].cfg.layers_for(TARGET_LAYERS) == heads["speculators"].cfg.layers_for(TARGET_LAYERS)
    target = target_for(ref)
    ids = torch.tensor([ref["tokens"][:12]])
    with torch.inference_mode():
        hidden = target(input_ids=ids, output_hidden_states=True).hidden_states

        def logits(head: Eagle3Head, layers: tuple[int, ...]) -> torch.Tensor:
            g = torch.cat([hidden[i][0] for i in layers], dim=-1)[:-1]  # (11, 3H)
            mask = additive_mask(torch.ones(11, 11, dtype=torch.bool).tril(), torch.float32)
            return head(g, ids[0, 1:], torch.arange(11), DynamicCache(), mask)[1]
        read = {layout: logits(h, h.cfg.layers_for(TARGET_LAYERS)) for layout, h in heads.items()}
        early = logits(heads["eagle"], (1, 2, 2))
    assert torch.allclose(read["eagle"], read["speculators"], atol=TOL)
    assert not torch.allclose(early, read["speculators"], atol=TOL)


def test_a_pickled_head_without_an_embedding_loads(tmp_path: Path) -> None:
    """yuhuili's heads: ``pytorch_model.bin`` with no ``embed_tokens`` (the target's is used)."""
    ref = json.loads((PARITY_DIR / "head.json").read_text(encoding="utf-8"))
    head = parity_loaded(ref, "eagle", tmp_path, as_bin=True)
    assert not list(tmp_path.glob("*.safetensors"))
    level0 = teacher_forced(head, ref)[0]
    assert torch.allclose(level0, torch.tensor(ref["levels"][0]), atol=TOL)


def test_the_residual_taken_on_the_wrong_side_of_the_norm_is_caught(parity_reference: dict, tmp_path: Path) -> None:
    """Planted: ``norm_before_residual`` flipped (vLLM's default for a speculators config without
    the key is true; the ``head`` fixture says false, the variant true): the logits part."""
    src = PARITY_DIR / parity_reference["head"]
    raw = json.loads((src / "config.json").read_text(encoding="utf-8"))
    (tmp_path / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "norm_before_residual": not raw["norm_before_residual"]}),
                                          encoding="utf-8")
    head = load_head(tmp_path, target_for(parity_reference), torch.float32, torch.device("cpu"))
    level0 = teacher_forced(head, parity_reference)[0]
    assert not torch.allclose(level0, torch.tensor(parity_reference["levels"][0]), atol=TOL)
