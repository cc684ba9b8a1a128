"""The static forward's forwards kept between runs, and what the loop and the cost probe run on
them: ``StaticPool`` (one model's forwards, reused by later runs), ``StaticVerifier`` (the
target's verdicts on a static forward) and ``StaticTimer`` (the cost probe's timer)."""

from __future__ import annotations

import dataclasses
import threading
import time

import torch
from transformers import PreTrainedModel

from talon.core.contracts import Verdict
from talon.core.forward import tree_mask, tree_positions
from talon.core.verify import TargetVerifier
from talon.graphs.static import BUCKETS, StaticForward
from talon.models.head import head_device
from talon.models.memory import SLOT_QUANTUM
from talon.models.rng import generator_for
from talon.run_config import SamplingConfig
from talon.tree import DraftTree


class StaticPool:
    """The static forwards of one model, kept between runs (their caches and, on CUDA, their
    graphs are built once): a run takes one large enough, or gets a new one, and gives it back."""

    def __init__(self, model: PreTrainedModel, graphs: bool = False, quantum: int = SLOT_QUANTUM,
                 compile_upto: int = 0, drafts: bool = False, buckets: tuple[int, ...] = BUCKETS,
                 feature_layers: tuple[int, ...] = ()) -> None:
        """``compile_upto``, ``drafts``, ``buckets``, ``feature_layers``: see ``StaticForward``; a compiling pool
        rounds its slot caches up to 4x ``quantum``, so that fewer cache lengths each compile."""
        self.model, self.graphs, self.compile_upto, self.drafts = model, graphs, compile_upto, drafts
        self.buckets, self.feature_layers = buckets, feature_layers
        self.quantum = quantum * 4 if compile_upto else quantum
        self.free: list[StaticForward] = []
        self.made = 0  # forwards built: with none in use, all of them are free
        self.lock = threading.Lock()

    def take(self, tokens: int, vocab: int = 0) -> StaticForward:
        """A static forward whose cache holds ``tokens`` plus the largest bucket, its head over the
        first ``vocab`` ids (0: all)."""
        with self.lock:
            for i, sf in enumerate(self.free):
                if sf.max_len >= tokens + max(sf.buckets) and sf.vocab == vocab:
                    return self.free.pop(i)
        max_len = -(-(tokens + self.buckets[-1]) // self.quantum) * self.quantum  # rounded up: reused by longer runs
        sf = StaticForward(self.model, max_len, self.buckets, vocab=vocab, graphs=self.graphs,
                           compile_upto=self.compile_upto, drafts=self.drafts, feature_layers=self.feature_layers)
        with self.lock:
            self.made += 1
        return sf

    def give(self, sf: StaticForward) -> None:
        with self.lock:
            self.free.append(sf)

    def precompile(self) -> float:
        """Compile (and on CUDA capture) every compiled bucket now, on a forward the pool keeps,
        so that no run pays for it (about 30 s a bucket on an H100); seconds taken. Nothing to do
        for a pool that compiles nothing."""
        if not self.compile_upto:
            return 0.0
        start = time.perf_counter()
        sf = self.take(0)
        try:  # one forward per bucket (each captured at its first use under graphs), largest first:
            # an eager one fills the cache's layers first, as a run's prefill does
            for size in sorted(sf.buckets, reverse=True):
                sf.forward(torch.zeros(size, dtype=torch.long), torch.arange(size),
                           torch.ones(size, size, dtype=torch.bool).tril(), 0)
        finally:
            self.give(sf)
        return time.perf_counter() - start


class StaticVerifier(TargetVerifier):
    """``TargetVerifier`` on a static forward: the same verdicts, from a preallocated cache at
    bucketed sizes (graph replays where the pool captured them). ``close`` gives the forward back."""

    def __init__(self, model: PreTrainedModel, sampling: SamplingConfig, pool: StaticPool, tokens: int,
                 capture_all: bool = False, features: bool = False) -> None:
        """``capture_all``: capture every bucket now (before another thread drafts: see
        ``Engine.run``), not each at its first use. ``features``: return the features the pool's
        forwards keep (``StaticPool.feature_layers``) from the prefill and every verification."""
        self.model, self.sampling, self.pool = model, sampling, pool
        self.features = features
        self.generator = generator_for(head_device(model), sampling.seed)
        self.static: StaticForward | None = pool.take(tokens)
        if capture_all and self.static.graphs:
            self.static.capture(0)
        self.cache = self.static.cache
        self.length = 0  # committed tokens in the cache (all but the root)

    def prefill(self, ids: list[int]) -> torch.Tensor | None:
        self.length = len(ids) - 1
        if len(ids) <= 1:
            return None
        if self.features:
            return self.static.prefill_features(torch.tensor(ids[:-1]))
        self.static.prefill(torch.tensor(ids[:-1]))
        return None

    def verify(self, tree: DraftTree) -> Verdict:
        positions = tree_positions(tree, self.length)  # (T,)
        ids, mask = torch.tensor(tree.tokens), tree_mask(tree)
        if not self.features:
            return self.judge(tree, self.static.forward(ids, positions, mask, self.length), positions)
        logits, features = self.static.forward_features(ids, positions, mask, self.length)
        return dataclasses.replace(self.judge(tree, logits, positions), features=features)

    def commit(self, verdict: Verdict) -> None:
        accepted = verdict.acceptance.accepted
        self.static.keep_path(self.length, accepted)
        self.length += len(accepted)

    def close(self) -> None:
        if self.static is not None:
            self.pool.give(self.static)
            self.static = None


class StaticTimer:
    """The cost probe's timer on the static forward (``talon.cost.probe.probe_costs(timers=...)``): one
    forward of ``size`` new nodes after a ``prefix``-token slot cache, graphs replayed where the
    pool captured them; ``close`` gives the forward back."""

    def __init__(self, pool: StaticPool, prefix: int, vocab: int, max_size: int) -> None:
        self.pool, self.prefix, self.vocab = pool, prefix, vocab
        self.static = pool.take(prefix + max_size, vocab)
        model = pool.model
        self.ids = torch.randint(0, min(model.config.vocab_size, 1000), (prefix + max_size,))
        self.static.prefill(self.ids[:prefix])

    def __call__(self, size: int) -> float:
        device = self.static.device
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda _device: None)
        p = self.prefix
        causal = torch.ones(size, size, dtype=torch.bool).tril()
        sync(device)
        start = time.perf_counter()
        self.static.forward(self.ids[p:p + size], torch.arange(p, p + size), causal, p).argmax(-1)
        sync(device)
        return time.perf_counter() - start

    def close(self) -> None:
        self.pool.give(self.static)


def static_timer(pool: StaticPool):  # noqa: ANN201 - a talon.cost.probe.Timer
    """A ``talon.cost.probe.Timer`` over ``pool``'s model (the model argument is the pool's)."""
    return lambda _model, prefix, vocab, max_size: StaticTimer(pool, prefix, vocab, max_size)
