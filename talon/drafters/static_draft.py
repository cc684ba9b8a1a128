"""The model drafter on a static-shape forward (``talon/static.py``): the same children as
``ModelDrafter``, from a preallocated slot cache at bucketed sizes, so that on a GPU each draft
layer is one graph replay.

The slot cache holds the committed context in slots ``0 .. fed - 1``; during a step each layer's
nodes go into the next free slots (``used``), and a node sees the committed context, its
ancestors' slots and its own. ``commit`` moves the accepted path's entries to the slots after
the context; an async fork takes a second forward from the pool and copies the used slots.

Each layer makes one copy back to the host: its nodes' top-k children and their probabilities,
read out inside the forward (so that a graph replays the softmax and the top-k too); the
confidence gate and the budget decide on the host which nodes the next layer expands.
"""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from talon.drafters.model import ModelDrafter, path_key
from talon.static import StaticForward
from talon.static_pool import StaticPool
from talon.tree import DraftTree


class StaticModelDrafter(ModelDrafter):
    def __init__(self, model: PreTrainedModel, pool: StaticPool, tokens: int, vocab_size: int = 0,
                 target_vocab: int = 0, fork_pool: StaticPool | None = None, capture_all: bool = False) -> None:
        """``pool``: the draft model's static forwards; ``tokens``: the most a run commits
        (prompt, new tokens, a step's nodes), which the forward's slot cache must hold.
        ``fork_pool``: where an async fork takes its forward (default ``pool``); ``capture_all``:
        capture every bucket of this drafter's forward when it is taken, not each at first use."""
        if not pool.drafts or (fork_pool is not None and not fork_pool.drafts):
            raise ValueError("a static model drafter needs drafting pools (StaticPool(..., drafts=True))")
        super().__init__(model, vocab_size, target_vocab)
        self.pool, self.tokens, self.capture_all = pool, tokens, capture_all
        self.fork_pool = fork_pool or pool
        self.static: StaticForward | None = None
        self.used = 0  # slots written: the committed context's, then this step's nodes'

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
            if self.fed == len(self.context):  # the root's entry is there, its logits are not: redo it
                self.fed -= 1
            top = static.prefill_top(self.embeddable_ids(self.context[self.fed:]), self.fed, k)
            self.fed = self.used = len(self.context)
            self.slots = {(): self.fed - 1}
            return top
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

    def _keep(self, slots: list[int]) -> None:
        self._forward().keep(self.fed, slots)

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        super().commit(tree, accepted, new_tokens)
        self.used = self.fed

    def fork(self) -> "StaticModelDrafter":
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
