"""A static-shape forward: one model over a preallocated KV cache, at a few bucketed sizes, so
that on a GPU each bucket can be captured once as a CUDA graph and replayed.

Eager PyTorch on a GPU pays a kernel launch and some Python for every operation: a 0.5B draft
forward costs almost what a 7B one does. A CUDA graph replays a whole forward as one launch, but
only over fixed shapes and fixed addresses. So everything a step changes goes into buffers that
live as long as the model does:

* the KV cache is ``max_len`` slots per layer (``SlotLayer``), written where ``slots`` says, not
  appended: a step's nodes go into the slots after the committed tokens;
* ``T`` nodes go in as a bucket of ``B >= T`` (1, 2, 4, ... 256, 257): the pads are token 0 at the last
  node's position, each seeing the prefix and its own slot (never a fully masked row, which
  would make NaNs that a masked score cannot hide), and no real node sees a pad;
* a step's inputs cross to the device in one copy of packed bytes (``fill``): length, base, ids,
  positions, each node's slots from earlier draft layers, and which of the step's own slots it
  sees. The forward makes the rest from them, so a graph replays it too: the slots it writes
  and the 4D additive mask over all ``max_len`` slots (the committed prefix, the node's
  ancestors; a slot past them is masked, whatever stale entry it holds: finite, so masked to
  zero weight); a drafting forward also reads out each node's top-K children (``top``), so a
  draft layer is a replay and one copy back;
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
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import Cache, PreTrainedModel
from transformers.cache_utils import StaticLayer

from talon.core.kv import keep_slots
from talon.knobs import FORWARDS, KNOB
from talon.models.attention import fold_kwargs
from talon.models.head import lm_logits
from talon.models.memory import GRAPH_BUCKET
from talon.run_config import ConfigError
from talon.settings import proven_default

# what a static forward built in this process, by kind: "forwards" (slot caches and buffers),
# "captures" (CUDA graphs), "compiles" (a compiled bucket's first run); a timed run must add none
BUILT: Counter[str] = Counter()
CAPTURE_LOCK = threading.Lock()  # one capture at a time in a process (runs may share a device)

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, GRAPH_BUCKET)  # the largest: a tree's root and MAX_BUDGET nodes


COMPILE_LOCK = threading.Lock()  # one torch.compile wrapper per model, made once
COMPILED: "weakref.WeakKeyDictionary[PreTrainedModel, torch.nn.Module]" = weakref.WeakKeyDictionary()
COMPILED_UPTO = 32  # on the ``compiled`` step, the draft's buckets up to this size run torch.compile'd
EARLIER = int(KNOB["max_depth"].hi)  # a drafted node's ancestors from earlier layers: at most the deepest tree
READOUT_K = int(max(KNOB["root_k"].hi, KNOB["top_k"].hi))  # a drafting forward's top-K, in the forward


def spans_devices(model: PreTrainedModel) -> bool:
    """Is ``model`` spread over several devices (accelerate's ``device_map``)?"""
    return len({str(d) for d in getattr(model, "hf_device_map", {}).values()}) > 1


def resolve_forward(forward: str, device: torch.device, split: bool = False) -> str:
    """How forwards run, as asked. ``auto``: graphs on one CUDA device (a step is launch-bound
    there), the dynamic cache elsewhere (on the CPU the static forward measured slower:
    docs/gpu.md) and for a pair spread over several GPUs (a graph is captured on one device's
    stream). ``compiled`` is graphs with the draft model's small buckets through ``torch.compile``
    (opt-in: each bucket compiles for about 30 s, at start-up, and ZeroGPU does not support it)."""
    if forward not in FORWARDS:
        raise ConfigError(f"forward must be one of {', '.join(FORWARDS)}, not {forward!r}")
    if forward == "auto":
        return "dynamic" if split else proven_default("forward", device.type).value
    if forward in ("graphs", "compiled") and device.type != "cuda":
        raise ConfigError(f"forward {forward!r} replays CUDA graphs: the target is on {device}")
    if forward != "dynamic" and split:
        raise ConfigError(f"forward {forward!r} needs each model on one device; this pair is spread over several GPUs")
    return forward


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
            import torch._dynamo  # noqa: PLC0415 - only the compiled forward needs it

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
    """The static buffers of one size, and its graph once captured. A step's inputs arrive in
    ``packed`` with one copy to the device (``StaticForward.fill``); the mask, the slots and the
    readout are made from it inside the forward, so that a graph replays them too."""

    size: int
    earlier: int  # E: the slots from earlier layers of a step a node may see (drafting forwards)
    packed: torch.Tensor  # (8 * (2 + 2B + B*E) + B*B,) uint8: see ``StaticForward.pack``
    logits: torch.Tensor | None = None  # (B, V) float32: the forward's output
    top: torch.Tensor | None = None  # (B, 2K) float64: top-K probabilities, then their ids (drafting)
    features: torch.Tensor | None = None  # (B, F): hidden states entering ``feature_layers`` (an EAGLE-3 head's)
    graph: "torch.cuda.CUDAGraph | None" = None

    @property
    def int_bytes(self) -> int:
        """Where the packed int64 part ends and the window begins."""
        return 8 * (2 + 2 * self.size + self.size * self.earlier)

    @property
    def ints(self) -> torch.Tensor:
        """(2 + 2B + B*E,) int64: length, base, ids, positions, earlier slots (row-major)."""
        return self.packed[:self.int_bytes].view(torch.int64)

    @property
    def window(self) -> torch.Tensor:
        """(B, B) uint8: which of the step's own slots (``length ..``) each row sees."""
        return self.packed[self.int_bytes:].view(self.size, self.size)


@dataclass
class CaptureReport:
    """What capturing cost: seconds, and the graph pool's memory (CUDA)."""

    buckets: list[int] = field(default_factory=list)
    seconds: float = 0.0
    pool_bytes: int = 0


class StaticForward:
    """One model, its slot cache of ``max_len`` and a buffer set per bucket. ``forward`` scores
    ``T`` nodes after ``length`` committed tokens (``top``: their top-k children, for a drafting
    forward); ``keep_path`` commits a path."""

    def __init__(self, model: PreTrainedModel, max_len: int, buckets: tuple[int, ...] = BUCKETS,
                 vocab: int = 0, graphs: bool = False, compile_upto: int = 0, drafts: bool = False,
                 feature_layers: tuple[int, ...] = ()) -> None:
        """``graphs``: capture each bucket as a CUDA graph at its first use, and replay it.
        ``compile_upto``: buckets up to this size run the decoder through ``torch.compile``
        (inductor fuses a layer's small kernels; one compile per bucket, captured the same way);
        larger ones (a prefill's chunks, not launch-bound) stay eager. ``drafts``: a drafting
        model's forward: its nodes may see slots of earlier layers (up to ``EARLIER``), and it
        reads out each node's top ``READOUT_K`` children inside the forward (``top``).
        ``feature_layers``: every forward also keeps the hidden states entering these layers
        (``features``, inside the graph like the logits): an EAGLE-3 head's features."""
        self.model, self.max_len, self.vocab, self.graphs = model, max_len, vocab, graphs
        self.feature_layers = feature_layers
        self.fold = fold_kwargs(model)  # GQA without copying K/V (talon.models.attention)
        self.compile_upto = compile_upto
        self.compiled = compiled_decoder(model) if compile_upto else None
        self.earlier, self.readout_k = (EARLIER, READOUT_K) if drafts else (0, 0)
        self.pool = None  # the buckets' shared graph memory pool (CUDA), made at the first capture
        self.device = model.device
        self.slots = Slots()
        layers = model.config.num_hidden_layers
        self.cache = Cache(layers=[SlotLayer(max_len, self.slots) for _ in range(layers)])
        self.columns = torch.arange(max_len, device=self.device)  # (L,): slot numbers, read by the mask
        self.buckets = {b: self._buffers(b) for b in buckets}
        self.minimum = torch.finfo(model.dtype).min
        self.capture_report = CaptureReport()
        # talon.graphs.chain's tree buffers (and captured updates) by ChainShape, kept with the forward
        self.chains: dict = {}
        self.compiled_sizes: set[int] = set()  # compiled buckets that ran (each compiles at its first run)
        BUILT["forwards"] += 1

    def _buffers(self, size: int) -> Bucket:
        nbytes = 8 * (2 + 2 * size + size * self.earlier) + size * size
        return Bucket(size, self.earlier, torch.zeros(nbytes, dtype=torch.uint8, device=self.device))

    # ------------------------------------------------------------------ one bucketed forward

    def _run(self, bucket: Bucket) -> torch.Tensor:
        """The model over ``bucket``'s packed inputs: (B, V) float32 logits (captured as is), the
        head limited to the first ``vocab`` rows as the dynamic path's (``lm_logits``); a drafting
        forward's top-K table too (``bucket.top``). Every operation reads device buffers only, so
        the whole of it replays as one graph."""
        b, e = bucket.size, bucket.earlier
        ints = bucket.ints
        length, base = ints[0], ints[1]
        ids, positions = ints[2:2 + b].view(1, b), ints[2 + b:2 + 2 * b].view(1, b)
        own = length + self.columns[:b]  # (B,): the slots this step writes
        self.slots.current = own
        seen = torch.zeros(b, self.max_len + 1, dtype=torch.uint8, device=self.device)  # the last: a sink
        seen.scatter_(1, own.expand(b, b), bucket.window)  # the step's own slots: ancestors, itself
        if e:  # ancestors written by earlier layers (the sink where a row has fewer)
            seen.scatter_(1, ints[2 + 2 * b:].view(b, e), 1)
        visible = seen[:, :-1].bool() | (self.columns < base)  # and the committed prefix
        mask = torch.where(visible, 0.0, self.minimum).to(self.model.dtype).view(1, 1, b, self.max_len)
        decoder = self.compiled if self.compiled is not None and b <= self.compile_upto else self.model.get_decoder()
        if decoder is self.compiled and b not in self.compiled_sizes:
            self.compiled_sizes.add(b)
            BUILT["compiles"] += 1
        hidden = {"output_hidden_states": True} if self.feature_layers else {}
        out = decoder(input_ids=ids, position_ids=positions, attention_mask=mask,
                      past_key_values=self.cache, use_cache=True, **self.fold, **hidden)
        if self.feature_layers:  # (B, 3H): low, mid, high
            bucket.features = torch.cat([out.hidden_states[i][0] for i in self.feature_layers], dim=-1)
        logits = lm_logits(self.model, out.last_hidden_state[0], self.vocab)  # (B, V)
        if self.readout_k:
            q, top = torch.softmax(logits, dim=-1).topk(min(self.readout_k, logits.shape[-1]), dim=-1)
            bucket.top = torch.cat([q.double(), top.double()], dim=1)  # (B, 2K): one copy back
        return logits

    def pack(self, bucket: Bucket, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
             length: int, base: int) -> np.ndarray:
        """One step's inputs as ``bucket.packed``'s bytes, built on the host: length, base, the
        ids and positions (pads: token 0 at the last node's position), each row's slots from
        earlier layers (``base .. length - 1``; the sink ``max_len`` past its own), and the
        (B, B) window of the step's own slots (a pad sees itself only)."""
        t, b, e = ids.shape[0], bucket.size, bucket.earlier
        out = np.zeros(bucket.packed.shape[0], dtype=np.uint8)
        ints = out[:bucket.int_bytes].view(np.int64)
        ints[0], ints[1] = length, base
        ints[2:2 + t] = ids.numpy()
        ints[2 + b:2 + b + t] = positions.numpy()
        ints[2 + b + t:2 + 2 * b] = int(positions[-1])
        vis = visible.numpy()
        early = vis[:, : length - base]
        counts = early.sum(axis=1)
        if counts.size and counts.max() > e:
            raise ValueError(f"a node sees {int(counts.max())} slots of earlier layers; this forward holds {e}")
        if e:
            slots = ints[2 + 2 * b:].reshape(b, e)
            slots.fill(self.max_len)
            rows, cols = np.nonzero(early)
            rank = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
            slots[rows, rank] = base + cols
        window = out[bucket.int_bytes:].reshape(b, b)
        window[:t, :t] = vis[:, length - base:]
        window[np.arange(t, b), np.arange(t, b)] = 1
        return out

    def fill(self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, length: int,
             base: int | None = None) -> Bucket:
        """Copy one step into its bucket's buffers, in one copy: ``T`` nodes written at slots
        ``length .. length + T - 1``. ids, positions: (T,) long. Every node sees slots ``0 .. base
        - 1`` (``base`` defaults to ``length``: the committed prefix); ``visible``: (T, length -
        base + T) bool says which of the slots ``base .. length + T - 1`` it sees too (its
        ancestors, written by this step or, for a drafter, by its earlier layers, and itself)."""
        t = ids.shape[0]
        base = length if base is None else base
        bucket = self.buckets[bucket_for(t, tuple(self.buckets))]
        if length + bucket.size > self.max_len:
            raise ValueError(f"{length} tokens + a bucket of {bucket.size} exceed the static cache "
                             f"({self.max_len} slots)")
        if visible.shape != (t, length - base + t):
            raise ValueError(f"visible is {tuple(visible.shape)}, not ({t}, {length - base + t})")
        packed = self.pack(bucket, ids.cpu(), positions.cpu(), visible.cpu(), length, base)
        bucket.packed.copy_(torch.from_numpy(packed), non_blocking=True)  # pageable: staged before it returns
        return bucket

    def _fill_and_launch(self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, length: int,
                         base: int | None) -> Bucket:
        """Fill a bucket and run it: a replay of its graph when one was captured."""
        return self.launch(self.fill(ids, positions, visible, length, base))

    def launch(self, bucket: Bucket) -> Bucket:
        """Run ``bucket`` on its packed inputs as they stand (filled by ``fill``, or on the device
        by ``talon.graphs.chain``): a replay of its graph when one was captured (at its first use under
        ``graphs``; the warm-ups write the step's own entries: harmless)."""
        if bucket.graph is None and self.graphs:
            self._capture(bucket)
        if bucket.graph is not None:
            bucket.graph.replay()
        else:
            bucket.logits = self._run(bucket)
        return bucket

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, length: int,
                base: int | None = None) -> torch.Tensor:
        """(T, V) float32 logits of ``T`` nodes written after slot ``length`` (see ``fill``); a
        replay of the bucket's graph when one was captured."""
        return self._fill_and_launch(ids, positions, visible, length, base).logits[:ids.shape[0]]

    @torch.inference_mode()
    def top(self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, length: int, k: int,
            base: int | None = None) -> tuple[list[list[float]], list[list[int]]]:
        """A drafting forward's readout: each of the ``T`` nodes' top-``k`` children (their
        probabilities, their ids), made inside the forward and copied back at once."""
        return self.read_top(self._fill_and_launch(ids, positions, visible, length, base), ids.shape[0], k)

    def read_top(self, bucket: Bucket, rows: int, k: int,
                 last: bool = False) -> tuple[list[list[float]], list[list[int]]]:
        """The first ``rows`` rows of ``bucket``'s top-K table (``last``: row ``rows - 1`` alone),
        cut to ``k`` children: one copy to the host."""
        width = bucket.top.shape[1] // 2 if bucket.top is not None else 0  # K, or the vocabulary when smaller
        if not self.readout_k or k > width:
            raise ValueError(f"this forward reads out {width} children a node, not {k}")
        table = (bucket.top[rows - 1:rows] if last else bucket.top[:rows]).cpu().numpy()
        return table[:, :k].tolist(), table[:, width:width + k].astype(np.int64).tolist()

    def prefill_chunks(self, ids: torch.Tensor, start: int) -> tuple[Bucket, int]:
        """Write ``P`` tokens' entries, causally, into slots ``start .. start + P - 1`` (the
        tokens at those positions), a bucket at a time, each chunk seeing every slot before it as
        committed; the last chunk's bucket and its size."""
        size = max(self.buckets)
        for at in range(0, ids.shape[0], size):
            chunk = ids[at:at + size]
            t, length = chunk.shape[0], start + at
            causal = torch.ones(t, t, dtype=torch.bool).tril()  # (t, t)
            bucket = self._fill_and_launch(chunk, torch.arange(length, length + t), causal, length, None)
        return bucket, t

    @torch.inference_mode()
    def forward_features(self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor,
                         length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward``, and the nodes' features (T, F), copied out of the bucket."""
        bucket = self._fill_and_launch(ids, positions, visible, length, None)
        t = ids.shape[0]
        return bucket.logits[:t], bucket.features[:t].clone()

    @torch.inference_mode()
    def prefill_features(self, ids: torch.Tensor) -> torch.Tensor:
        """Prefill ``ids`` from slot 0 (``prefill_chunks``), keeping every token's features: (P, F)."""
        size, parts = max(self.buckets), []
        for at in range(0, ids.shape[0], size):
            chunk = ids[at:at + size]
            t = chunk.shape[0]
            causal = torch.ones(t, t, dtype=torch.bool).tril()  # (t, t)
            bucket = self._fill_and_launch(chunk, torch.arange(at, at + t), causal, at, None)
            parts.append(bucket.features[:t].clone())
        return torch.cat(parts)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """``prefill_chunks``; the last token's logits, (1, V)."""
        bucket, t = self.prefill_chunks(ids, start)
        return bucket.logits[t - 1:t]

    @torch.inference_mode()
    def keep_path(self, length: int, path: list[int]) -> None:
        """Move the entries of the accepted nodes (``path``: node indices, the step's slots being
        ``length + i``) to slots ``length .. length + K - 1``, every layer, in place."""
        self.keep(length, [length + int(i) for i in path])

    @torch.inference_mode()
    def keep(self, start: int, slots: list[int]) -> None:
        """The KV cut on this forward's slots (``talon.core.kv.keep_slots``): the entries at
        ``slots`` (each >= ``start``) become ``start .. start + K - 1``, every layer."""
        keep_slots(self.cache, start, slots)

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
            BUILT["captures"] += 1
            torch.cuda.synchronize(self.device)
            report = self.capture_report
            report.buckets = sorted([*report.buckets, bucket.size])
            report.seconds += time.perf_counter() - start
            report.pool_bytes += torch.cuda.memory_reserved(self.device) - before
