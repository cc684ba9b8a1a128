"""The step loop's contracts (``talon.drafters.base``), used the way a new drafter would use them:
a toy draft source that always proposes the same token, built into a run through the public
names only, decodes exactly what the target's own greedy ``generate`` does."""

from __future__ import annotations

import pytest
import torch

from talon.atlas.replay import AtlasModel, TextVerifier
from talon.decode import Run, RunModels, RunParts
from talon.prompt import StopCheck, eos_ids
from talon.drafters import Drafter, DraftSource, HybridDrafter, ModelDrafter, Verifier, build_drafter
from talon.drafters.retrieval import RetrievalDrafter
from talon.run_config import RunConfig, SamplingConfig, TreeConfig
from talon.tree import DraftTree
from talon.verify import TargetVerifier
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
    for source in (SameToken(1), ModelDrafter(tiny.model), recorded):
        assert isinstance(source, DraftSource), type(source).__name__
    cfg = RunConfig()
    assert isinstance(build_drafter(cfg, ModelDrafter(tiny.model), RetrievalDrafter(cfg.retrieval)), Drafter)
    assert issubclass(TargetVerifier, Verifier) and issubclass(TextVerifier, Verifier)
    assert not isinstance(object(), DraftSource) and not issubclass(HybridDrafter, Verifier)


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
        drafter=build_drafter(cfg, toy, RetrievalDrafter(cfg.retrieval)),
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
