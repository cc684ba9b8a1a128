"""TALON's adaptive tree grown on the draft model's device: the draft layers chained with no
host turnaround between them.

``talon.builder`` grows a tree on the host: each draft layer copies its nodes' top-k children
back, and the gate, the budget, the merge with retrieval's grafted nodes and the cost planner
decide there which nodes the next layer expands. On a GPU every layer then waits for the host.
Here the same decisions are tensor operations over a tree of fixed capacity on the device, and
they write the next layer's packed inputs (``talon.static.Bucket.packed``) themselves, so a
step's layers are launched back to back and the tree crosses to the host once, at the end.

Every operation has a fixed shape and reads no value on the host (no ``.item()``, no boolean
indexing), so that the whole of a layer's update can be queued behind the forward, and captured
with it; the suite runs it on the ``meta`` device, where any read of a value fails. It grows the
tree ``build_tree`` grows, node for node, float for float (tested on the CPU): the candidates
sorted by path confidence (stable), a proposal that a grafted node already holds merged
(``both``), the budget cut to the best nodes by score (the path confidence or the acceptance
model's calibrated P(accepted), ties by id), the gate, the stops, and the cost planner's "is the
next layer worth it" with the drafting charged at the cost model's prediction.

The host does not know when the tree stops. It launches layers in chunks (``ahead``: as many as
the last step used) and reads the state once per chunk; a layer launched after the tree stopped
runs on pads only and is reported as an idle forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from talon.plan import LOOKAHEAD, MATCH_EDGES, Q_EDGES, AcceptanceModel, Planner
from talon.run_config import TreeConfig
from talon.static import Bucket
from talon.tree import SOURCES, DraftTree, Gate

STOPS = ("", "budget", "depth", "min_conf", "cost", "empty")  # the device's stop codes (0: growing)
MODEL, RETRIEVAL, BOTH = SOURCES.index("model"), SOURCES.index("retrieval"), SOURCES.index("both")
FIELDS = ("tok", "par", "dep", "src", "slot", "q", "conf", "gmax", "gthr", "gpass", "gset")  # read back, in order


@dataclass(frozen=True)
class ChainCosts:
    """The cost planner's inputs for one step, as tables the device reads: its checks are then
    the host's, number for number (``Planner.worth_layer`` with ``predicted=True``)."""

    cpow: torch.Tensor  # (LOOKAHEAD + 1,) float64: continues ** i
    draft: torch.Tensor  # (W + 1,) float64: draft_s(width)
    verify: torch.Tensor  # (C + 2,) float64: verify_s(tokens)
    other_s: float
    drafted: float  # the step's drafting so far (the root's forward), as the planner charges it


@dataclass(frozen=True)
class ChainPlan:
    """What one step's tree needs to decide as ``build_tree`` would: the shape, the scores'
    tables (``calibrated``) and the planner's (``costs``; None: no cost planner)."""

    cfg: TreeConfig
    budget: int
    width: int  # W: the rows of a layer's forward (a bucket holding the widest layer)
    capacity: int  # C: nodes the state holds (root, grafts, the kept nodes and one layer's candidates)
    depth_bound: int  # the deepest node a step's tree can hold (grafts and model layers)
    match_len: int
    calibrated: bool
    rates: torch.Tensor  # (3, 11) float64: the acceptance model's rates (model, both, retrieval bins)
    costs: ChainCosts | None


def chain_width(budget: int, grafted: int, buckets: tuple[int, ...]) -> int:
    """The bucket of a chained layer: it holds the widest layer (the budget, or the grafts)."""
    need = max(budget, grafted, 1)
    for b in buckets:
        if b >= need:
            return b
    raise ValueError(f"a layer of {need} nodes exceeds the largest bucket ({buckets[-1]})")


def make_plan(shared: DraftTree, cfg: TreeConfig, budget: int, width: int, match_len: int, calibrated: bool,
              acceptance: AcceptanceModel, planner: Planner | None, device: torch.device) -> ChainPlan:
    """The step's plan, built on the host from the planner's state now (one upload)."""
    capacity = 2 + max(budget, shared.num_draft) + max(cfg.root_k, width * cfg.top_k)
    rates = np.zeros((3, len(Q_EDGES) + 1))
    for row, calibration in enumerate((acceptance.model, acceptance.both, acceptance.retrieval)):
        for i in range(len(calibration.priors)):
            rates[row, i] = calibration.rate(i)
    costs = None
    if planner is not None:
        c = planner.acceptance.continues.mean
        model = planner.costs
        costs = ChainCosts(
            cpow=torch.tensor([c**i for i in range(LOOKAHEAD + 1)], dtype=torch.float64, device=device),
            draft=torch.tensor([model.draft_s(w) for w in range(width + 1)], dtype=torch.float64, device=device),
            verify=torch.tensor([model.verify_s(t) for t in range(capacity + 2)], dtype=torch.float64, device=device),
            other_s=model.other_s, drafted=planner.drafted_s())
    return ChainPlan(cfg=cfg, budget=budget, width=width, capacity=capacity,
                     depth_bound=max(shared.depths) + cfg.max_depth, match_len=match_len, calibrated=calibrated,
                     rates=torch.tensor(rates, dtype=torch.float64, device=device), costs=costs)


def at(table: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """``table[i]`` for a 0-d index tensor, without reading ``i`` on the host (a plain index
    would: ``.item()``, a synchronisation on a GPU)."""
    return table.gather(0, i.reshape(1)).squeeze(0)


class ChainState:
    """A tree of ``capacity`` nodes on the device (index ``capacity``: a sink for writes that go
    nowhere). Nodes ``0 .. count - 1`` are the tree in ``build_tree``'s numbering; ``rank``
    orders the newest layer (the order ``_admit`` admitted it in), BIG elsewhere."""

    BIG = 1 << 40

    def __init__(self, tree: DraftTree, plan: ChainPlan, sink_slot: int, device: torch.device) -> None:
        c = plan.capacity + 1
        self.plan, self.device, self.sink_slot = plan, device, sink_slot
        n = len(tree)
        if n + max(plan.cfg.root_k, 1) > plan.capacity:
            raise ValueError(f"a graft of {n - 1} nodes does not fit a chained tree of {plan.capacity}")
        ints = np.zeros((5, c), dtype=np.int64)
        ints[:, :n] = [tree.tokens, tree.parents, tree.depths, [SOURCES.index(s) for s in tree.sources], [0] * n]
        ints[1, 0] = 0  # the root is its own parent: every gather stays in range
        ints[4, :] = sink_slot
        floats = np.zeros((2, c))
        floats[:, :n] = [tree.q_draft, tree.path_conf]
        host = torch.from_numpy(np.concatenate([ints.astype(np.float64), floats]))
        state = host.to(device, non_blocking=True)  # one upload
        self.tok, self.par, self.dep, self.src, self.slot = (state[i].long() for i in range(5))
        self.q, self.conf = state[5].clone(), state[6].clone()
        self.idx = torch.arange(c, device=device)
        self.alive = self.idx < n
        self.count = torch.tensor(n, device=device)
        self.rank = torch.full((c,), self.BIG, device=device)
        self.gmax = torch.zeros(c, dtype=torch.float64, device=device)
        self.gthr = torch.zeros(c, dtype=torch.float64, device=device)
        self.gpass = torch.zeros(c, dtype=torch.bool, device=device)
        self.gset = torch.zeros(c, dtype=torch.bool, device=device)
        self.stop = torch.tensor(0, device=device)
        self.drafted = torch.tensor(plan.costs.drafted if plan.costs else 0.0, dtype=torch.float64, device=device)
        self.frontier = torch.zeros(plan.width, dtype=torch.long, device=device)  # the next layer's rows
        self.rows = torch.tensor(0, device=device)  # how many of them are real
        self.widths: list[torch.Tensor] = []  # each chained forward's real rows (device scalars)
        self.q_edges = torch.tensor(Q_EDGES, dtype=torch.float64, device=device)
        self.match_edges = torch.tensor(MATCH_EDGES, device=device)
        self.needs_probs = plan.calibrated or plan.costs is not None
        self.p = torch.ones(c, dtype=torch.float64, device=device)  # P(accepted), kept with the tree
        self.used = torch.tensor(0, device=device)  # the draft cache's slots written (set by the driver)

    # ------------------------------------------------------------------ scores

    def probs(self) -> torch.Tensor:
        """(C+1,) float64: the acceptance model's P(node accepted), the root 1, as
        ``AcceptanceModel.node_probs`` multiplies it along each path (in the same order)."""
        plan = self.plan
        qbin = torch.bucketize(self.q, self.q_edges, right=True)
        mbin = torch.bucketize(plan.match_len + self.dep - 1, self.match_edges, right=True)
        retrieval = torch.clamp(plan.rates[2][mbin] * self.q, max=1.0)
        p = torch.where(self.src == BOTH, plan.rates[1][qbin], torch.where(self.src == RETRIEVAL, retrieval, plan.rates[0][qbin]))
        probs = torch.ones_like(p)
        root = self.idx == 0
        for _ in range(plan.depth_bound):  # a node's product is final once its parent's is
            probs = torch.where(root, 1.0, probs[self.par] * p)
        return probs

    def scores(self) -> torch.Tensor:
        """What ranks the nodes for the budget: ``p`` (calibrated) or the path confidence."""
        return self.p if self.plan.calibrated else self.conf

    # ------------------------------------------------------------------ one layer

    def admit(self, q: torch.Tensor, ids: torch.Tensor, parents: torch.Tensor, valid: torch.Tensor) -> None:
        """``_admit`` with no budget: the (F, k) proposals of ``parents`` (F,) (``valid``: real
        rows), best path confidence first (stable); one a node already holds is merged."""
        f, k = q.shape
        cpar = parents.repeat_interleave(k)
        ctok, cq = ids.reshape(-1), q.reshape(-1)
        cvalid = valid.repeat_interleave(k)
        c = self.conf[cpar] * cq
        key = torch.where(cvalid, -c, torch.inf)
        order = torch.sort(key, stable=True).indices
        cpar, ctok, cq, c, cvalid = cpar[order], ctok[order], cq[order], c[order], cvalid[order]
        match = self.alive & (self.idx > 0) & (self.par == cpar[:, None]) & (self.tok == ctok[:, None])  # (M, C+1)
        exists = match.any(dim=1) & cvalid
        existing = match.to(torch.uint8).argmax(dim=1)
        new = cvalid & ~exists
        sink = self.plan.capacity
        at = torch.where(new, self.count + torch.cumsum(new.long(), 0) - 1, sink)
        target = torch.where(exists, existing, torch.where(new, at, sink))
        self.src[torch.where(exists, existing, sink)] = torch.where(
            self.src[existing] == RETRIEVAL, BOTH, self.src[existing])
        self.tok[at], self.par[at], self.q[at], self.conf[at] = ctok, cpar, cq, c
        self.dep[at] = self.dep[cpar] + 1
        self.src[at] = MODEL
        self.slot[at] = self.sink_slot
        self.count = self.count + new.sum()
        self.alive = self.idx < self.count
        self.rank = torch.full_like(self.rank, self.BIG)
        self.rank[target] = torch.where(cvalid, torch.arange(c.shape[0], device=self.device), self.BIG)
        self.rank[sink] = self.BIG
        if self.needs_probs:  # a merge changed a node's source, so its subtree's products
            self.p = self.probs()

    def keep_best(self) -> None:
        """``_keep_best_layer``: grafted nodes plus the best model nodes by score (ties by id),
        ``budget`` in all, then the survivors renumbered in order."""
        draft = self.alive & (self.idx > 0)
        model = draft & (self.src == MODEL)
        keep_n = torch.clamp(self.plan.budget - (draft & ~model).sum(), min=0)
        order = torch.sort(torch.where(model, -self.scores(), torch.inf), stable=True).indices
        rank = torch.empty_like(order)
        rank[order] = self.idx
        alive = self.alive & (~model | (rank < keep_n))
        new_id = torch.cumsum(alive.long(), 0) - 1
        dest = torch.where(alive, new_id, self.plan.capacity)
        for name in ("tok", "dep", "src", "slot", "rank", "q", "conf", "p", "gmax", "gthr", "gpass", "gset"):
            old = getattr(self, name)
            setattr(self, name, torch.zeros_like(old).index_copy_(0, dest, old))
        par = torch.zeros_like(self.par).index_copy_(0, dest, new_id[self.par])
        self.par = par
        self.count = alive.sum()
        self.alive = self.idx < self.count
        self.rank = torch.where(self.alive, self.rank, self.BIG)

    def gate(self, depth: int, costs_ok: bool = True) -> None:
        """The gate on the newest layer and the stops, in ``_build_adaptive``'s order; then the
        next frontier (``frontier``, ``rows``), none once the tree has stopped."""
        plan, cfg = self.plan, self.plan.cfg
        layer = self.alive & (self.rank < self.BIG)
        n = self.count - 1
        stop = self.stop
        stop = torch.where((stop == 0) & ~layer.any(), torch.where(n >= plan.budget, 1, 5), stop)
        layer_max = torch.where(layer, self.conf, -torch.inf).max()
        threshold = cfg.mu * layer_max
        passed = self.conf >= threshold
        self.gmax = torch.where(layer, layer_max, self.gmax)
        self.gthr = torch.where(layer, threshold, self.gthr)
        self.gpass = torch.where(layer, passed, self.gpass)
        self.gset = self.gset | layer
        if depth >= cfg.max_depth:
            stop = torch.where(stop == 0, 2, stop)
        stop = torch.where((stop == 0) & (layer_max < cfg.min_conf), 3, stop)
        score = self.scores()
        model = self.alive & (self.idx > 0) & (self.src == MODEL)
        floor = torch.where(model, score, torch.inf).min()
        frontier = layer & passed & ((n < plan.budget) | (score > floor))
        stop = torch.where((stop == 0) & ~frontier.any(), 1, stop)
        order = torch.sort(torch.where(frontier, self.rank, self.BIG), stable=True).indices[: plan.width]
        width = frontier.sum()
        if plan.costs is not None:
            worth = self.worth_layer(frontier, order, width, depth)
            stop = torch.where((stop == 0) & ~worth, 4, stop)
        self.stop = stop
        self.frontier = order
        self.rows = torch.where(stop == 0, width, 0)

    def worth_layer(self, frontier: torch.Tensor, order: torch.Tensor, width: torch.Tensor, depth: int) -> torch.Tensor:
        """``Planner.worth_layer`` (predicted drafting) as tensors: a bool scalar."""
        plan, cfg, costs, probs = self.plan, self.plan.cfg, self.plan.costs, self.p
        draft = self.alive & (self.idx > 0)
        expected = torch.cumsum(torch.where(draft, probs, 0.0), 0)[-1]
        n = self.count - 1
        mass = torch.cumsum(torch.where(frontier[order], probs[order], 0.0), 0)[-1]
        new = cfg.top_k * width
        added = torch.clamp(torch.minimum(new, plan.budget - n), min=0)
        displaced_n = torch.clamp(new - added, min=0)
        ascending = torch.cumsum(torch.where(draft, probs, torch.inf).sort().values.nan_to_num(posinf=0.0), 0)
        displaced = torch.where(displaced_n > 0, at(ascending, torch.clamp(displaced_n - 1, min=0, max=plan.capacity)), 0.0)

        def step_time(nodes: torch.Tensor, extra: torch.Tensor | float) -> torch.Tensor:
            return self.drafted + extra + at(costs.verify, torch.clamp(nodes + 1, max=costs.verify.shape[0] - 1)) + costs.other_s

        now = (expected + 1.0) / step_time(n, 0.0)
        gain, nodes, draft_s = -displaced, n, torch.zeros((), dtype=torch.float64, device=self.device)
        worth = torch.zeros((), dtype=torch.bool, device=self.device)
        going = torch.ones((), dtype=torch.bool, device=self.device)
        for i in range(1, min(cfg.max_depth - depth, LOOKAHEAD) + 1):
            grow = added if i == 1 else torch.clamp(torch.minimum(new, plan.budget - nodes), min=0)
            if i > 1:
                going = going & (grow > 0)
            gain = gain + mass * costs.cpow[i]
            nodes = nodes + grow
            draft_s = draft_s + at(costs.draft, torch.clamp(width, max=plan.width))
            worth = worth | (going & ((expected + gain + 1.0) / step_time(nodes, draft_s) > now))
        return worth

    def drafted_forward(self) -> None:
        """The planner's clock after a chained forward of ``rows`` real rows."""
        self.widths.append(self.rows)
        if self.plan.costs is not None:
            self.drafted = self.drafted + at(self.plan.costs.draft, self.rows)

    # ------------------------------------------------------------------ the host's copy

    def read(self) -> tuple[dict[str, np.ndarray], int, list[int]]:
        """One copy back: the per-node fields, the stop code and each forward's rows."""
        c = self.plan.capacity + 1
        parts = [getattr(self, name).double() for name in FIELDS]
        extras = torch.stack([self.count, self.stop, *self.widths]).double() if self.widths else \
            torch.stack([self.count, self.stop]).double()
        host = torch.cat([*parts, extras]).cpu().numpy()
        fields = {name: host[i * c:(i + 1) * c] for i, name in enumerate(FIELDS)}
        count, stop = int(host[len(FIELDS) * c]), int(host[len(FIELDS) * c + 1])
        widths = [int(w) for w in host[len(FIELDS) * c + 2:]]
        return {k: v[:count] for k, v in fields.items()}, stop, widths


def tree_of(fields: dict[str, np.ndarray], stop: int) -> DraftTree:
    """The host's ``DraftTree`` from the device state's fields (``ChainState.read``)."""
    tree = DraftTree.with_root(int(fields["tok"][0]))
    for i in range(1, len(fields["tok"])):
        tree.add(int(fields["par"][i]), int(fields["tok"][i]), float(fields["q"][i]), SOURCES[int(fields["src"][i])])
        if fields["gset"][i]:
            tree.gates[i] = Gate(layer_max=float(fields["gmax"][i]), threshold=float(fields["gthr"][i]),
                                 passed=bool(fields["gpass"][i]))
    tree.stop = STOPS[stop] or "depth"
    return tree


def pack_layer(state: ChainState, bucket: Bucket, base: int, position: int, embed_rows: int) -> None:
    """Write the next layer's inputs into ``bucket.packed`` on the device, as
    ``StaticForward.pack`` would from the host: the frontier's ids and positions (``position``:
    the layer's, pads too), each row's ancestors' slots (written by earlier layers; the sink
    where a row has fewer), every row seeing its own slot; the frontier nodes' slots recorded and
    ``state.used`` advanced by its real rows."""
    b, e = bucket.size, bucket.earlier
    rows = state.frontier
    real = state.idx[:b] < state.rows
    tok = state.tok[rows]
    ints = bucket.ints
    ints[0].copy_(state.used)
    ints[1].fill_(base)
    ints[2:2 + b].copy_(torch.where(real & (tok < embed_rows), tok, 0))
    ints[2 + b:2 + 2 * b].fill_(position)
    earlier = torch.full((b, e), state.sink_slot, dtype=torch.long, device=state.device)
    anc = state.par[rows]
    for j in range(min(e, state.plan.depth_bound)):  # the ancestors, nearest first; the root's slot is the prefix's
        earlier[:, j] = torch.where(real & (anc > 0), state.slot[anc], state.sink_slot)
        anc = state.par[anc]
    ints[2 + 2 * b:].copy_(earlier.view(-1))
    bucket.window.copy_(torch.eye(b, dtype=torch.uint8, device=state.device))
    state.slot[torch.where(real, rows, state.plan.capacity)] = state.used + state.idx[:b]
    state.used = state.used + state.rows
