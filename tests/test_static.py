"""The static-shape forward (talon/graphs/static.py) against the dynamic path the engine runs today:
the same logits for a tree padded into its bucket, the same next step after the accepted path
is moved inside the static cache, and each of those broken once fails. The CUDA-graph capture
runs where CUDA is present and is skipped, said so, elsewhere."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import talon.graphs.static
from talon.core.forward import forward_hidden, tree_mask, tree_positions
from talon.core.kv import keep_dynamic
from talon.core.verify import verify_tree
from talon.graphs.static import StaticForward, bucket_for
from talon.models.attention import set_fold
from talon.tree import DraftTree
from tests.tiny import plant_visible_pads, tiny_model

STATIC_PROMPT = torch.arange(3, 23)  # (P,)


def a_tree(root: int) -> DraftTree:
    """5 nodes on two branches: 0 -> 1 -> 3, 0 -> 2 -> 4 (a bucket of 8: three pads)."""
    tree = DraftTree.with_root(root)
    for parent, token in ((0, 40), (0, 41), (1, 42), (2, 43)):
        tree.add(parent, token, 0.5, "model")
    return tree


def dynamic(static_model, tree: DraftTree, path: list[int], follow: list[int]):  # noqa: ANN001, ANN201
    cache = DynamicCache(config=static_model.config)
    forward_hidden(static_model, cache, STATIC_PROMPT[:-1], torch.arange(len(STATIC_PROMPT) - 1), None)
    first = verify_tree(static_model, cache, tree.tokens, tree_mask(tree), tree_positions(tree, len(STATIC_PROMPT) - 1))
    keep_dynamic(cache, len(STATIC_PROMPT) - 1, [len(STATIC_PROMPT) - 1 + i for i in path])
    chain = DraftTree.with_root(follow[0])
    for i, token in enumerate(follow[1:]):
        chain.add(i, token, 0.5, "model")
    length = len(STATIC_PROMPT) - 1 + len(path)
    second = verify_tree(static_model, cache, chain.tokens, tree_mask(chain), tree_positions(chain, length))
    return first, second


def static(static_model, tree: DraftTree, path: list[int], follow: list[int]):  # noqa: ANN001, ANN201
    sf = StaticForward(static_model, max_len=64, buckets=(1, 2, 4, 8))
    sf.prefill(STATIC_PROMPT[:-1])
    length = len(STATIC_PROMPT) - 1
    first = sf.forward(torch.tensor(tree.tokens), tree_positions(tree, length), tree_mask(tree), length)
    sf.keep_path(length, path)
    length += len(path)
    t = len(follow)
    second = sf.forward(torch.tensor(follow), torch.arange(length, length + t),
                        torch.ones(t, t, dtype=torch.bool).tril(), length)
    return first, second


@pytest.fixture(scope="module")
def static_model():  # noqa: ANN201
    torch.manual_seed(0)
    return tiny_model("qwen2", seed=3, layers=2)


def test_buckets_round_up() -> None:
    assert [bucket_for(n) for n in (1, 2, 3, 5, 64, 65, 256, 257)] == [1, 2, 4, 8, 64, 128, 256, 257]
    with pytest.raises(ValueError, match="largest bucket"):
        bucket_for(258)  # the largest tree is its root and MAX_BUDGET (256) nodes


def test_the_static_forward_equals_the_dynamic_one_through_a_kept_path(static_model) -> None:  # noqa: ANN001
    tree = a_tree(int(STATIC_PROMPT[-1]))
    want = dynamic(static_model, tree, [0, 2, 4], [50, 51, 52])
    got = static(static_model, tree, [0, 2, 4], [50, 51, 52])
    for w, g in zip(want, got):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)




def test_a_pad_visible_to_the_nodes_fails(static_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    plant_visible_pads(monkeypatch)
    tree = a_tree(int(STATIC_PROMPT[-1]))
    first, _ = static(static_model, tree, [0, 2, 4], [50])
    assert not torch.allclose(first, dynamic(static_model, tree, [0, 2, 4], [50])[0], atol=1e-3)


def test_a_cache_move_one_slot_off_fails(static_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    real = StaticForward.keep
    monkeypatch.setattr(StaticForward, "keep", lambda self, start, slots: real(self, start + 1, slots))
    tree = a_tree(int(STATIC_PROMPT[-1]))
    _, second = static(static_model, tree, [0, 2, 4], [50, 51])
    assert not torch.allclose(second, dynamic(static_model, tree, [0, 2, 4], [50, 51])[1], atol=1e-3)


def test_too_long_a_step_for_the_static_cache_is_refused(static_model) -> None:  # noqa: ANN001
    sf = StaticForward(static_model, max_len=16, buckets=(1, 2, 4, 8))
    with pytest.raises(ValueError, match="exceed the static cache"):
        sf.forward(torch.zeros(5, dtype=torch.long), torch.arange(12, 17), torch.eye(5, dtype=torch.bool), 12)


def test_a_drafting_forward_reads_out_the_top_k_of_its_own_logits(static_model) -> None:  # noqa: ANN001
    """The readout made inside the forward (so that a graph replays it) is the softmax's top-k of
    the logits the same forward returns, copied back in one table."""
    from talon.graphs.static import READOUT_K

    sf = StaticForward(static_model, max_len=64, buckets=(1, 2, 4, 8), drafts=True)
    sf.prefill(STATIC_PROMPT[:-1])
    tree, length = a_tree(int(STATIC_PROMPT[-1])), len(STATIC_PROMPT) - 1
    args = (torch.tensor(tree.tokens), tree_positions(tree, length), tree_mask(tree), length)
    q, ids = sf.top(*args, k=3)
    want_q, want_ids = torch.softmax(sf.forward(*args), dim=-1).topk(3, dim=-1)
    assert ids == want_ids.tolist()
    torch.testing.assert_close(torch.tensor(q, dtype=torch.float64), want_q.double(), atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="reads out"):
        sf.top(*args, k=READOUT_K + 1)
    with pytest.raises(ValueError, match="reads out 0"):
        StaticForward(static_model, max_len=64, buckets=(1, 2, 4, 8)).top(*args, k=3)  # a target's forward
    small = tiny_model("qwen2", seed=4, layers=1, vocab=6)  # fewer ids than READOUT_K: the table is narrower
    sf = StaticForward(small, max_len=64, buckets=(1, 2, 4, 8), drafts=True)
    sf.prefill(torch.tensor([1, 2, 3]))
    args = (torch.tensor([4, 5]), torch.tensor([3, 4]), torch.ones(2, 2, dtype=torch.bool).tril(), 3)
    q, ids = sf.top(*args, k=6)
    want_q, want_ids = torch.softmax(sf.forward(*args), dim=-1).topk(6, dim=-1)
    assert ids == want_ids.tolist() and sorted(ids[0]) == list(range(6))
    torch.testing.assert_close(torch.tensor(q, dtype=torch.float64), want_q.double(), atol=1e-6, rtol=1e-6)


def test_a_node_seeing_more_earlier_slots_than_a_forward_holds_is_refused(static_model) -> None:  # noqa: ANN001
    """A drafting forward carries each node's slots from earlier layers of its step, up to the
    deepest tree (``EARLIER``); more, or any on a target's forward, is refused, not cut."""
    from talon.graphs.static import EARLIER
    from talon.knobs import KNOB

    assert EARLIER >= KNOB["max_depth"].hi  # a node at the deepest layer sees max_depth - 1 of them
    static_drafting = StaticForward(static_model, max_len=EARLIER + 16, buckets=(1, 2), drafts=True)
    one = torch.tensor([5])
    fits = torch.ones(1, EARLIER + 1, dtype=torch.bool)  # EARLIER earlier slots and itself
    assert static_drafting.forward(one, torch.tensor([EARLIER]), fits, EARLIER, base=0).shape[0] == 1
    with pytest.raises(ValueError, match="slots of earlier layers"):
        static_drafting.forward(one, torch.tensor([EARLIER + 1]), torch.ones(1, EARLIER + 2, dtype=torch.bool),
                         EARLIER + 1, base=0)
    with pytest.raises(ValueError, match="this forward holds 0"):
        StaticForward(static_model, max_len=64, buckets=(1, 2)).forward(one, torch.tensor([3]),
                                                                 torch.ones(1, 2, dtype=torch.bool), 1, base=0)


def test_capture_replays_the_eager_logits_on_cuda(static_model) -> None:  # noqa: ANN001
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: graph capture runs only on a GPU (the eager static path is tested above)")
    cuda = static_model.to("cuda")
    tree = a_tree(int(STATIC_PROMPT[-1]))
    sf = StaticForward(cuda, max_len=64, buckets=(1, 2, 4, 8))
    sf.prefill(STATIC_PROMPT[:-1])
    length = len(STATIC_PROMPT) - 1
    eager = sf.forward(torch.tensor(tree.tokens), tree_positions(tree, length), tree_mask(tree), length).clone()
    report = sf.capture(length)
    replay = sf.forward(torch.tensor(tree.tokens), tree_positions(tree, length), tree_mask(tree), length)
    assert report.buckets == [1, 2, 4, 8] and talon.graphs.static.bucket_for(5) == 8
    torch.testing.assert_close(replay, eager, atol=1e-3, rtol=1e-3)
    lazy = StaticForward(cuda, max_len=64, buckets=(1, 2, 4, 8), graphs=True)  # what a pool makes
    lazy.prefill(STATIC_PROMPT[:-1])  # 19 tokens: one chunk of 8, 8, then 3 in a bucket of 4
    first = lazy.forward(torch.tensor(tree.tokens), tree_positions(tree, length), tree_mask(tree), length).clone()
    again = lazy.forward(torch.tensor(tree.tokens), tree_positions(tree, length), tree_mask(tree), length)
    assert lazy.capture_report.buckets == [4, 8] and all(lazy.buckets[b].graph is not None for b in (4, 8))
    torch.testing.assert_close(first, eager, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(again, eager, atol=1e-3, rtol=1e-3)
    static_model.to("cpu")


# ------------------------------------------------------------------ the draft model on the static forward


def static_drafting(drafter) -> list:  # noqa: ANN001
    """Two steps of a model source, the second from an async fork's adopted subtree, then a
    third after a plain commit: every layer's children (token, q)."""
    seen = []

    def layer(tree: DraftTree, nodes: list[int], k: int) -> None:
        children = drafter.expand(tree, nodes, k)
        seen.append(children)
        for node, kids in zip(nodes, children):
            for token, q in kids:
                tree.add(node, token, q, "model")

    drafter.reset(STATIC_PROMPT.tolist())
    tree = DraftTree.with_root(int(STATIC_PROMPT[-1]))
    layer(tree, [0], 3)  # nodes 1-3
    layer(tree, [1, 2], 2)  # nodes 4-7 (4, 5 under 1)
    layer(tree, [4, 6], 2)  # nodes 8-11
    fork = drafter.fork()
    fork.commit(tree, [0, 1, 4], [tree.tokens[1], tree.tokens[4]])
    ahead = DraftTree.with_root(tree.tokens[4])
    children = fork.expand(ahead, [0], 2)
    seen.append(children)
    for token, q in children[0]:
        ahead.add(0, token, q, "model")
    seen.append(fork.expand(ahead, [1, 2], 2))
    for node, kids in zip([1, 2], seen[-1]):
        for token, q in kids:
            ahead.add(node, token, q, "model")
    fork.adopt_subtree(ahead, 1, ahead.descendants(1))  # the bonus was node 1's token
    drafter.close()
    drafter = fork
    next_tree = ahead.subtree(1)
    layer(next_tree, [n for n in range(1, len(next_tree))][:2], 2)
    drafter.commit(next_tree, [0, 2], [next_tree.tokens[2], 77])  # not the first node of its layer
    tree = DraftTree.with_root(77)
    layer(tree, [0], 3)
    layer(tree, [1, 3], 2)
    drafter.close()
    return seen


def same_children(a: list, b: list) -> bool:
    for la, lb in zip(a, b, strict=True):
        for ka, kb in zip(la, lb, strict=True):
            if [t for t, _ in ka] != [t for t, _ in kb]:
                return False
            if any(abs(qa - qb) > 1e-4 for (_, qa), (_, qb) in zip(ka, kb)):
                return False
    return True


def test_the_static_drafter_drafts_as_the_dynamic_one_through_commit_fork_and_adopt(static_model) -> None:  # noqa: ANN001
    from talon.drafters.model import ModelSource
    from talon.drafters.static_draft import StaticModelSource
    from talon.graphs.pool import StaticPool

    pool = StaticPool(static_model, drafts=True)
    want = static_drafting(ModelSource(static_model))
    got = static_drafting(StaticModelSource(static_model, pool, tokens=64))
    assert len(want) == 8 and same_children(want, got)
    assert len(pool.free) == pool.made == 2, "the drafter and its fork gave their forwards back"


@pytest.mark.parametrize("bug", ["keep one slot off", "ancestor unseen"])
def test_a_static_drafter_bug_changes_its_drafts(static_model, monkeypatch: pytest.MonkeyPatch, bug: str) -> None:  # noqa: ANN001
    from talon.drafters.model import ModelSource
    from talon.drafters.static_draft import StaticModelSource
    from talon.graphs.pool import StaticPool

    if bug == "keep one slot off":
        real = StaticForward.keep
        monkeypatch.setattr(StaticForward, "keep", lambda self, start, slots: real(self, start + 1, slots))
    else:
        real_fill = StaticForward.fill

        def unseen(self, ids, positions, visible, length, base=None):  # noqa: ANN001, ANN202
            if base is not None and base < length:  # a later draft layer: hide the earlier layers
                visible = visible.clone()
                visible[:, : length - base] = False
            return real_fill(self, ids, positions, visible, length, base)

        monkeypatch.setattr(StaticForward, "fill", unseen)
    want = static_drafting(ModelSource(static_model))
    got = static_drafting(StaticModelSource(static_model, StaticPool(static_model, drafts=True), tokens=64))
    assert not same_children(want, got)


# ------------------------------------------------------------------ the static forward in the loop


@pytest.fixture(scope="module")
def close_pair():  # noqa: ANN201
    from tests.tiny import noisy_copy, tiny_loaded

    target = tiny_loaded("llama", 11)
    return target, noisy_copy(target, 12, 0.3)


@pytest.mark.parametrize("drafter", ["none", "retrieval", "model", "hybrid"])
def test_the_static_step_is_lossless_for_every_drafter_tree_and_async(close_pair, drafter: str) -> None:  # noqa: ANN001
    from talon.engine.engine import Engine, generate
    from talon.run_config import RunConfig, TreeConfig
    from tests.tiny import PROMPTS, reference

    target, draft = close_pair
    engine = Engine(target, draft, forward="static")
    mats = []
    for mode in ("adaptive", "static", "chain"):
        for async_draft in ((False, True) if drafter in ("model", "hybrid") else (False,)):
            tree = TreeConfig(mode=mode, budget=12, root_k=3, top_k=2, mu=0.05, max_depth=6, cost_aware=False)
            cfg = RunConfig(drafter=drafter, tree=tree, max_new_tokens=40, async_draft=async_draft)
            for prompt in PROMPTS[:2]:
                summary, _ = generate(engine, prompt, cfg)
                assert summary.token_ids == reference(engine, summary.prompt_token_ids, 40), (prompt, mode, async_draft)
                mats.append(summary.mean_accepted_tokens)
    assert drafter in ("none", "retrieval") or max(mats) > 1.2, "drafts must be accepted for the test to bite"
    assert len(engine.static_pools["target"].free) == engine.static_pools["target"].made == 1, \
        "every run gave its forward back, the next reused it"
    drafts = engine.static_pools["draft"]
    assert len(drafts.free) == drafts.made, "every draft forward (async forks too) was given back"
    assert drafter in ("none", "retrieval") or drafts.made >= 1 + (drafter in ("model", "hybrid")), \
        "the draft model ran on the static forward, and async forks took a second forward"


@pytest.mark.parametrize("seed", range(3))
def test_random_trees_through_the_static_verifier_are_lossless(close_pair, seed: int) -> None:  # noqa: ANN001
    from talon.engine.engine import Engine
    from talon.run_config import RunConfig
    from tests.tiny import PROMPTS, OracleTreeDrafter, reference

    target, _ = close_pair
    engine = Engine(target, None, forward="static")
    cfg = RunConfig(drafter="none", max_new_tokens=48)
    ids = engine.run(PROMPTS[seed], cfg).prompt_ids
    want = reference(engine, ids, 48)
    run = engine.run(PROMPTS[seed], cfg)
    run.drafter = OracleTreeDrafter(want, seed, size=10 + seed)  # 11-14 nodes: a bucket of 16, padded
    for _ in run:
        pass
    assert run.summary.token_ids == want and run.summary.mean_accepted_tokens > 1.0


def test_an_unknown_forward_or_graphs_without_cuda_is_refused(close_pair) -> None:  # noqa: ANN001
    from talon.engine.engine import Engine
    from talon.run_config import ConfigError

    with pytest.raises(ConfigError, match="forward must be one of"):
        Engine(close_pair[0], None, forward="fast")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA graphs"):
            Engine(close_pair[0], None, forward="graphs")


def test_auto_picks_graphs_on_one_cuda_device_only() -> None:
    from talon.graphs.static import resolve_forward
    from talon.run_config import ConfigError

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_forward("auto", cuda) == "graphs" and resolve_forward("auto", cpu) == "dynamic"
    assert resolve_forward("auto", cuda, split=True) == "dynamic", "a pair spread over GPUs stays dynamic"
    with pytest.raises(ConfigError, match="spread over several GPUs"):
        resolve_forward("static", cuda, split=True)


def test_the_compiled_step_is_cuda_only_and_a_known_name() -> None:
    from talon.graphs.static import resolve_forward
    from talon.run_config import ConfigError

    assert resolve_forward("compiled", torch.device("cuda")) == "compiled"
    with pytest.raises(ConfigError, match="'compiled' replays CUDA graphs"):
        resolve_forward("compiled", torch.device("cpu"))


def test_compiled_small_buckets_score_as_the_eager_forward(static_model, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The ``compiled`` step's forward, run eagerly on the CPU: buckets up to ``compile_upto`` go
    through torch.compile (inductor), larger ones stay eager, and both score as the plain forward;
    compiled too, the attention folds its query heads (it never repeats the keys and values)."""
    import torch._dynamo
    import transformers.integrations.sdpa_attention as hf_sdpa

    def repeated(*args):  # noqa: ANN002, ANN202
        raise AssertionError("the static forward repeated the keys and values")
    monkeypatch.setattr(hf_sdpa, "repeat_kv", repeated)
    set_fold(static_model, True)  # as an engine on a CPU switches it (TALON_FOLD=auto)

    tree = a_tree(int(STATIC_PROMPT[-1]))  # 5 nodes: a bucket of 8, eager; its first 3: a bucket of 4, compiled
    small = DraftTree.with_root(tree.tokens[0])
    for parent, token in ((0, tree.tokens[1]), (1, tree.tokens[2])):
        small.add(parent, token, 0.5, "model")
    length = len(STATIC_PROMPT) - 1
    got = {}
    torch._dynamo.reset()
    # dynamo's counters outlive reset(): what this test compiles is the growth from here
    compiled_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for upto in (0, 4):
        sf = StaticForward(static_model, max_len=64, buckets=(1, 2, 4, 8), compile_upto=upto)
        sf.prefill(STATIC_PROMPT[:-1])  # 19 tokens: chunks of 8 and 8 (eager), then 3 in a bucket of 4 (compiled)
        got[upto] = [sf.forward(torch.tensor(t.tokens), tree_positions(t, length), tree_mask(t), length).clone()
                     for t in (small, tree)]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > compiled_before, \
        "the compiled buckets really compiled"
    assert talon.graphs.static.COMPILED.get(static_model) is not None
    for want, have in zip(got[0], got[4]):
        torch.testing.assert_close(have, want, atol=1e-4, rtol=1e-4)


def test_talon_step_is_read_checked_and_refused_on_zerogpu_when_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    from talon.engine import build as models
    from talon.models import zerogpu
    from talon.run_config import ConfigError
    from talon.settings import PairKey, Settings

    assert Settings.from_env({}).forward == "auto"
    assert Settings.from_env({"TALON_FORWARD": "Compiled"}).forward == "compiled"
    assert Settings.from_env({"TALON_STEP": "static"}).forward == "static", "the former name still works"
    assert Settings.from_env({"TALON_STEP": "static", "TALON_FORWARD": "dynamic"}).forward == "dynamic"
    with pytest.raises(ConfigError, match="TALON_FORWARD must be one of"):
        Settings.from_env({"TALON_FORWARD": "fast"})
    loads = []
    monkeypatch.setattr(models, "load_pair", lambda *a, **k: loads.append(a))
    monkeypatch.setattr(zerogpu, "active", lambda: True)
    key = PairKey("t", "d", "auto", "auto", "auto", False, "/tmp", "/tmp", forward="compiled")
    with pytest.raises(ConfigError, match="ZeroGPU does not support torch.compile"):
        models.build_engine(key)
    assert loads == [], "refused before any weight is loaded"


def test_a_precompiled_pool_compiles_nothing_in_a_run(static_model) -> None:  # noqa: ANN001
    """``StaticPool.precompile`` (the compiled step's start-up) compiles every small bucket on a
    forward the pool keeps; a run's forwards then compile nothing more."""
    import torch._dynamo

    from talon.graphs.pool import StaticPool

    torch._dynamo.reset()
    pool = StaticPool(static_model, compile_upto=2, quantum=64)  # two buckets: an inductor compile costs 15 s
    assert StaticPool(static_model).precompile() == 0.0, "a pool that compiles nothing has nothing to do"
    assert pool.precompile() > 0 and len(pool.free) == 1
    compiled = dict(torch._dynamo.utils.counters["stats"])
    sf = pool.take(len(STATIC_PROMPT) + 4)
    sf.prefill(STATIC_PROMPT[:-2])  # 18 tokens: the last 2 in a bucket of 2, compiled at start
    length = len(STATIC_PROMPT) - 2
    for size in (1, 2):
        sf.forward(torch.zeros(size, dtype=torch.long), torch.arange(length, length + size),
                   torch.ones(size, size, dtype=torch.bool).tril(), length)
    assert dict(torch._dynamo.utils.counters["stats"]) == compiled, "no compile during the run"
