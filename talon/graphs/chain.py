"""TALON's adaptive tree grown on the draft model's device: the draft layers chained with no
host turnaround between them.

``talon.core.builder`` grows a tree on the host: each draft layer copies its nodes' top-k children
back, and the gate, the budget, the merge with retrieval's grafted nodes and the cost planner
decide there which nodes the next layer expands, so on a GPU every layer waits for the host.
Here the same decisions are fixed-shape tensor operations over a tree of fixed capacity on the
device that read no value on the host (the suite runs them on the ``meta`` device, where any
read fails), and they write the next layer's packed inputs (``talon.graphs.static.Bucket.packed``)
themselves. The state lives in buffers made once per run and written in place; what a step
changes is loaded in one upload. So each update is captured as a CUDA graph once and replayed
(``ChainState.update``), a step's layers go back to back and the tree crosses once. It grows
the tree ``build_tree`` grows, node for node, float for float (tested on the CPU), with the
cost planner's drafting charged at the cost model's prediction.

The host does not know when the tree stops. It launches layers unread (``ahead``: as many as
the last step used) and reads the stop flag before each further one; a layer launched after the
tree stopped runs on pads only and is reported as an idle forward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from talon.cost.plan import LOOKAHEAD, MATCH_EDGES, Q_EDGES, CalibratedAcceptance, Planner
from talon.graphs.rehearse import HostScalarGuard
from talon.graphs.static import CAPTURE_LOCK, Bucket, bucket_for
from talon.run_config import TreeConfig
from talon.tree import SOURCES, STOP_CODES, STOPS, DraftTree, Gate

MODEL, RETRIEVAL, BOTH = SOURCES.index("model"), SOURCES.index("retrieval"), SOURCES.index("both")
BUDGET, DEPTH, MIN_CONF, COST, EMPTY = (STOP_CODES[s] for s in ("budget", "depth", "min_conf", "cost", "empty"))
NODE_INTS = ("tok", "par", "dep", "src", "slot")
NODE_FLOATS = ("q", "conf")
GATES = ("gmax", "gthr", "gpass", "gset")
BIG = 1 << 40  # the rank of a node outside the newest layer


@dataclass(frozen=True)
class ChainShape:
    """What a run's chained trees hold, fixed for the run (a captured update depends on it)."""

    cfg: TreeConfig
    width: int  # W: the rows of a layer's forward (a bucket holding the widest layer)
    capacity: int  # C: the root, the grafts, the kept nodes and one layer's candidates
    graft_bound: int  # at least the deepest graft (a tree at layer d is at most max(this, d) deep)
    calibrated: bool  # the budget ranks by the acceptance model's P, else by path confidence
    costs: bool  # the cost planner's check runs
    readout: int  # the width of a forward's top-K table (``StaticForward.read_top``)

    @staticmethod
    def of(cfg: TreeConfig, graft_depth: int, buckets: tuple[int, ...], calibrated: bool, costs: bool,
           readout: int) -> "ChainShape":
        """The shape for ``cfg``'s trees; grafts are at most the budget (the hybrid drafter's
        share of it), so one shape serves a run unless a graft is deeper than any before
        (``graft_bound`` rounds up to 4s)."""
        width = bucket_for(max(cfg.budget, 1), buckets)
        return ChainShape(cfg=cfg, width=width, capacity=2 + cfg.budget + max(cfg.root_k, width * cfg.top_k),
                          graft_bound=max(-(-graft_depth // 4) * 4, 4), calibrated=calibrated, costs=costs,
                          readout=readout)


@dataclass(frozen=True)
class StepTables:
    """What one step loads beside its tree: the acceptance model's rates (model, both,
    retrieval bins), the retrieval match, and the cost planner's tables, so that its check is
    ``Planner.worth_layer`` (``predicted=True``) number for number."""

    rates: np.ndarray  # (3, 11)
    match_len: int
    cpow: np.ndarray  # (LOOKAHEAD + 1,): continues ** i
    draft: np.ndarray  # (W + 1,): draft_s(width)
    verify: np.ndarray  # (C + 2,): verify_s(tokens)
    other_s: float
    drafted: float  # the step's drafting so far (the root's forward), as the planner charges it

    @staticmethod
    def of(shape: ChainShape, match_len: int, acceptance: CalibratedAcceptance,
           planner: Planner | None) -> "StepTables":
        rates = np.zeros((3, len(Q_EDGES) + 1))
        for row, calibration in enumerate((acceptance.model, acceptance.both, acceptance.retrieval)):
            rates[row, :len(calibration.priors)] = [calibration.rate(i) for i in range(len(calibration.priors))]
        if planner is None:
            return StepTables(rates, match_len, np.zeros(LOOKAHEAD + 1), np.zeros(shape.width + 1),
                              np.zeros(shape.capacity + 2), 0.0, 0.0)
        c, costs = planner.acceptance.continues.mean, planner.costs
        return StepTables(rates, match_len, np.array([c**i for i in range(LOOKAHEAD + 1)]),
                          np.array([costs.draft_s(w) for w in range(shape.width + 1)]),
                          np.array([costs.verify_s(t) for t in range(shape.capacity + 2)]),
                          costs.other_s, planner.drafted_s())


def at(table: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """``table[i]`` for an index tensor of any shape, 0-d included, without reading ``i`` on the
    host (a plain index by a 0-d tensor would: ``.item()``, a synchronisation on a GPU)."""
    return table.gather(0, i.reshape(-1)).reshape(i.shape)


class ChainState:
    """A run's tree buffers on the device: ``capacity`` nodes (index ``capacity``: a sink for
    writes that go nowhere); nodes ``0 .. count - 1`` are the tree in ``build_tree``'s
    numbering; ``rank`` orders the newest layer (the order ``_admit`` admitted it in). Every
    buffer is made here and only written in place, so a captured update stays valid."""

    def __init__(self, shape: ChainShape, sink_slot: int, device: torch.device, graphs: bool = False,
                 rehearse: bool = False, compiled: bool = False) -> None:
        """``sink_slot``: the static forward's sink (its ``max_len``); ``graphs``: capture each
        update at its first use and replay it; ``rehearse``: run a capture's warm-ups and
        restore without capturing (CPU tests of that path); ``compiled``: each update through
        ``torch.compile`` (inductor fuses its ~330 small operations into ~80 kernels) before
        it is captured."""
        c, w = shape.capacity + 1, shape.width
        self.shape, self.device, self.sink_slot = shape, device, sink_slot
        self.graphs, self.rehearse, self.compiled = graphs, rehearse, compiled
        self.idx = torch.arange(c, device=device)
        self.q_edges = torch.tensor(Q_EDGES, dtype=torch.float64, device=device)
        self.match_edges = torch.tensor(MATCH_EDGES, device=device)

        def ints(n: int = c) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.long, device=device)

        def floats(n: int = c) -> torch.Tensor:
            return torch.zeros(n, dtype=torch.float64, device=device)

        # the per-node fields, stacked by dtype so that the budget cut renumbers each stack at once
        self.node_ints = torch.zeros(6, c, dtype=torch.long, device=device)
        self.node_floats = torch.zeros(5, c, dtype=torch.float64, device=device)
        self.node_flags = torch.zeros(2, c, dtype=torch.bool, device=device)
        self.tok, self.par, self.dep, self.src, self.slot, self.rank = self.node_ints.unbind(0)
        self.q, self.conf, self.p, self.gmax, self.gthr = self.node_floats.unbind(0)
        self.gpass, self.gset = self.node_flags.unbind(0)
        self.alive = torch.zeros(c, dtype=torch.bool, device=device)
        self.frontier, self.fed_rows = ints(w), ints(w)  # the next layer's rows; the rows of the one just fed
        self.count, self.stop, self.rows, self.fed_real_rows, self.used, self.base, self.root_pos, self.match_len = \
            (ints(1)[0] for _ in range(8))
        self.widths = ints(shape.cfg.max_depth)  # each chained forward's real rows
        self.rates = torch.zeros(3, len(Q_EDGES) + 1, dtype=torch.float64, device=device)
        self.cpow, self.draft, self.verify = floats(LOOKAHEAD + 1), floats(w + 1), floats(shape.capacity + 2)
        self.other_s, self.drafted = floats(1)[0], floats(1)[0]
        self.root_top = torch.zeros(1, 2 * shape.readout, dtype=torch.float64, device=device)
        self.captured: dict[tuple, Callable[[], None]] = {}  # each update's replay, by (kind, depth)
        self.pool = None

    def buffers(self) -> list[torch.Tensor]:
        """Every buffer an update writes (the ones a capture's warm-ups must leave as found)."""
        return [self.node_ints, self.node_floats, self.node_flags, self.alive, self.frontier, self.fed_rows,
                self.count, self.stop, self.rows, self.fed_real_rows, self.used, self.widths, self.drafted]

    def load(self, tree: DraftTree, tables: StepTables, used: int, base: int, root_pos: int) -> None:
        """Start a step from ``tree`` (the root and its grafts): one upload, then copies into
        the buffers. ``used``: the draft cache's slots written; ``base``: its committed prefix;
        ``root_pos``: the root's position."""
        shape, n = self.shape, len(tree)
        if n + shape.cfg.root_k > shape.capacity:
            raise ValueError(f"a graft of {n - 1} nodes does not fit a chained tree of {shape.capacity}")
        c = shape.capacity + 1
        nodes = np.zeros((len(NODE_INTS) + len(NODE_FLOATS), c))
        nodes[:5, :n] = [tree.tokens, tree.parents, tree.depths, [SOURCES.index(s) for s in tree.sources], [0] * n]
        nodes[1, 0] = 0  # the root is its own parent: every gather stays in range
        nodes[4, :] = self.sink_slot
        nodes[5:, :n] = [tree.q_draft, tree.path_conf]
        scalars = [n, used, base, root_pos, tables.match_len, tables.other_s, tables.drafted]
        host = np.concatenate([nodes.ravel(), tables.rates.ravel(), tables.cpow, tables.draft, tables.verify, scalars])
        dev = torch.from_numpy(host).to(self.device, non_blocking=True)
        parts = dev.split([nodes.size, tables.rates.size, tables.cpow.size, tables.draft.size, tables.verify.size,
                           len(scalars)])
        rows = parts[0].view(-1, c)
        for i, buf in enumerate((self.tok, self.par, self.dep, self.src, self.slot, self.q, self.conf)):
            buf.copy_(rows[i])
        for buf, part in zip((self.rates, self.cpow, self.draft, self.verify), parts[1:5]):
            buf.copy_(part.view_as(buf))
        for buf, value in zip((self.count, self.used, self.base, self.root_pos, self.match_len, self.other_s,
                               self.drafted), parts[5]):
            buf.copy_(value)
        self.alive.copy_(self.idx < self.count)
        self.rank.fill_(BIG)
        for buf in (self.gmax, self.gthr, self.gpass, self.gset, self.stop, self.rows, self.widths):
            buf.zero_()

    def probs(self, depth: int) -> torch.Tensor:
        """(C+1,) float64: the acceptance model's P(node accepted), the root 1, as
        ``CalibratedAcceptance.node_probs`` multiplies it along each path (in the same order), for a
        tree whose model layers reach ``depth``."""
        qbin = torch.bucketize(self.q, self.q_edges, right=True)
        mbin = torch.bucketize(self.match_len + self.dep - 1, self.match_edges, right=True)
        retrieval = torch.clamp(self.rates[2][mbin] * self.q, max=1.0)
        p = torch.where(self.src == BOTH, self.rates[1][qbin],
                        torch.where(self.src == RETRIEVAL, retrieval, self.rates[0][qbin]))
        probs = torch.ones_like(p)
        root = self.idx == 0
        for _ in range(max(self.shape.graft_bound, depth)):  # a node's product is final once its parent's is
            probs = torch.where(root, 1.0, probs[self.par] * p)
        return probs

    def scores(self) -> torch.Tensor:
        """What ranks the nodes for the budget: ``p`` (calibrated) or the path confidence."""
        return self.p if self.shape.calibrated else self.conf

    # ------------------------------------------------------------------ one layer

    def admit(self, q: torch.Tensor, ids: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor, depth: int) -> None:
        """``_admit`` with no budget: the (F, k) proposals of ``parents`` (F,) (``valid``: real
        rows), best path confidence first (stable); one a node already holds is merged. The new
        layer is at ``depth``."""
        k = q.shape[1]
        f = q.shape[0]
        cpar, ctok, cq = parents[:, None].expand(f, k).reshape(-1), ids.reshape(-1), q.reshape(-1)
        cvalid = valid[:, None].expand(f, k).reshape(-1)
        c = self.conf[cpar] * cq
        order = torch.sort(torch.where(cvalid, -c, torch.inf), stable=True).indices
        cpar, ctok, cq, c, cvalid = cpar[order], ctok[order], cq[order], c[order], cvalid[order]
        match = self.alive & (self.idx > 0) & (self.par == cpar[:, None]) & (self.tok == ctok[:, None])  # (M, C+1)
        exists = match.any(dim=1) & cvalid
        existing = match.to(torch.uint8).argmax(dim=1)
        new = cvalid & ~exists
        sink = self.shape.capacity
        slot = torch.where(new, self.count + torch.cumsum(new.long(), 0) - 1, sink)
        target = torch.where(exists, existing, slot)
        self.src[torch.where(exists, existing, sink)] = torch.where(self.src[existing] == RETRIEVAL, BOTH,
                                                                     self.src[existing])
        self.tok[slot], self.par[slot], self.q[slot], self.conf[slot] = ctok, cpar, cq, c
        self.dep[slot] = self.dep[cpar] + 1
        self.src.index_fill_(0, slot, MODEL)  # a scalar fill: no host tensor is copied under capture
        self.slot.index_fill_(0, slot, self.sink_slot)
        self.count.add_(new.sum())
        self.alive.copy_(self.idx < self.count)
        self.rank.fill_(BIG)
        self.rank[target] = torch.where(cvalid, torch.arange(c.shape[0], device=self.device), BIG)
        self.rank[sink:].fill_(BIG)  # the sink is the last node
        if self.shape.calibrated or self.shape.costs:  # a merge changed a node's source, so its subtree's products
            self.p.copy_(self.probs(depth))

    def keep_best(self) -> None:
        """``_keep_best_layer``: grafted nodes plus the best model nodes by score (ties by id),
        ``budget`` in all, then the survivors renumbered in order."""
        draft = self.alive & (self.idx > 0)
        model = draft & (self.src == MODEL)
        keep_n = torch.clamp(self.shape.cfg.budget - (draft & ~model).sum(), min=0)
        order = torch.sort(torch.where(model, -self.scores(), torch.inf), stable=True).indices
        rank = torch.empty_like(order)
        rank[order] = self.idx
        alive = self.alive & (~model | (rank < keep_n))
        new_id = torch.cumsum(alive.long(), 0) - 1
        dest = torch.where(alive, new_id, self.shape.capacity)
        self.par.copy_(new_id[self.par])  # (a dead node's parent is read by no one)
        for stack in (self.node_ints, self.node_floats, self.node_flags):
            stack.copy_(torch.zeros_like(stack).index_copy_(1, dest, stack))
        self.count.copy_(alive.sum())
        self.alive.copy_(self.idx < self.count)
        self.rank.copy_(torch.where(self.alive, self.rank, BIG))

    def gate(self, depth: int) -> None:
        """The gate on the newest layer and the stops, in ``_build_adaptive``'s order; then the
        next frontier (``frontier``, ``rows``), none once the tree has stopped."""
        shape, cfg = self.shape, self.shape.cfg
        layer = self.alive & (self.rank < BIG)
        n = self.count - 1
        stop = torch.where((self.stop == 0) & ~layer.any(), torch.where(n >= cfg.budget, BUDGET, EMPTY), self.stop)
        layer_max = torch.where(layer, self.conf, -torch.inf).max()
        threshold = cfg.mu * layer_max
        passed = self.conf >= threshold
        self.gmax.copy_(torch.where(layer, layer_max, self.gmax))
        self.gthr.copy_(torch.where(layer, threshold, self.gthr))
        self.gpass.copy_(torch.where(layer, passed, self.gpass))
        self.gset.copy_(self.gset | layer)
        if depth >= cfg.max_depth:
            stop = torch.where(stop == 0, DEPTH, stop)
        stop = torch.where((stop == 0) & (layer_max < cfg.min_conf), MIN_CONF, stop)
        score = self.scores()
        model = self.alive & (self.idx > 0) & (self.src == MODEL)
        floor = torch.where(model, score, torch.inf).min()
        frontier = layer & passed & ((n < cfg.budget) | (score > floor))
        stop = torch.where((stop == 0) & ~frontier.any(), BUDGET, stop)
        order = torch.sort(torch.where(frontier, self.rank, BIG), stable=True).indices[:shape.width]
        width = frontier.sum()
        if shape.costs:
            stop = torch.where((stop == 0) & ~self.worth_layer(frontier, order, width, depth), COST, stop)
        self.stop.copy_(stop)
        self.frontier.copy_(order)
        self.rows.copy_(torch.where(stop == 0, width, 0))

    def worth_layer(self, frontier: torch.Tensor, order: torch.Tensor, width: torch.Tensor, depth: int) -> torch.Tensor:
        """``Planner.worth_layer`` (predicted drafting) as tensors: a bool scalar."""
        shape, cfg, probs = self.shape, self.shape.cfg, self.p
        draft = self.alive & (self.idx > 0)
        expected = torch.cumsum(torch.where(draft, probs, 0.0), 0)[-1]
        n = self.count - 1
        mass = torch.cumsum(torch.where(frontier[order], probs[order], 0.0), 0)[-1]
        new = cfg.top_k * width
        added = torch.clamp(torch.minimum(new, cfg.budget - n), min=0)
        ascending = torch.cumsum(torch.where(draft, probs, torch.inf).sort().values.nan_to_num(posinf=0.0), 0)
        displaced_n = torch.clamp(new - added, min=0)
        displaced = torch.where(displaced_n > 0, at(ascending, torch.clamp(displaced_n - 1, min=0, max=shape.capacity)),
                                0.0)

        def step_time(nodes: torch.Tensor, extra: torch.Tensor | float) -> torch.Tensor:
            tokens = torch.clamp(nodes + 1, max=self.verify.shape[0] - 1)
            return self.drafted + extra + at(self.verify, tokens) + self.other_s

        now = (expected + 1.0) / step_time(n, 0.0)
        ahead = min(cfg.max_depth - depth, LOOKAHEAD)
        if ahead < 1:
            return torch.zeros((), dtype=torch.bool, device=self.device)
        # the lookahead's layers at once: layer i adds ``added``, then ``new`` a layer up to the budget
        steps = torch.arange(ahead, device=self.device)
        nodes = torch.maximum(n + added, torch.minimum(n + added + steps * new, torch.clamp(n + added, min=cfg.budget)))
        grow = torch.cat([added.view(1), nodes[1:] - nodes[:-1]])
        going = torch.cumprod((grow > 0) | (steps == 0), 0).bool()  # the host's loop breaks at a layer adding none
        # sums in the host's order (a cumsum is a left fold): -displaced + mass c^1 + mass c^2 ...
        gain = torch.cumsum(torch.cat([-displaced.view(1), mass * self.cpow[1:ahead + 1]]), 0)[1:]
        draft_s = torch.cumsum(at(self.draft, torch.clamp(width, max=shape.width)).expand(ahead), 0)
        return (going & ((expected + gain + 1.0) / step_time(nodes, draft_s) > now)).any()

    def pack(self, bucket: Bucket, depth: int, embed_rows: int) -> None:
        """Write the next layer's inputs (the frontier of the layer at ``depth``) into
        ``bucket.packed``, as ``StaticForward.pack`` would from the host: the ids and positions
        (pads at the layer's position too), each row's ancestors' slots (written by earlier
        layers; the sink where a row has fewer), every row seeing its own slot; the frontier
        nodes' slots recorded, the rows kept for ``admit`` and ``used`` advanced."""
        b, e = bucket.size, bucket.earlier
        rows = self.frontier
        real = self.idx[:b] < self.rows
        tok = self.tok[rows]
        ints = bucket.ints
        ints[0].copy_(self.used)
        ints[1].copy_(self.base)
        ints[2:2 + b].copy_(torch.where(real & (tok < embed_rows), tok, 0))
        ints[2 + b:2 + 2 * b].copy_((self.root_pos + depth).expand(b))
        earlier = torch.full((b, e), self.sink_slot, dtype=torch.long, device=self.device)
        anc = self.par[rows]
        for j in range(min(e, depth - 1)):  # a layer-``depth`` node's ancestors, nearest first (the root's: the prefix)
            earlier[:, j] = torch.where(real & (anc > 0), self.slot[anc], self.sink_slot)
            anc = self.par[anc]
        ints[2 + 2 * b:].copy_(earlier.view(-1))
        bucket.window.copy_(torch.eye(b, dtype=torch.uint8, device=self.device))
        self.slot[torch.where(real, rows, self.shape.capacity)] = self.used + self.idx[:b]
        self.fed_rows.copy_(rows)
        self.fed_real_rows.copy_(self.rows)
        self.used.add_(self.rows)

    def root_update(self, bucket: Bucket, row: int, layer: Bucket, embed_rows: int) -> None:
        """After the root's forward (its readout in ``bucket``'s row ``row``): the root layer
        admitted, cut to the budget, gated, and the next layer packed into ``layer``."""
        self.root_top.copy_(bucket.top[row:row + 1])
        k, half = self.shape.cfg.root_k, self.shape.readout

        def update() -> None:
            self.admit(self.root_top[:, :k], self.root_top[:, half:half + k].long(), self.idx[:1], self.idx[:1] == 0, 1)
            self.keep_best()
            self.gate(1)
            self.pack(layer, 1, embed_rows)
        self.update(("root", layer.size), update)

    def layer_update(self, depth: int, layer: Bucket, embed_rows: int) -> None:
        """After the forward of the layer at ``depth - 1`` (its readout in ``layer``): the
        drafting clock, the layer at ``depth`` admitted, cut, gated, and the next one packed."""
        k, half = self.shape.cfg.top_k, self.shape.readout

        def update() -> None:
            self.widths[depth - 2].copy_(self.fed_real_rows)
            self.drafted.add_(at(self.draft, self.fed_real_rows))
            real = self.idx[:self.shape.width] < self.fed_real_rows
            self.admit(layer.top[:, :k], layer.top[:, half:half + k].long(), self.fed_rows, real, depth)
            self.keep_best()
            self.gate(depth)
            self.pack(layer, depth, embed_rows)
        self.update(("layer", depth), update)

    def update(self, key: tuple, fn: Callable[[], None]) -> None:
        """Run ``fn`` (an update of the buffers in place). Under ``graphs``, capture it at its
        first use and replay it ever after; ``rehearse`` does the same without a GPU: the first
        ``fn`` runs its warm-ups and is kept, and later steps run that one again, so any value of
        a step baked into it (not loaded into a buffer) would show. ``compiled``: the update
        compiled once, then captured (the warm-ups compile it)."""
        if not self.graphs and not self.rehearse:
            fn()
            return
        replay = self.captured.get(key)
        if replay is None:
            fused = torch.compile(fn, fullgraph=True, dynamic=False) if self.compiled else fn
            replay = self.captured[key] = self.capture(fused)
        replay()

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        """``fn`` captured as a CUDA graph (its ``replay``) by torch's rules: two warm-ups on a
        side stream first, each followed by restoring every buffer it wrote (so that only the
        replay changes the tree), then the capture in the buffers' pool. Rehearsed: the warm-ups
        and restores, and ``fn`` itself."""
        saved = [buf.clone() for buf in self.buffers()]

        def warm() -> None:
            for _ in range(2):
                fn()
                for buf, old in zip(self.buffers(), saved):
                    buf.copy_(old)
        if not self.graphs:  # rehearsed: eager updates are held to capture's rule (a compiled one is traced instead)
            with contextlib.nullcontext() if self.compiled else HostScalarGuard():
                warm()
            return fn
        with CAPTURE_LOCK:
            current = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                warm()
            current.wait_stream(side)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                fn()
            torch.cuda.synchronize(self.device)
        return graph.replay

    def read(self, forwards: int) -> tuple[dict[str, np.ndarray], int, list[int]]:
        """One copy back: the per-node fields, the stop code and the rows of the first
        ``forwards`` chained forwards."""
        names = (*NODE_INTS, *NODE_FLOATS, *GATES)
        c = self.shape.capacity + 1
        parts = [getattr(self, name).double() for name in names]
        host = torch.cat([*parts, self.count.view(1).double(), self.stop.view(1).double(),
                          self.widths.double()]).cpu().numpy()
        fields = {name: host[i * c:(i + 1) * c] for i, name in enumerate(names)}
        tail = host[len(names) * c:]
        count = int(tail[0])
        return {k: v[:count] for k, v in fields.items()}, int(tail[1]), [int(w) for w in tail[2:2 + forwards]]


def tree_of(fields: dict[str, np.ndarray], stop: int) -> DraftTree:
    """The host's ``DraftTree`` from the device state's fields (``ChainState.read``)."""
    tree = DraftTree.with_root(int(fields["tok"][0]))
    for i in range(1, len(fields["tok"])):
        tree.add(int(fields["par"][i]), int(fields["tok"][i]), float(fields["q"][i]), SOURCES[int(fields["src"][i])])
        if fields["gset"][i]:
            tree.gates[i] = Gate(layer_max=float(fields["gmax"][i]), threshold=float(fields["gthr"][i]),
                                 passed=bool(fields["gpass"][i]))
    tree.stop = STOPS[stop - 1] if stop else "depth"
    return tree
