"""Lossless at the GPU presets' real depth and attention shape, on the CPU.

The tiny models of the rest of the suite have 2 layers: a bug that only shows at depth (a tree
mask, a position id or a cache move that is slightly wrong, amplified through 28 layers) would
pass them. Here the target has the preset's full depth, head size and grouped-query shape (Qwen2.5
7B: 28 layers, head_dim 128, 7 query heads a KV head; Llama 3.1 8B: 32 layers, 4 a KV head) with
fewer heads (``slim``: what a tree position or mask bug needs is the depth and the attention's
shape, not its width, ``experiments/check_model_width.py`` covers the real width), a
narrow MLP and a reduced vocabulary so it fits the CPU and CI's time; the draft has its preset's
full depth too. The weights are the GPU check's conditioned init
(``talon/gpucheck/check_model.py``), so the model agrees with itself however a sequence is split and a
failure is a bug, not noise: the gate proves that first, and the old init trips it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from talon.engine.engine import Engine, generate
from talon.gpucheck.check_model import PLANTS, SPLIT_BOUND, build_model, chain_prompt, conditioning, planted
from talon.gpucheck.pairs import byte_tokenizer, random_ids, reference
from talon.models import LoadedModel
from talon.models.memory import KNOWN_SHAPES, ModelShape
from talon.run_config import RunConfig, TreeConfig
from talon.server.presets import PRESETS
from tests.tiny import CPU

NARROW = 256  # MLP width: the depth and the attention are real, the MLP and vocabulary are not
DRAFT_VOCAB = 2048  # the draft's; the target keeps its preset's extra ids on top
DEPTH_TOKENS = 16
FAMILIES = ("qwen2.5-7b", "llama-3.1-8b")  # one preset per family: the coder and 14B pairs share these shapes
DEPTH_DRAFTERS, MODES = ("retrieval", "model", "hybrid"), ("adaptive", "static", "chain")


def slim(shape: ModelShape) -> int:
    """Heads, KV heads and hidden size are divided by this; depth, head size and query heads per KV
    head are kept. The most that leaves two KV heads (a grouped-query bug needs more than one: Llama
    8B's 8 become 2, Qwen 7B's 4 become 2), and at least 2."""
    return max(shape.kv_heads // 2, 2)


def narrow(shape: ModelShape, vocab: int, factor: int) -> ModelShape:
    return dataclasses.replace(shape, intermediate=NARROW, vocab=vocab, hidden=shape.hidden // factor,
                               heads=shape.heads // factor, kv_heads=max(shape.kv_heads // factor, 1))


def preset_shapes(key: str) -> tuple[ModelShape, ModelShape, str]:
    """(target, draft, family) of a GPU preset at full depth and attention, narrowed."""
    preset = next(p for p in PRESETS if p.key == key)
    target, draft = KNOWN_SHAPES[preset.target or ""], KNOWN_SHAPES[preset.draft or ""]
    extra = target.vocab - draft.vocab
    return narrow(target, DRAFT_VOCAB + extra, slim(target)), narrow(draft, DRAFT_VOCAB, slim(draft)), target.family


def preset_loaded(shape: ModelShape, family: str, seed: int, init: str = "conditioned") -> LoadedModel:
    model = build_model(shape, family, seed, torch.float32, CPU, init, chain_vocab=DRAFT_VOCAB, untie=True)
    return LoadedModel(model, byte_tokenizer(shape.vocab), f"check-{family}-{seed}", torch.float32, CPU)


@dataclasses.dataclass
class Pair:
    key: str
    engine: Engine
    prompts: dict[str, tuple[list[int], list[int]]]  # name -> (prompt ids, generate()'s tokens)

    @property
    def ids(self) -> list[int]:
        return self.prompts["random"][0]


def test_the_gate_passes_the_conditioned_init_at_every_preset_depth_and_trips_the_old_one() -> None:
    """Every GPU preset's depth (heads narrowed: depth is what conditions), then the old init at
    the 7B's real attention width, where it is chaotic. First in the module, before its pairs
    are built: its wide model (3.3 GB) then stands alone, not beside them (2 GB)."""
    ids = random_ids(DRAFT_VOCAB, 48, 3)
    for preset in (p for p in PRESETS if p.needs_cuda and not p.head and not p.mtp and p.target in KNOWN_SHAPES):
        shape, _, family = preset_shapes(preset.key)  # a quarter of the heads, whatever the pair's slim
        shape = narrow(shape, shape.vocab, 4 // slim(KNOWN_SHAPES[preset.target or ""]))
        gate = conditioning(build_model(shape, family, 1, torch.float32, CPU, chain_vocab=DRAFT_VOCAB), ids)
        assert gate.valid and gate.layers == shape.layers, (preset.key, gate)
    narrowed, _, family = preset_shapes("qwen2.5-7b")
    wide = narrow(KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"], narrowed.vocab, 1)
    old = conditioning(build_model(wide, family, 1, torch.float32, CPU, "sharp"), ids)
    assert not old.valid and old.split_vs_full > 100 * SPLIT_BOUND and "split against full" in old.why, old


@pytest.fixture(scope="module", params=FAMILIES)
def depth_pair(request: pytest.FixtureRequest) -> Pair:
    """Two prompts: random ids (the model source's trees accepted at depth) and one ending on a
    walk of the chain it walked before (retrieval's trees accepted at depth)."""
    target_shape, draft_shape, family = preset_shapes(request.param)
    target, draft = preset_loaded(target_shape, family, 1), preset_loaded(draft_shape, family, 2)
    prompts = {"random": random_ids(DRAFT_VOCAB, 48, 3), "chain": chain_prompt(DRAFT_VOCAB, 48, 3)}
    return Pair(request.param, Engine(target, draft),
                {name: (ids, reference(target, ids, DEPTH_TOKENS)) for name, ids in prompts.items()})


def config(drafter: str, mode: str, async_draft: bool = False) -> RunConfig:
    tree = TreeConfig(mode=mode, budget=16, root_k=4, top_k=2, mu=0.1, max_depth=8, min_conf=0.0, cost_aware=False)
    return RunConfig(drafter=drafter, tree=tree, max_new_tokens=DEPTH_TOKENS, chat_template=False, draft_vocab=0,
                     async_draft=async_draft)


def test_the_full_depth_models_have_the_presets_attention_and_are_well_conditioned(depth_pair: Pair) -> None:
    target_shape, draft_shape, _ = preset_shapes(depth_pair.key)
    preset = next(p for p in PRESETS if p.key == depth_pair.key)
    real = KNOWN_SHAPES[preset.target or ""]
    assert target_shape.head_dim == real.head_dim == 128 and target_shape.layers == real.layers
    assert target_shape.heads // target_shape.kv_heads == real.heads // real.kv_heads
    for lm, shape in ((depth_pair.engine.target, target_shape), (depth_pair.engine.draft, draft_shape)):
        cfg = lm.model.config
        assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size) == (
            shape.layers, shape.heads, shape.kv_heads, shape.hidden)
        gate = conditioning(lm.model, depth_pair.ids)
        assert gate.valid and gate.split_vs_full <= SPLIT_BOUND, gate


def test_every_drafter_and_tree_mode_equals_generate_at_full_depth(depth_pair: Pair) -> None:
    mats, wrong = {}, []
    every = [(d, m, False) for d in DEPTH_DRAFTERS for m in MODES] + [("hybrid", "adaptive", True)]
    runs = {"random": every, "chain": [("retrieval", m, False) for m in MODES]}
    for prompt, (ids, want) in depth_pair.prompts.items():
        for drafter, mode, async_draft in runs[prompt]:
            summary, _ = generate(depth_pair.engine, ids, config(drafter, mode, async_draft))
            mats[(prompt, drafter, mode, async_draft)] = summary.mean_accepted_tokens
            if summary.token_ids != want:
                wrong.append((prompt, drafter, mode, async_draft))
    static = Engine(depth_pair.engine.target, depth_pair.engine.draft, forward="static")  # talon/graphs/static.py
    for prompt, drafter, mode in (("random", "hybrid", "adaptive"), ("random", "model", "static"),
                                  ("chain", "retrieval", "chain")):
        ids, want = depth_pair.prompts[prompt]
        if generate(static, ids, config(drafter, mode))[0].token_ids != want:
            wrong.append((prompt, drafter, mode, "static forward"))
    assert not wrong, f"{depth_pair.key}: differs from generate() for {wrong}"
    # the check has teeth only where drafts are accepted at depth: every configuration the draft
    # model drafts in must be (retrieval's, on the chain prompt, are on Qwen's shapes only, and
    # share the one verify path)
    low = {run: round(m, 2) for run, m in mats.items() if run[1] in ("model", "hybrid") and m < 1.5}
    assert not low, f"{depth_pair.key}: below MAT 1.5: {low}"


@pytest.mark.parametrize("bug", sorted(PLANTS))
def test_a_planted_bug_at_depth_fails(depth_pair: Pair, bug: str) -> None:
    """Position ids below the root one too far, or a tree mask that shows siblings
    (``check_model.PLANTS``, the GPU check's ``--plant``)."""
    ids, want = depth_pair.prompts["random"]
    caught = []
    with planted(bug):
        for drafter, mode in (("hybrid", "adaptive"), ("model", "static"), ("hybrid", "static"), ("model", "adaptive")):
            if generate(depth_pair.engine, ids, config(drafter, mode))[0].token_ids != want:
                caught.append((drafter, mode))
                break  # the lossless test above runs these configurations: one differing fails it
    assert caught, f"{depth_pair.key}: {bug} went unnoticed"
