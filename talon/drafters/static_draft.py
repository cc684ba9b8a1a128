"""The model source on a static-shape forward (``talon/graphs/static.py``): the same children as
``ModelSource``, from a preallocated slot cache at bucketed sizes, so that on a GPU each draft
layer is one graph replay.

The slot cache holds the committed context in slots ``0 .. fed - 1``; during a step each layer's
nodes go into the next free slots (``used``), and a node sees the committed context, its
ancestors' slots and its own. ``commit`` moves the accepted path's entries to the slots after
the context; an async fork takes a second forward from the pool and copies the used slots.

Each layer makes one copy back to the host: its nodes' top-k children and their probabilities,
read out inside the forward (so that a graph replays the softmax and the top-k too); the
confidence gate and the budget decide on the host which nodes the next layer expands. With
``chain`` (TALON's adaptive tree) they decide on the device instead (``talon.graphs.chain``): the
layers go back to back and the tree crosses to the host once a step.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from talon.drafters.model import ModelSource, path_key
from talon.graphs.chain import ChainShape, ChainState, StepTables, tree_of
from talon.graphs.pool import StaticPool
from talon.graphs.static import Bucket, StaticForward, bucket_for
from talon.tree import DraftTree

if TYPE_CHECKING:
    from talon.cost.plan import CalibratedAcceptance, Planner
    from talon.run_config import TreeConfig


class StaticModelSource(ModelSource):
    def __init__(self, model: PreTrainedModel, pool: StaticPool, tokens: int, vocab_size: int = 0,
                 target_vocab: int = 0, fork_pool: StaticPool | None = None, capture_all: bool = False,
                 chain: bool = False, ahead: bool | None = None, rehearse: bool = False) -> None:
        """``pool``: the draft model's static forwards; ``tokens``: the most a run commits
        (prompt, new tokens, a step's nodes), which the forward's slot cache must hold.
        ``fork_pool``: where an async fork takes its forward (default ``pool``); ``capture_all``:
        capture every bucket of this drafter's forward when it is taken, not each at first use.
        ``chain``: grow adaptive trees on the device (``chained_tree``); ``ahead``: launch as many
        layers as the last step used before reading the state (default: on CUDA, where a launch
        does not wait; on the CPU every layer is read, so no forward is wasted); ``rehearse``: run
        each chained update's capture warm-ups and restores without a GPU (tests)."""
        if not pool.drafts or (fork_pool is not None and not fork_pool.drafts):
            raise ValueError("a static model source needs drafting pools (StaticPool(..., drafts=True))")
        super().__init__(model, vocab_size, target_vocab)
        self.pool, self.tokens, self.capture_all = pool, tokens, capture_all
        self.fork_pool = fork_pool or pool
        self.static: StaticForward | None = None
        self.used = 0  # slots written: the committed context's, then this step's nodes'
        self.chain, self.rehearse = chain, rehearse
        self.ahead = (model.device.type == "cuda") if ahead is None else ahead
        self.last_layers = 0  # the chained layers the last step used (how many to launch unread)
        self.idle_forwards = 0  # chained forwards launched after the tree had stopped (this run)

    def _forward(self) -> StaticForward:
        if self.static is None:
            self.static = self.pool.take(self.tokens, self.vocab_size)
            if self.capture_all and self.static.graphs:
                self.static.capture(0)  # before any slot is committed: the warm-ups write slots the prefill rewrites
        return self.static

    def reset(self, prompt_ids: list[int], prefill: bool = True) -> None:
        self.context, self.fed, self.used, self.slots, self.timings = list(prompt_ids), 0, 0, {}, []
        if prefill and len(prompt_ids) > 1:  # all but the root; the root goes with the first expansion
            self._forward().prefill(self.embeddable_ids(prompt_ids[:-1]))
            self.fed = self.used = len(prompt_ids) - 1

    def _top(self, tree: DraftTree, nodes: list[int], k: int) -> tuple[list[list[float]], list[list[int]]]:
        static = self._forward()
        if nodes == [0]:
            bucket, t = self._feed_root()
            return static.read_top(bucket, t, k, last=True)
        t = len(nodes)
        visible = torch.zeros(t, self.used - self.fed + t, dtype=torch.bool)  # over slots fed .. used + T
        for row, node in enumerate(nodes):
            for anc in tree.path(node)[1:-1]:
                visible[row, self.slots[path_key(tree, anc)] - self.fed] = True
            visible[row, self.used - self.fed + row] = True
            self.slots[path_key(tree, node)] = self.used + row
        root_pos = len(self.context) - 1
        positions = torch.tensor([root_pos + tree.depths[n] for n in nodes])
        ids = self.embeddable_ids([tree.tokens[n] for n in nodes])
        top = static.top(ids, positions, visible, self.used, k, base=self.fed)
        self.used += t
        return top

    @torch.inference_mode()
    def _feed_root(self) -> tuple[Bucket, int]:
        """Feed the committed tokens not yet in the cache (they end with the root); the bucket
        holding the root's readout and its row count."""
        if self.fed == len(self.context):  # the root's entry is there, its logits are not: redo it
            self.fed -= 1
        bucket, t = self._forward().prefill_chunks(self.embeddable_ids(self.context[self.fed:]), self.fed)
        self.fed = self.used = len(self.context)
        self.slots = {(): self.fed - 1}
        return bucket, t

    def chains(self, cfg: TreeConfig) -> bool:
        """Does this drafter grow ``cfg``'s trees on the device (``chained_tree``)?"""
        return self.chain and cfg.mode == "adaptive"

    @torch.inference_mode()
    def chained_tree(self, shared: DraftTree, cfg: TreeConfig, match_len: int, acceptance: CalibratedAcceptance,
                     calibrated: bool, planner: Planner | None) -> DraftTree:
        """``build_tree(shared, ...)`` for TALON's adaptive tree, grown on the device
        (``talon.graphs.chain``): the root's forward and each layer's are launched back to back, each
        followed by its update (the gate, the budget, the merge and the planner's check as tensor
        operations, a captured graph under ``graphs``), and the tree comes back in one copy (one
        more read of the stop flag for each layer launched past the last step's count)."""
        static = self._forward()
        start = time.perf_counter()
        width = bucket_for(max(cfg.budget, 1), tuple(static.buckets))
        if len(self.context) + cfg.max_depth * width > static.max_len:
            raise ValueError(f"a chained tree of {cfg.max_depth} layers of {width} exceeds the static cache")
        root_width = max(self.pending, 1)  # tokens the root's forward feeds (1: its redo)
        bucket, t = self._feed_root()
        if planner is not None:
            planner.forward_done(root_width)
        shape = ChainShape.of(cfg, max(shared.depths), tuple(static.buckets), calibrated, planner is not None,
                              bucket.top.shape[1] // 2)
        state = static.chains.get(shape)
        if state is None:
            state = static.chains[shape] = ChainState(shape, static.max_len, static.device, graphs=static.graphs,
                                                      rehearse=self.rehearse, compiled=static.compile_upto > 0)
        state.load(shared, StepTables.of(shape, match_len, acceptance, planner), self.used, self.fed,
                   len(self.context) - 1)
        layer = static.buckets[width]
        state.root_update(bucket, t - 1, layer, self.embed_rows)
        unread = self.last_layers if self.ahead else 0
        launched = 0
        for depth in range(2, cfg.max_depth + 1):
            if launched >= unread and int(state.stop):  # a read: has the tree stopped?
                break
            static.launch(layer)
            state.layer_update(depth, layer, self.embed_rows)
            launched += 1
        fields, stop, widths = state.read(launched)
        tree = tree_of(fields, stop)
        keys: list[tuple[int, ...]] = [()]
        for i in range(1, len(tree)):
            keys.append(keys[tree.parents[i]] + (tree.tokens[i],))
            if fields["slot"][i] != static.max_len:
                self.slots[keys[i]] = int(fields["slot"][i])
        self.used = self.fed + sum(widths)
        real_layers = [w for w in widths if w]
        self.last_layers = len(real_layers)
        self.idle_forwards += len(widths) - len(real_layers)
        if planner is not None:
            for w in widths:
                planner.forward_done(w or 1)
        seconds = time.perf_counter() - start
        fed = [root_width] + [max(w, 1) for w in widths]
        self.timings.extend((w, seconds / len(fed)) for w in fed)
        return tree

    def _keep(self, slots: list[int]) -> None:
        self._forward().keep(self.fed, slots)

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        super().commit(tree, accepted, new_tokens)
        self.used = self.fed

    def fork(self) -> "StaticModelSource":
        twin = copy.copy(self)
        twin.context, twin.slots, twin.timings = list(self.context), dict(self.slots), []
        twin.pool = self.fork_pool  # where its forward goes back, and its own forks come from
        twin.static = self.fork_pool.take(self.tokens, self.vocab_size)
        twin.static.copy_from(self._forward(), self.used)
        return twin

    def adopt_subtree(self, tree: DraftTree, node: int, subtree_nodes: list[int]) -> None:
        fed_sub = [n for n in subtree_nodes if path_key(tree, n) in self.slots]
        self._forward().keep(self.fed, [self.slots[path_key(tree, n)] for n in [node] + fed_sub])
        self.context.append(tree.tokens[node])
        self.fed += 1
        self.used = self.fed + len(fed_sub)
        self.slots = {(): self.fed - 1}
        for j, n in enumerate(fed_sub):
            self.slots[path_key(tree, n)[1:]] = self.fed + j

    def close(self) -> None:
        if self.static is not None:
            self.pool.give(self.static)
            self.static = None
