"""A static-shape forward: one model over a preallocated KV cache, at a few bucketed sizes, so
that on a GPU each bucket can be captured once as a CUDA graph and replayed.

Eager PyTorch on a GPU pays a kernel launch and some Python for every operation: a 0.5B draft
forward costs almost what a 7B one does. A CUDA graph replays a whole forward as one launch, but
only over fixed shapes and fixed addresses. So everything a step changes goes into buffers that
live as long as the model does:

* the KV cache is ``max_len`` slots per layer (``SlotLayer``), written where ``slots`` says, not
  appended: a step's nodes go into the slots after the committed tokens;
* ``T`` nodes go in as a bucket of ``B >= T`` (1, 2, 4, ... 256, 257): the pads are token 0 at the last
  node's position, each seeing only its own slot (never a fully masked row, which would make
  NaNs that a masked score cannot hide), and no real node sees a pad;
* the 4D additive mask covers all ``max_len`` slots: the committed prefix, the node's ancestors;
  a slot past them is masked, whatever stale entry it holds (finite, so masked to zero weight);
* keeping the accepted path moves its entries to the slots right after the prefix
  (``keep_path``), inside the same tensors.

The same code runs eagerly on the CPU (the suite proves its logits equal the dynamic path's) and,
with ``graphs=True`` on CUDA, replays a captured graph per bucket. Capture follows torch's rules:
a warm-up on a side stream first (so lazy allocations and library workspaces happen outside the
graph), every input copied into a buffer captured by address, no host synchronisation inside.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field

import torch
from transformers import Cache, PreTrainedModel
from transformers.cache_utils import StaticLayer

from talon.knobs import STEPS
from talon.models.memory import GRAPH_BUCKET, SLOT_QUANTUM
from talon.rng import generator_for
from talon.run_config import ConfigError, SamplingConfig
from talon.tree import DraftTree
from talon.verify import head_device, lm_logits, TargetVerifier, tree_mask, tree_positions, Verdict

CAPTURE_LOCK = threading.Lock()  # one capture at a time in a process (runs may share a device)
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, GRAPH_BUCKET)  # the largest: a tree's root and MAX_BUDGET nodes


COMPILE_LOCK = threading.Lock()  # one torch.compile wrapper per model, made once
COMPILED: "weakref.WeakKeyDictionary[PreTrainedModel, torch.nn.Module]" = weakref.WeakKeyDictionary()
COMPILED_UPTO = 32  # on the ``compiled`` step, the draft's buckets up to this size run torch.compile'd


def spans_devices(model: PreTrainedModel) -> bool:
    """Is ``model`` spread over several devices (accelerate's ``device_map``)?"""
    return len({str(d) for d in getattr(model, "hf_device_map", {}).values()}) > 1


def resolve_step(step: str, device: torch.device, split: bool = False) -> str:
    """``auto``: graphs on one CUDA device (a step is launch-bound there), the dynamic cache
    elsewhere (on the CPU the static step measured slower: docs/gpu.md) and for a pair spread
    over several GPUs (a graph is captured on one device's stream). ``compiled`` is graphs with
    the draft model's small buckets through ``torch.compile`` (opt-in: each bucket compiles for
    about 30 s, at start-up, and ZeroGPU does not support it)."""
    if step not in STEPS:
        raise ConfigError(f"step must be one of {', '.join(STEPS)}, not {step!r}")
    if step == "auto":
        return "graphs" if device.type == "cuda" and not split else "dynamic"
    if step in ("graphs", "compiled") and device.type != "cuda":
        raise ConfigError(f"step {step!r} replays CUDA graphs: the target is on {device}")
    if step != "dynamic" and split:
        raise ConfigError(f"step {step!r} needs each model on one device; this pair is spread over several GPUs")
    return step


def bucket_for(tokens: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest bucket that holds ``tokens`` nodes."""
    for b in buckets:
        if b >= tokens:
            return b
    raise ValueError(f"{tokens} nodes exceed the largest bucket ({buckets[-1]})")


def compiled_decoder(model: PreTrainedModel):  # noqa: ANN201 - a torch.compile wrapper
    """``model``'s decoder through ``torch.compile`` (inductor, static shapes), one per model.
    Every (bucket, cache length) compiles once, so dynamo's recompile limit (8 per function) is
    raised to hold a server's buckets and slot-cache sizes (past it, dynamo would fall back to
    eager without a word)."""
    with COMPILE_LOCK:
        compiled = COMPILED.get(model)
        if compiled is None:
            import torch._dynamo  # noqa: PLC0415 - only the compiled step needs it

            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            compiled = COMPILED[model] = torch.compile(model.get_decoder(), dynamic=False)
    return compiled


class Slots:
    """The cache slots the next forward writes, shared by every layer: set per bucket."""

    def __init__(self) -> None:
        self.current: torch.Tensor | None = None  # (B,) long


class SlotLayer(StaticLayer):
    """transformers' static layer (``max_len`` preallocated slots), writing its keys and values
    where ``slots.current`` says instead of after a running count."""

    def __init__(self, max_cache_len: int, slots: Slots) -> None:
        super().__init__(max_cache_len=max_cache_len)
        self.slots = slots

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):  # noqa: ANN002, ANN003
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys.index_copy_(2, self.slots.current, key_states)  # (1, kv, L, d) <- (1, kv, B, d)
        self.values.index_copy_(2, self.slots.current, value_states)
        return self.keys, self.values


@dataclass
class Bucket:
    """The static buffers of one size, and its graph once captured."""

    size: int
    ids: torch.Tensor  # (1, B) long
    positions: torch.Tensor  # (1, B) long
    slots: torch.Tensor  # (B,) long
    mask: torch.Tensor  # (1, 1, B, L) additive, the model's dtype
    logits: torch.Tensor | None = None  # (B, V) float32: the graph's output
    graph: "torch.cuda.CUDAGraph | None" = None


@dataclass
class CaptureReport:
    """What capturing cost: seconds, and the graph pool's memory (CUDA)."""

    buckets: list[int] = field(default_factory=list)
    seconds: float = 0.0
    pool_bytes: int = 0


class StaticForward:
    """One model, its slot cache of ``max_len`` and a buffer set per bucket. ``forward`` scores
    ``T`` nodes after ``length`` committed tokens; ``keep_path`` commits a path."""

    def __init__(self, model: PreTrainedModel, max_len: int, buckets: tuple[int, ...] = BUCKETS,
                 vocab: int = 0, graphs: bool = False, compile_upto: int = 0) -> None:
        """``graphs``: capture each bucket as a CUDA graph at its first use, and replay it.
        ``compile_upto``: buckets up to this size run the decoder through ``torch.compile``
        (inductor fuses a layer's small kernels; one compile per bucket, captured the same way);
        larger ones (a prefill's chunks, not launch-bound) stay eager."""
        self.model, self.max_len, self.vocab, self.graphs = model, max_len, vocab, graphs
        self.compile_upto = compile_upto
        self.compiled = compiled_decoder(model) if compile_upto else None
        self.pool = None  # the buckets' shared graph memory pool (CUDA), made at the first capture
        self.device = model.device
        self.slots = Slots()
        layers = model.config.num_hidden_layers
        self.cache = Cache(layers=[SlotLayer(max_len, self.slots) for _ in range(layers)])
        self.buckets = {b: self._buffers(b) for b in buckets}
        self.minimum = torch.finfo(model.dtype).min
        self.capture_report = CaptureReport()

    def _buffers(self, size: int) -> Bucket:
        d = self.device
        return Bucket(size, torch.zeros(1, size, dtype=torch.long, device=d),
                      torch.zeros(1, size, dtype=torch.long, device=d), torch.arange(size, device=d),
                      torch.zeros(1, 1, size, self.max_len, dtype=self.model.dtype, device=d))

    # ------------------------------------------------------------------ the step

    def _run(self, bucket: Bucket) -> torch.Tensor:
        """The model over ``bucket``'s buffers: (B, V) float32 logits (captured as is), the head
        limited to the first ``vocab`` rows as the dynamic path's (``lm_logits``)."""
        self.slots.current = bucket.slots
        decoder = self.compiled if self.compiled is not None and bucket.size <= self.compile_upto else self.model.get_decoder()
        out = decoder(input_ids=bucket.ids, position_ids=bucket.positions,
                                       attention_mask=bucket.mask, past_key_values=self.cache, use_cache=True)
        return lm_logits(self.model, out.last_hidden_state[0], self.vocab)  # (B, V)

    def fill(self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, length: int,
             base: int | None = None) -> Bucket:
        """Copy one step into its bucket's buffers: ``T`` nodes written at slots ``length ..
        length + T - 1``. ids, positions: (T,) long. Every node sees slots ``0 .. base - 1``
        (``base`` defaults to ``length``: the committed prefix); ``visible``: (T, length - base + T)
        bool says which of the slots ``base .. length + T - 1`` it sees too (its ancestors, written
        by this step or, for a drafter, by its earlier layers, and itself)."""
        t = ids.shape[0]
        base = length if base is None else base
        bucket = self.buckets[bucket_for(t, tuple(self.buckets))]
        b = bucket.size
        if length + b > self.max_len:
            raise ValueError(f"{length} tokens + a bucket of {b} exceed the static cache ({self.max_len} slots)")
        if visible.shape != (t, length - base + t):
            raise ValueError(f"visible is {tuple(visible.shape)}, not ({t}, {length - base + t})")
        bucket.ids.zero_()
        bucket.ids[0, :t].copy_(ids, non_blocking=True)
        bucket.positions[0, :t].copy_(positions, non_blocking=True)
        bucket.positions[0, t:] = bucket.positions[0, t - 1]  # pads sit at the last node's position
        torch.arange(length, length + b, out=bucket.slots)
        mask = bucket.mask[0, 0]  # (B, L)
        mask.fill_(self.minimum)
        mask[:t, :base] = 0.0  # every node sees the committed prefix
        seen = mask[:t, base:length + t]
        seen.masked_fill_(visible.to(self.device, non_blocking=True), 0.0)  # and its ancestors
        pads = torch.arange(t, b, device=self.device)
        mask[pads, length + pads] = 0.0  # a pad sees itself only
        return bucket

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, length: int,
                base: int | None = None) -> torch.Tensor:
        """(T, V) float32 logits of ``T`` nodes written after slot ``length`` (see ``fill``); a
        replay of the bucket's graph when one was captured."""
        t = ids.shape[0]
        bucket = self.fill(ids, positions, visible, length, base)
        if bucket.graph is None and self.graphs:
            self._capture(bucket)  # its warm-ups write this step's own entries: harmless
        if bucket.graph is not None:
            bucket.graph.replay()
            return bucket.logits[:t]
        return self._run(bucket)[:t]

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Write ``P`` tokens' entries, causally, into slots ``start .. start + P - 1`` (the
        tokens at those positions), bucket by bucket; the last one's logits, (1, V)."""
        step = max(self.buckets)
        logits = None
        for at in range(0, ids.shape[0], step):
            chunk = ids[at:at + step]
            t, length = chunk.shape[0], start + at
            causal = torch.ones(t, t, dtype=torch.bool).tril()
            visible = torch.cat([torch.ones(t, at, dtype=torch.bool), causal], dim=1)
            logits = self.forward(chunk, torch.arange(length, length + t), visible, length, base=start)
        return logits[-1:]

    @torch.inference_mode()
    def keep_path(self, length: int, path: list[int]) -> None:
        """Move the entries of the accepted nodes (``path``: node indices, the step's slots being
        ``length + i``) to slots ``length .. length + K - 1``, every layer, in place."""
        self.keep(length, [length + int(i) for i in path])

    @torch.inference_mode()
    def keep(self, start: int, slots: list[int]) -> None:
        """Move the entries at ``slots`` (each >= ``start``) to ``start .. start + K - 1``, every
        layer, in place (gathered first, so a source overwritten early is read intact). Entries
        already in place are left alone: a step that kept only its root moves nothing."""
        skip = 0
        while skip < len(slots) and slots[skip] == start + skip:
            skip += 1
        if skip == len(slots):
            return
        src = torch.tensor(slots[skip:], dtype=torch.long).to(self.device, non_blocking=True)
        dst = torch.arange(start + skip, start + len(slots), device=self.device)
        for layer in self.cache.layers:
            for store in (layer.keys, layer.values):
                store.index_copy_(2, dst, store.index_select(2, src))

    @torch.inference_mode()
    def copy_from(self, other: "StaticForward", slots: int) -> None:
        """This cache's first ``slots`` entries := ``other``'s (same model): an async fork."""
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            if not theirs.is_initialized:
                continue
            if not mine.is_initialized:
                mine.lazy_initialization(theirs.keys[:, :, :1], theirs.values[:, :, :1])
            mine.keys[:, :, :slots].copy_(theirs.keys[:, :, :slots])
            mine.values[:, :, :slots].copy_(theirs.values[:, :, :slots])

    # ------------------------------------------------------------------ graphs

    @torch.inference_mode()
    def capture(self, length: int) -> CaptureReport:
        """Capture every bucket now (largest first), at slots after ``length``: each warm-up and
        capture writes only slots a later step overwrites. ``graphs=True`` captures lazily instead,
        each bucket at its first use, with that step's own inputs."""
        for size, bucket in sorted(self.buckets.items(), reverse=True):
            if bucket.graph is None:
                one = torch.ones(size, size, dtype=torch.bool).tril()
                self.fill(torch.zeros(size, dtype=torch.long), torch.arange(length, length + size), one, length)
                self._capture(bucket)
        return self.capture_report

    def _capture(self, bucket: Bucket) -> None:
        """Capture ``bucket`` (its buffers filled) as a CUDA graph, by torch's rules: two warm-up
        runs on a side stream first (lazy allocations and library workspaces stay out of the
        graph), every input read from a buffer captured by address, no host synchronisation
        inside. The buckets of one forward share a memory pool, which is safe in any replay order
        because each replay's logits are read before another bucket replays."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device; the static forward runs eagerly elsewhere")
        with CAPTURE_LOCK:  # one capture at a time in the process
            start = time.perf_counter()
            before = torch.cuda.memory_reserved(self.device)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            current = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._run(bucket)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's run (its own streams and buffers) may go on meanwhile
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                bucket.logits = self._run(bucket)
            bucket.graph = graph
            torch.cuda.synchronize(self.device)
            report = self.capture_report
            report.buckets = sorted([*report.buckets, bucket.size])
            report.seconds += time.perf_counter() - start
            report.pool_bytes += torch.cuda.memory_reserved(self.device) - before


# ------------------------------------------------------------------ the loop's verifier


class StaticPool:
    """The static forwards of one model, kept between runs (their caches and, on CUDA, their
    graphs are built once): a run takes one large enough, or gets a new one, and gives it back."""

    def __init__(self, model: PreTrainedModel, graphs: bool = False, quantum: int = SLOT_QUANTUM,
                 compile_upto: int = 0) -> None:
        """``compile_upto``: see ``StaticForward``; such a pool rounds its slot caches up to 4x
        ``quantum``, so that fewer cache lengths each compile."""
        self.model, self.graphs, self.compile_upto = model, graphs, compile_upto
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
        max_len = -(-(tokens + BUCKETS[-1]) // self.quantum) * self.quantum  # rounded up: reused by longer runs
        sf = StaticForward(self.model, max_len, vocab=vocab, graphs=self.graphs, compile_upto=self.compile_upto)
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
                 capture_all: bool = False) -> None:
        """``capture_all``: capture every bucket now (before another thread drafts: see
        ``Engine.run``), not each at its first use."""
        self.model, self.sampling, self.pool = model, sampling, pool
        self.generator = generator_for(head_device(model), sampling.seed)
        self.static: StaticForward | None = pool.take(tokens)
        if capture_all and self.static.graphs:
            self.static.capture(0)
        self.cache = self.static.cache
        self.length = 0  # committed tokens in the cache (all but the root)

    def prefill(self, ids: list[int]) -> None:
        if len(ids) > 1:
            self.static.prefill(torch.tensor(ids[:-1]))
        self.length = len(ids) - 1

    def verify(self, tree: DraftTree) -> Verdict:
        positions = tree_positions(tree, self.length)  # (T,)
        logits = self.static.forward(torch.tensor(tree.tokens), positions, tree_mask(tree), self.length)
        return self.judge(tree, logits, positions)

    def commit(self, verdict: Verdict) -> None:
        accepted = verdict.acceptance.accepted
        self.static.keep_path(self.length, accepted)
        self.length += len(accepted)

    def close(self) -> None:
        if self.static is not None:
            self.pool.give(self.static)
            self.static = None


class StaticTimer:
    """The cost probe's timer on the static step (``talon.cost_probe.probe_costs(timers=...)``): one
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


def static_timer(pool: StaticPool):  # noqa: ANN201 - a talon.cost_probe.Timer
    """A ``talon.cost_probe.Timer`` over ``pool``'s model (the model argument is the pool's)."""
    return lambda _model, prefix, vocab, max_size: StaticTimer(pool, prefix, vocab, max_size)
