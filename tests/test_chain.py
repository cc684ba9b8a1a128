"""TALON's adaptive tree grown on the device (talon/graphs/chain.py) against the host's builder: the same
tree, node for node and float for float, through grafts that merge, calibrated scores, the cost
planner, the budget and the gates, over several committed steps; layers launched past the
tree's stop change nothing; the layer update reads no value on the host (it runs on the meta
device); each of a planted bug in the merge, the budget cut and the planner's check fails; and
a run through the engine stays lossless."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

import talon.graphs.chain
from talon.core.builder import build_tree, path_confidence
from talon.cost.model import synthetic_costs
from talon.cost.plan import CalibratedAcceptance, Planner
from talon.drafters.model import ModelSource
from talon.drafters.static_draft import StaticModelSource
from talon.graphs.chain import ChainShape, ChainState, StepTables
from talon.graphs.pool import StaticPool
from talon.graphs.static import BUCKETS, Bucket, bucket_for
from talon.run_config import TreeConfig
from talon.tree import DraftTree
from tests.tiny import tiny_model

CHAIN_PROMPT = list(range(3, 23))
CHAIN_COSTS = synthetic_costs({1: 0.010, 8: 0.0102, 16: 0.0106, 32: 0.0115, 64: 0.014},
                        {1: 0.0004, 8: 0.0005, 32: 0.0007}, other_s=0.001)


@pytest.fixture(scope="module")
def chain_model():  # noqa: ANN201
    return tiny_model("qwen2", seed=3, layers=2)


def grafted(chain_model, context: list[int], rng: random.Random) -> DraftTree:  # noqa: ANN001
    """A retrieval graft the draft model will partly propose too (so some of its proposals
    merge, ``both``): the model's own best root child and its best child, and a stray token."""
    peek = ModelSource(chain_model)
    peek.reset(context)
    tree = DraftTree.with_root(context[-1])
    (first, q1), (second, _) = peek.expand(tree, [0], 2)[0]
    a = tree.add(0, first, 0.6, "retrieval")
    b = tree.add(a, peek.expand(tree, [a], 1)[0][0][0], 0.5, "retrieval")
    tree.add(b, rng.randrange(200), 0.4, "retrieval")
    if rng.random() < 0.5:
        tree.add(0, second, 0.3, "retrieval")
    return tree


def chain_drafting(chain_model, cfg: TreeConfig, chain: bool, calibrated: bool, costs: bool, ahead: bool = False,  # noqa: ANN001
             steps: int = 5, seed: int = 0, rehearse: bool = False,
             drafters: list | None = None) -> list[tuple[DraftTree, list[int]]]:
    """``steps`` trees grown by the host's builder or on the device, each step's best path
    committed; per step the tree and the planner's forward widths (``drafters``: gets the
    drafter, to look at after)."""
    width = bucket_for(cfg.budget)
    pool = StaticPool(chain_model, drafts=True, buckets=(width, 257))  # one layer bucket: the same shapes both ways
    drafter = StaticModelSource(chain_model, pool, tokens=400, chain=chain, ahead=ahead, rehearse=rehearse)
    drafter.reset(CHAIN_PROMPT)
    if drafters is not None:
        drafters.append(drafter)
    acceptance = CalibratedAcceptance()
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        shared = grafted(chain_model, drafter.context, rng)
        match_len = rng.randrange(6)
        planner = Planner(CHAIN_COSTS, cfg, 64, predicted=True, acceptance=acceptance) if costs else None
        if planner is not None:
            planner.begin_step()
        if chain:
            tree = drafter.chained_tree(shared, cfg, match_len, acceptance, calibrated, planner)
        else:
            def expand(tree, nodes, k):  # noqa: ANN001, ANN202 - the hybrid drafter's reporting expand
                children = drafter.expand(tree, nodes, k)
                if planner is not None:
                    planner.forward_done(drafter.last_width)
                return children

            scores = (lambda t: acceptance.node_probs(t, match_len)) if calibrated else path_confidence
            tree = build_tree(shared, expand, cfg, cfg.budget, planner, match_len, scores)
        out.append((tree, list(planner.step_widths) if planner is not None else []))
        path = tree.path(tree.best_leaf())
        acceptance.observe(tree, path, match_len)
        drafter.commit(tree, path, [tree.tokens[n] for n in path[1:]] + [rng.randrange(200)])
        drafter.take_timings()
    return out


def same(a: DraftTree, b: DraftTree) -> bool:
    return (a.tokens, a.parents, a.q_draft, a.path_conf, a.sources, a.gates, a.stop) == \
        (b.tokens, b.parents, b.q_draft, b.path_conf, b.sources, b.gates, b.stop)


CASES = {
    "confidence": (TreeConfig(mode="adaptive", budget=12, root_k=3, top_k=2, mu=0.05, max_depth=6, min_conf=0.0,
                              cost_aware=False, admission="confidence"), False, False),
    "calibrated": (TreeConfig(mode="adaptive", budget=10, root_k=4, top_k=3, mu=0.02, max_depth=7, min_conf=0.0,
                              cost_aware=False), True, False),
    "planner": (TreeConfig(mode="adaptive", budget=24, root_k=4, top_k=2, mu=0.05, max_depth=8, min_conf=0.0),
                True, True),
    "gates": (TreeConfig(mode="adaptive", budget=6, root_k=5, top_k=2, mu=0.5, max_depth=5, min_conf=0.02),
              False, True),
}


@pytest.mark.parametrize("case", CASES)
def test_the_device_grows_the_hosts_tree(chain_model, case: str) -> None:  # noqa: ANN001
    cfg, calibrated, costs = CASES[case]
    host = chain_drafting(chain_model, cfg, False, calibrated, costs)
    device = chain_drafting(chain_model, cfg, True, calibrated, costs)
    for step, ((want, want_widths), (got, got_widths)) in enumerate(zip(host, device)):
        assert same(want, got), (case, step, want, got)
        assert want_widths == got_widths, (case, step)
    trees = [tree for tree, _ in host]
    assert any("both" in t.sources for t in trees), "a proposal merged with a graft"
    assert any(t.num_draft > 4 for t in trees), "the model drafted beyond the graft"
    if case == "planner":
        assert {t.stop for t in trees} - {"budget", "depth"}, "the planner or a gate stopped a tree"


def test_layers_launched_past_the_stop_change_nothing(chain_model) -> None:  # noqa: ANN001
    # trees stopped by min_conf at varying depths, so some steps launch layers past their stop
    cfg = TreeConfig(mode="adaptive", budget=16, root_k=3, top_k=2, mu=0.05, max_depth=6, min_conf=0.02,
                     cost_aware=False, admission="confidence")
    host = chain_drafting(chain_model, cfg, False, False, False, steps=6)
    drafters: list = []
    ahead = chain_drafting(chain_model, cfg, True, False, False, ahead=True, steps=6, drafters=drafters)
    assert all(same(a, b) for (a, _), (b, _) in zip(host, ahead))
    assert drafters[0].idle_forwards > 0, "layers ran after a tree had stopped"
    assert {t.stop for t, _ in host} - {"budget", "empty"}, "a stop an idle layer would overwrite, if it could"


def test_updates_captured_once_replay_in_later_steps_and_keep_their_buffers(chain_model) -> None:  # noqa: ANN001
    """The capture path without a GPU: each update's warm-ups run and are undone, and the update
    made at the first step is the one every later step runs again (as a graph replays), so a
    value of a step baked into it rather than loaded into a buffer would change the trees. The
    buffers keep their addresses (a graph reads them by address)."""
    cfg, calibrated, costs = CASES["planner"]
    host = chain_drafting(chain_model, cfg, False, calibrated, costs, steps=6)
    rehearsed = chain_drafting(chain_model, cfg, True, calibrated, costs, steps=6, rehearse=True)
    assert all(same(a, b) for (a, _), (b, _) in zip(host, rehearsed))
    width = bucket_for(cfg.budget)
    pool = StaticPool(chain_model, drafts=True, buckets=(width, 257))
    drafter = StaticModelSource(chain_model, pool, tokens=400, chain=True, rehearse=True)
    drafter.reset(CHAIN_PROMPT)
    addresses = None
    for step in range(3):
        tree = drafter.chained_tree(DraftTree.with_root(drafter.context[-1]), cfg, 0, CalibratedAcceptance(),
                                    True, None)
        (state,) = drafter.static.chains.values()
        now = [buf.data_ptr() for buf in state.buffers()]
        assert addresses in (None, now), step
        addresses = now
        path = tree.path(tree.best_leaf())
        drafter.commit(tree, path, [tree.tokens[n] for n in path[1:]] + [9])
    assert len(state.captured) >= 2, "the root's update and a layer's were kept and run again"


def test_compiled_updates_grow_the_same_trees(chain_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """On the ``compiled`` step each update goes through torch.compile (fullgraph: a graph break
    fails) before its capture: rehearsed on the CPU with inductor, the trees are the host's, node
    for node and float for float, and every update really compiled."""
    import torch._dynamo

    import talon.drafters.static_draft

    class Compiled(ChainState):
        def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
            super().__init__(*args, **{**kwargs, "compiled": True})

    monkeypatch.setattr(talon.drafters.static_draft, "ChainState", Compiled)
    cfg = TreeConfig(mode="adaptive", budget=6, root_k=3, top_k=2, mu=0.05, max_depth=2, min_conf=0.0,
                     cost_aware=False, admission="confidence")
    torch._dynamo.reset()
    compiled_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # reset() keeps the counters
    host = chain_drafting(chain_model, cfg, False, False, False, steps=3)
    compiled = chain_drafting(chain_model, cfg, True, False, False, steps=3, rehearse=True)
    assert all(same(a, b) for (a, _), (b, _) in zip(host, compiled))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - compiled_before >= 2, \
        "the root's update and a layer's compiled"


def test_a_layer_update_reads_no_value_on_the_host() -> None:
    """Every operation of an update has a fixed shape and reads nothing back: on the meta
    device (no data at all) any ``.item()``, ``bool(tensor)`` or boolean index would fail."""
    cfg = TreeConfig(mode="adaptive", budget=12, root_k=3, top_k=2, mu=0.05, max_depth=6, min_conf=0.1)
    shared = DraftTree.with_root(5)
    shared.add(0, 9, 0.5, "retrieval")
    meta = torch.device("meta")
    planner = Planner(CHAIN_COSTS, cfg, 64, predicted=True)
    shape = ChainShape.of(cfg, 1, BUCKETS, True, True, 64)
    state = ChainState(shape, 300, meta)
    state.load(shared, StepTables.of(shape, 2, planner.acceptance, planner), 20, 20, 20)

    def bucket(size: int) -> Bucket:
        nbytes = 8 * (2 + 2 * size + size * 64) + size * size
        made = Bucket(size, 64, torch.empty(nbytes, dtype=torch.uint8, device=meta))
        made.top = torch.empty(size, 128, dtype=torch.float64, device=meta)
        return made
    layer = bucket(shape.width)
    state.root_update(bucket(1), 0, layer, 1000)
    state.layer_update(2, layer, 1000)
    assert state.stop.device.type == "meta" and state.frontier.shape == (shape.width,)


def random_case(seed: int) -> tuple[DraftTree, list[int], Planner, TreeConfig, int]:
    """A random tree (sources mixed), a frontier of its deepest nodes, and a planner with a
    random cost model, a learnt acceptance model and some drafting already charged."""
    rng = random.Random(seed)
    tree = DraftTree.with_root(1)
    for _ in range(rng.randrange(2, 30)):
        tree.add(rng.randrange(len(tree)), rng.randrange(100), rng.random() ** 0.3,
                 rng.choice(["model", "retrieval", "both"]))
    deepest = max(tree.depths)
    frontier = [n for n in range(1, len(tree)) if tree.depths[n] == deepest]
    rng.shuffle(frontier)
    flat, step = rng.uniform(0.005, 0.02), rng.uniform(0.0, 0.0005)
    costs = synthetic_costs({t: flat + step * t ** 0.5 for t in (1, 4, 16, 64, 128)},
                            {1: rng.uniform(0.0, 0.002), 64: rng.uniform(0.0, 0.004)}, other_s=rng.uniform(0, 0.01))
    cfg = TreeConfig(mode="adaptive", budget=rng.randrange(4, 40), top_k=rng.randrange(1, 4),
                     max_depth=deepest + rng.randrange(1, 6))
    acceptance = CalibratedAcceptance()
    for _ in range(rng.randrange(4)):
        acceptance.observe(tree, tree.path(rng.randrange(len(tree))), rng.randrange(8))
    planner = Planner(costs, cfg, 64, predicted=True, acceptance=acceptance)
    for _ in range(rng.randrange(3)):
        planner.forward_done(rng.randrange(1, 20))
    return tree, frontier, planner, cfg, rng.randrange(8)


def device_worth(tree: DraftTree, frontier: list[int], planner: Planner, cfg: TreeConfig, match_len: int,
                 bug: str = "") -> bool:
    """``ChainState.worth_layer`` on ``tree`` with ``frontier`` as its newest layer (``bug``:
    one planted in its inputs)."""
    cpu = torch.device("cpu")
    shape = ChainShape.of(cfg, max(tree.depths), BUCKETS, True, True, 64)
    shape = dataclasses.replace(shape, capacity=shape.capacity + len(tree))  # a random tree may exceed the budget
    tables = StepTables.of(shape, match_len, planner.acceptance, planner)
    if bug == "budget":  # room for one node more than the budget
        shape = dataclasses.replace(shape, cfg=dataclasses.replace(cfg, budget=cfg.budget + 1))
    elif bug == "continues":  # c ** (i + 1) for c ** i
        tables = dataclasses.replace(tables, cpow=np.roll(tables.cpow, -1))
    elif bug == "clock":  # the drafting so far not charged
        tables = dataclasses.replace(tables, drafted=0.0)
    state = ChainState(shape, 999, cpu)
    state.load(tree, tables, 0, 0, 0)
    state.p.copy_(state.probs(max(tree.depths)))
    mask = torch.zeros_like(state.alive)
    mask[frontier] = True
    state.rank[frontier] = torch.arange(len(frontier))
    order = torch.sort(torch.where(mask, state.rank, talon.graphs.chain.BIG), stable=True).indices[:shape.width]
    return bool(state.worth_layer(mask, order, mask.sum(), max(tree.depths)))


def test_the_devices_cost_check_is_the_planners() -> None:
    verdicts = []
    for seed in range(120):
        tree, frontier, planner, cfg, match_len = random_case(seed)
        want = planner.worth_layer(tree, frontier, cfg.top_k, cfg.budget, match_len)
        assert device_worth(tree, frontier, planner, cfg, match_len) == want, seed
        verdicts.append(want)
    assert 20 < sum(verdicts) < 100, "both verdicts are common, so a wrong one would show"


@pytest.mark.parametrize("bug", ["budget", "continues", "clock"])
def test_a_planted_bug_in_the_cost_check_is_caught(bug: str) -> None:
    wrong = 0
    for seed in range(120):
        tree, frontier, planner, cfg, match_len = random_case(seed)
        got = device_worth(tree, frontier, planner, cfg, match_len, bug)
        wrong += got != planner.worth_layer(tree, frontier, cfg.top_k, cfg.budget, match_len)
    assert wrong, bug


@pytest.mark.parametrize("bug", ["merge", "budget"])
def test_a_planted_bug_changes_the_tree(chain_model, monkeypatch: pytest.MonkeyPatch, bug: str) -> None:  # noqa: ANN001
    cfg, calibrated, costs = CASES["confidence" if bug == "budget" else "planner"]
    host = chain_drafting(chain_model, cfg, False, calibrated, costs)
    if bug == "merge":  # a proposal a graft holds is added again instead of merged
        real = ChainState.admit

        def admit(self, q, ids, parents, valid, depth):  # noqa: ANN001, ANN202
            self.alive.copy_(self.alive & (self.src != talon.graphs.chain.RETRIEVAL))
            real(self, q, ids, parents, valid, depth)
            self.alive.copy_(self.idx < self.count)
        monkeypatch.setattr(ChainState, "admit", admit)
    else:  # one node more than the budget kept
        real_of = ChainShape.of
        monkeypatch.setattr(ChainShape, "of", staticmethod(
            lambda cfg, *a: real_of(dataclasses.replace(cfg, budget=cfg.budget + 1), *a)))
    device = chain_drafting(chain_model, cfg, True, calibrated, costs)
    assert not all(same(a, b) for (a, _), (b, _) in zip(host, device)), bug


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_a_chained_run_is_lossless(drafter: str) -> None:
    from talon.engine.engine import Engine, generate
    from talon.run_config import RunConfig
    from tests.tiny import PROMPTS, noisy_copy, reference, tiny_loaded

    target = tiny_loaded("llama", 11)
    draft = noisy_copy(target, 12, 0.3)
    engine, host = Engine(target, draft, forward="static", chain=True), Engine(target, draft, forward="static")
    mats, host_mats = [], []
    for cost_aware in (False, True):
        tree = TreeConfig(mode="adaptive", budget=12, root_k=3, top_k=2, mu=0.05, max_depth=6, cost_aware=cost_aware)
        cfg = RunConfig(drafter=drafter, tree=tree, max_new_tokens=40)
        for prompt in PROMPTS[:2]:
            summary, _ = generate(engine, prompt, cfg)
            assert summary.token_ids == reference(engine, summary.prompt_token_ids, 40), (prompt, cost_aware)
            mats.append(summary.mean_accepted_tokens)
            if not cost_aware:  # (a cost-aware run plans on wall-clock timings: its trees vary)
                host_mats.append(generate(host, prompt, cfg)[0].mean_accepted_tokens)
    assert max(mats) > 1.2, "drafts must be accepted for the test to bite"
    assert sum(mats[:2]) >= sum(host_mats) - 0.15, "the chained drafts are as good as the host's"


def test_chaining_needs_a_static_step() -> None:
    from talon.engine.engine import Engine
    from talon.run_config import ConfigError
    from tests.tiny import tiny_loaded

    with pytest.raises(ConfigError, match="static"):
        Engine(tiny_loaded("llama", 11), None, forward="dynamic", chain=True)


def test_talon_chain_reaches_the_servers_engine() -> None:
    from talon.server.pair import pair_key
    from talon.server.presets import PRESETS
    from talon.settings import Settings

    assert not Settings.from_env({}).chain
    settings = Settings.from_env({"TALON_CHAIN": "1", "TALON_FORWARD": "static"})
    assert settings.chain and pair_key(settings, PRESETS[0]).chain
