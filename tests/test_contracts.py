"""The step loop's contracts (``talon.core.contracts``), used the way a new drafter would use them:
a toy draft source that always proposes the same token, built into a run through the public
names only, decodes exactly what the target's own greedy ``generate`` does."""

from __future__ import annotations

import pytest
import torch

from talon.atlas.loop import AtlasModel, TextVerifier
from talon.core.contracts import Drafter, DraftSource, Verifier
from talon.core.verify import TargetVerifier
from talon.cost.model import synthetic_costs
from talon.drafters import ModelSource, TreeDrafter, build_drafter
from talon.drafters.retrieval import Retriever
from talon.engine.prompt import StopCheck, eos_ids
from talon.engine.run import Run, RunParts
from talon.run_config import RunConfig, SamplingConfig, TreeConfig
from talon.trace import RunModels
from talon.tree import DraftTree
from tests.tiny import tiny_loaded


class SameToken:
    """A draft source that proposes ``token`` under every node, with a made-up confidence."""

    def __init__(self, token: int) -> None:
        self.token, self.context, self.expansions = token, [], 0

    engaged = True  # no prefill to pay
    pending = 0
    last_width = 1

    def reset(self, prompt_ids: list[int], prefill: bool = True) -> None:
        self.context = list(prompt_ids)

    def expand(self, tree: DraftTree, nodes: list[int], k: int) -> list[list[tuple[int, float]]]:
        self.expansions += 1
        return [[(self.token, 0.9)] for _ in nodes]

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        self.context.extend(new_tokens)

    def take_timings(self) -> list[tuple[int, float]]:
        return []


def test_the_contracts_name_what_the_loop_and_the_replay_use() -> None:
    tiny = tiny_loaded("llama", 1)
    recorded = AtlasModel.__new__(AtlasModel)  # the replay's source, without an atlas: its ledger only
    recorded.context, recorded.fed, recorded.timings = [], 0, []
    for source in (SameToken(1), ModelSource(tiny.model), recorded):
        assert isinstance(source, DraftSource), type(source).__name__
    cfg = RunConfig()
    assert isinstance(build_drafter(cfg, ModelSource(tiny.model), Retriever(cfg.retrieval)), Drafter)
    assert issubclass(TargetVerifier, Verifier) and issubclass(TextVerifier, Verifier)
    assert not isinstance(object(), DraftSource) and not issubclass(TreeDrafter, Verifier)


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
@pytest.mark.parametrize("tree", ["adaptive", "static", "chain"])
def test_a_toy_drafter_through_the_public_contract_is_lossless(drafter: str, tree: str) -> None:
    target = tiny_loaded("llama", 0)
    prompt = target.tokenizer("abc abc abc abc")["input_ids"]
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        want = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=24)[0, len(prompt):].tolist()
    toy = SameToken(want[0])  # right at the first step, a guess after
    cfg = RunConfig(drafter=drafter, max_new_tokens=24, chat_template=False,
                    tree=TreeConfig(mode=tree, budget=8, cost_aware=False))
    parts = RunParts(
        prompt_ids=prompt, prompt_text="abc abc abc abc",
        drafter=build_drafter(cfg, toy, Retriever(cfg.retrieval)),
        verifier=TargetVerifier(target.model, SamplingConfig()),
        stop=StopCheck(target.tokenizer, eos_ids(target), (), cfg.max_new_tokens),
        token_text=lambda t: target.tokenizer.decode([t]),
        detokenize=lambda t: target.tokenizer.decode(t),
        models=RunModels("tiny", "same-token", "float32", "cpu"),
    )
    run = Run(cfg, parts)
    steps = list(run)
    assert run.summary is not None and run.summary.token_ids == want[: len(run.summary.token_ids)]
    assert len(run.summary.token_ids) == 24 or run.summary.stop_reason == "eos"
    assert toy.expansions > 0 and any("model" in s.sources for s in steps)
    assert steps[0].accept_len >= 1  # the toy's first guess was the target's token


def tiny_parts(cfg: RunConfig, **extra) -> RunParts:
    """A run of the tiny pair through the public parts (hybrid drafter, the target verifying)."""
    target, draft = tiny_loaded("llama", 0), tiny_loaded("llama", 1)
    prompt = target.tokenizer("abc abc abc abc")["input_ids"]
    return RunParts(
        prompt_ids=prompt, prompt_text="abc abc abc abc",
        drafter=build_drafter(cfg, ModelSource(draft.model), Retriever(cfg.retrieval)),
        verifier=TargetVerifier(target.model, SamplingConfig()),
        stop=StopCheck(target.tokenizer, eos_ids(target), (), cfg.max_new_tokens),
        token_text=lambda t: target.tokenizer.decode([t]), detokenize=lambda t: target.tokenizer.decode(t),
        models=RunModels("tiny", "tiny", "float32", "cpu"), **extra,
    )


def test_a_replay_s_step_times_are_the_cost_model_s_laid_end_to_end() -> None:
    costs = synthetic_costs({1: 0.010, 8: 0.030, 32: 0.070}, {1: 0.002, 8: 0.004, 32: 0.008}, other_s=0.001)
    cfg = RunConfig(max_new_tokens=16, chat_template=False, cost_model="fixed",
                    tree=TreeConfig(budget=8, min_conf=0.0))
    run = Run(cfg, tiny_parts(cfg, costs=costs.copy(), predicted_times=costs))
    steps, start = list(run), 0.0
    for st in steps:
        assert st.verify_s == pytest.approx(costs.verify_s(len(st.tokens))) and st.other_s == costs.other_s
        assert (st.draft_s > 0) == (st.draft_forwards > 0)
        assert st.drafter_busy == [pytest.approx((start, start + st.draft_s))]
        assert st.verifier_busy == [pytest.approx((start + st.draft_s, start + st.draft_s + st.verify_s))]
        assert st.predicted_verify_s == pytest.approx(st.verify_s)  # planned on the same curves
        start += st.draft_s + st.verify_s + st.other_s
    assert run.summary.seconds == pytest.approx(start) and any(st.draft_forwards for st in steps)


def test_a_run_s_step_times_come_from_one_clock_record() -> None:
    cfg = RunConfig(max_new_tokens=16, chat_template=False, tree=TreeConfig(budget=8, cost_aware=False))
    steps = list(Run(cfg, tiny_parts(cfg)))
    end = 0.0
    for st in steps:
        (d0, d1), ((v0, v1),) = st.drafter_busy[-1], st.verifier_busy
        assert d1 - d0 == pytest.approx(st.draft_s) and v1 - v0 == pytest.approx(st.verify_s)
        assert end <= d0 <= d1 <= v0 <= v1 and st.other_s >= 0  # sync: draft, then verify, step after step
        assert st.predicted_verify_s is None  # nothing planned: nothing predicted
        end = v1


class Slots:
    """A slot cache as ``talon.graphs.static`` lays it out: per layer, (B, H, max_len, D) keys and values."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.layers = [type("Layer", (), {"keys": k, "values": v})() for k, v in zip(keys, values)]


@pytest.mark.parametrize("seed", range(6))
def test_both_kv_cuts_keep_the_same_entries(seed: int) -> None:
    """``KVCut``'s two implementations on one cache's entries: after the cut, the growing cache and
    the slot cache hold the same first ``start + K`` entries, in the same order (a path kept in
    place, a path moved, and a path that keeps only the root among them)."""
    from transformers import DynamicCache

    from talon.core.contracts import KVCut
    from talon.core.kv import keep_dynamic, keep_slots

    gen = torch.Generator().manual_seed(seed)
    start, tree = 5 + seed, 3 + 2 * seed
    slots = sorted(torch.randperm(tree, generator=gen)[: seed % 4 + 1].tolist())
    if seed == 0:
        slots = [0]  # the root alone: nothing moves
    slots = [start + s for s in slots]
    entries = [(torch.randn(1, 2, start + tree, 4, generator=gen), torch.randn(1, 2, start + tree, 4, generator=gen))
               for _ in range(3)]  # (B, H, S, D) per layer
    dynamic = DynamicCache()
    for i, (k, v) in enumerate(entries):
        dynamic.update(k.clone(), v.clone(), i)
    padding = torch.full((1, 2, 7, 4), float("nan"))  # slots past the tree: never read
    fixed = Slots([torch.cat([k, padding], dim=2) for k, _ in entries],
                  [torch.cat([v, padding], dim=2) for _, v in entries])
    cuts: list[KVCut] = [keep_dynamic, keep_slots]
    cuts[0](dynamic, start, slots)
    cuts[1](fixed, start, slots)
    kept = start + len(slots)
    for i, (k, v) in enumerate(entries):
        want = torch.cat([k[:, :, :start], k[:, :, slots]], dim=2)
        assert torch.equal(dynamic.layers[i].keys, want) and dynamic.layers[i].keys.shape[2] == kept
        assert torch.equal(fixed.layers[i].keys[:, :, :kept], want)
        assert torch.equal(fixed.layers[i].values[:, :, :kept], dynamic.layers[i].values)
