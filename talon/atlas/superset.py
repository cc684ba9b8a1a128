"""The superset recorder: every position's generous superset tree around a greedy text, grown best
first in rounds, its missing children drafted in batched forwards of the draft model (a model
source on a 4D mask), the retrieval graft, the static beam and the draft's own chains; what
``talon.atlas.record`` records an atlas with (``PairRecorder`` drafts the same way from a module
on the target's features)."""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from talon.atlas.data import Atlas, AtlasSpec, Key, canonical_key
from talon.atlas.replay import replay
from talon.core.contracts import Children
from talon.core.forward import forward_hidden
from talon.core.kv import gather_entries
from talon.drafters.model import ModelSource
from talon.drafters.retrieval import Retriever
from talon.models.head import lm_logits
from talon.run_config import RunConfig

logger = logging.getLogger(__name__)

Progress = Callable[[float, str], None]  # (fraction done, what is happening)
MAX_ROWS = 192  # tree nodes per batched draft forward


@dataclass
class Superset:
    """One position's superset tree as far as the known children allow."""

    p: int
    admitted: list[tuple[tuple[int, ...], float]]  # (path, path confidence), model and retrieval nodes
    wanted: list[Key]  # canonical keys of admitted nodes whose children are not known yet


class SupersetRecorder:
    """Grows every position's superset and asks the draft model for missing children."""

    def __init__(self, source: ModelSource | None, prompt_ids: list[int], output: list[int], spec: AtlasSpec) -> None:
        self.source = source
        self.prompt_ids, self.output, self.spec = prompt_ids, output, spec
        self.seq = prompt_ids + output  # (S,) the committed context of every position is a prefix
        self.prefix = len(self.seq)  # the cache entries of the committed text, kept between chunks
        self.root_index = len(prompt_ids) - 1  # seq index of the root at p = 0
        self.children: dict[Key, Children] = {}
        self.cache = DynamicCache(config=source.model.config) if source is not None else DynamicCache()
        self.slots: dict[Key, int] = {}  # keys fed into the cache in this chunk -> cache index
        self.wide: set[Key] = set()  # nodes of the draft's own chains (``AtlasSpec.chain_depth``)
        self.rows = 0
        self.forwards = 0

    # --- keys ------------------------------------------------------------------------------

    def canonical(self, p: int, path: tuple[int, ...]) -> Key:
        return canonical_key(self.output, p, path)

    def _k(self, key: Key) -> int:
        """Children kept for ``key``: a root's K, another node's k, a chain node's ``chain_k``."""
        if self.spec.chain_depth and (not key[1] or key in self.wide):
            return max(self.spec.root_k, self.spec.top_k, self.spec.chain_k)
        return max(self.spec.root_k, self.spec.top_k) if not key[1] else self.spec.top_k

    def _widest(self) -> int:  # children drafted per node
        return max(self.spec.root_k, self.spec.top_k, self.spec.chain_k if self.spec.chain_depth else 0)

    # --- the draft model -------------------------------------------------------------------

    def _topk(self, hidden: torch.Tensor, keys: list[Key]) -> None:
        """Record the top children of each of ``keys`` from its last hidden state ``(T, H)``."""
        probs = torch.softmax(lm_logits(self.source.model, hidden, self.source.vocab_size), dim=-1)  # (T, V)
        q, tokens = probs.topk(self._widest(), dim=-1)  # (T, k)
        for key, toks, qs in zip(keys, tokens.tolist(), q.tolist()):
            self.children[key] = list(zip(toks, qs))[: self._k(key)]

    @torch.inference_mode()
    def _prefill(self) -> None:
        """One causal forward over prompt + output: the children of every greedy-text node."""
        ids = self.source.embeddable_ids(self.seq)
        hidden = forward_hidden(self.source.model, self.cache, ids, torch.arange(len(ids)), None)  # (S, H)
        self.forwards += 1
        first = self.root_index
        for start in range(first, len(self.seq), 256):
            stop = min(start + 256, len(self.seq))
            self._topk(hidden[start:stop], [(p - first, ()) for p in range(start, stop)])

    @torch.inference_mode()
    def _feed(self, keys: list[Key]) -> None:
        """Children of ``keys`` (off-text nodes), with their ancestors fed first where this chunk's
        cache lacks them; batched, each node seeing its root's context, its ancestors, itself."""
        order: list[Key] = []
        seen = set(self.slots)
        for p, path in keys:
            for i in range(1, len(path) + 1):
                key = (p, path[:i])
                if key not in seen:
                    seen.add(key)
                    order.append(key)
        order.sort(key=lambda key: len(key[1]))  # ancestors first
        for batch in self._batches(order):
            out = self._forward(batch)
            fresh = [(i, key) for i, key in enumerate(batch) if key not in self.children]
            if fresh:
                self._topk(out[[i for i, _ in fresh]], [key for _, key in fresh])

    def _batches(self, order: list[Key]) -> Iterator[list[Key]]:
        """The fed nodes, ancestors first, at most ``MAX_ROWS`` a forward (a node may share one
        with its parent: the mask orders them)."""
        for start in range(0, len(order), MAX_ROWS):
            yield order[start:start + MAX_ROWS]

    def _forward(self, batch: list[Key]) -> torch.Tensor:
        old = self.cache.get_seq_length()
        visible = torch.zeros(len(batch), old + len(batch), dtype=torch.bool)  # (T, S + T)
        positions = []
        for row, (p, path) in enumerate(batch):
            root = self.root_index + p
            visible[row, : root + 1] = True
            for i in range(1, len(path)):
                visible[row, self.slots[(p, path[:i])]] = True
            visible[row, old + row] = True
            self.slots[(p, path)] = old + row
            positions.append(root + len(path))
        ids = self.source.embeddable_ids([path[-1] for _, path in batch])
        self.forwards += 1
        self.rows += len(batch)
        return forward_hidden(self.source.model, self.cache, ids, torch.tensor(positions), visible)

    def forget(self) -> None:
        """The chunk's node entries were dropped: forget what they held (a head's outputs)."""

    # --- the superset ----------------------------------------------------------------------

    def _grow(self, p: int, graft: list[tuple[tuple[int, ...], float]]) -> Superset:
        """Position ``p``'s superset as far as the known children allow: the graft, then model
        nodes best first, then the static beam; admitted nodes whose children are unknown are
        wanted."""
        spec = self.spec
        admitted: list[tuple[tuple[int, ...], float]] = []
        wanted: list[Key] = []
        in_tree = {(): 1.0}
        in_tree.update(graft)
        heap: list[tuple[float, int, tuple[int, ...]]] = []
        tick = 0

        def offer(path: tuple[int, ...], conf: float) -> None:
            nonlocal tick
            if len(path) >= spec.max_depth:
                return
            key = self.canonical(p, path)
            kids = self.children.get(key)
            if kids is None:
                wanted.append(key)
                return
            for token, q in kids[: spec.root_k if not path else spec.top_k]:
                child = path + (token,)
                if child not in in_tree:
                    heapq.heappush(heap, (-conf * q, tick, child))
                    tick += 1

        offer((), 1.0)
        for path, conf in graft:
            admitted.append((path, conf))
            offer(path, conf)
        model_nodes = 0
        while heap and model_nodes < spec.n_nodes:
            neg_conf, _, path = heapq.heappop(heap)
            if path in in_tree:
                continue
            in_tree[path] = -neg_conf
            admitted.append((path, -neg_conf))
            model_nodes += 1
            offer(path, -neg_conf)
        self._beam(p, in_tree, admitted, wanted)
        return Superset(p, admitted, list(dict.fromkeys(wanted)))

    def _beam(self, p: int, in_tree: dict[tuple[int, ...], float], admitted: list, wanted: list[Key]) -> None:
        """Add the static tree's beam: the ``beam`` most confident nodes of every layer expand,
        to ``max_depth``, however low their confidence (the static baseline drafts them)."""
        spec = self.spec
        layer = [((), 1.0)]
        for depth in range(spec.max_depth):
            nxt = []
            for path, conf in layer:
                kids = self.children.get(self.canonical(p, path))
                if kids is None:
                    wanted.append(self.canonical(p, path))
                    continue
                for token, q in kids[: spec.root_k if not path else spec.beam]:
                    nxt.append((path + (token,), conf * q))
            layer = sorted(nxt, key=lambda node: -node[1])
            for path, conf in layer:
                if path not in in_tree:
                    in_tree[path] = conf
                    admitted.append((path, conf))
            layer = layer[: spec.beam] if depth + 1 < spec.max_depth else []

    def _grafts(self) -> list[list[tuple[tuple[int, ...], float]]]:
        """The generous retrieval graft at every position: (path, path confidence) per node."""
        retriever, grafts = Retriever(self.spec.retrieval), []
        retriever.reset(self.prompt_ids)
        for p in range(len(self.output)):
            proposal = retriever.propose(self.spec.n_nodes)
            confs: list[float] = []
            nodes = []
            for i, (parent, q) in enumerate(zip(proposal.parents, proposal.q)):
                confs.append((1.0 if parent < 0 else confs[parent]) * q)
                nodes.append((tuple(proposal.path(i)), confs[-1]))
            grafts.append(nodes)
            retriever.extend(self.output[p:p + 1])
        return grafts

    def _chains(self, chunk: range) -> None:
        """The draft's own greedy chain from every position of ``chunk``, ``chain_depth`` deep, ``chain_k``
        children a node: a layer of the chunk's chains a forward (a narrower node is drafted again)."""
        while depth := self.spec.chain_depth:
            wanted: list[Key] = []
            for p in chunk:
                path: tuple[int, ...] = ()
                for _ in range(depth):
                    key = self.canonical(p, path)
                    kids = self.children.get(key)
                    if kids is None or len(kids) < self._k(key) or (path and key not in self.wide):
                        wanted.append(key)
                        break
                    path += (kids[0][0],)
            if not (wanted := list(dict.fromkeys(wanted))):
                return
            for key in wanted:
                self.wide.add(key)
                if key in self.children and len(self.children[key]) < self._k(key):
                    del self.children[key]  # drafted again, wider: fed anew
                    self.slots.pop(key, None)
            self._feed(wanted)

    def cover(self, atlas: Atlas, configs: Sequence[RunConfig], rounds: int = 12) -> None:
        """Feed the nodes the replays of ``configs`` ask for and ``atlas`` (sharing this recorder's
        children) lacks, round after round, until none is missing (each round reaches a layer deeper)."""
        for _ in range(rounds):
            missing: set[Key] = set()
            for cfg in configs:
                missing |= replay(atlas, cfg).coverage.missing
            missing -= self.children.keys()
            if not missing:
                return
            self._feed(sorted(missing, key=lambda key: (len(key[1]), key)))
            gather_entries(self.cache, list(range(self.prefix)))  # drop the fed node entries again
            self.slots = {}
            self.forget()
        logger.warning("the atlas still misses nodes after %d cover rounds", rounds)

    def record(self, progress: Progress) -> None:
        self._prefill()
        grafts = self._grafts()
        prefix = self.prefix
        positions = len(self.output)
        for start in range(0, positions, self.spec.chunk):
            chunk = range(start, min(start + self.spec.chunk, positions))
            while True:
                wanted = list(dict.fromkeys(
                    key for p in chunk for key in self._grow(p, grafts[p]).wanted if key not in self.children))
                if not wanted:
                    break
                self._feed(wanted)
            self._chains(chunk)
            gather_entries(self.cache, list(range(prefix)))  # drop the chunk's node entries
            self.slots = {}
            self.forget()
            done = chunk.stop / positions
            progress(done, f"positions {chunk.stop} of {positions}: {len(self.children)} nodes, "
                           f"{self.rows} drafted in {self.forwards} forwards")
