"""The model source: a small causal LM that expands a whole tree frontier per forward.

It owns its KV cache. The cache holds the committed context the draft model has seen, then,
during a step, one entry per tree node it has expanded (a node is fed when it is expanded, so
leaves cost nothing). A frontier node attends to the committed context, its ancestors' entries
and itself, through the same 4D mask the target uses. After acceptance, ``commit`` keeps the
entries of the accepted path and queues the rest of the new tokens for the next forward.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, PreTrainedModel

from talon.core.forward import forward_hidden
from talon.core.kv import clone_cache, gather_entries, keep_dynamic
from talon.models.head import lm_logits
from talon.models.quant import int8_head
from talon.run_config import ConfigError
from talon.tree import DraftTree

if TYPE_CHECKING:
    from talon.core.contracts import SourceModels
    from talon.run_config import RunConfig

PathKey = tuple[int, ...]


def path_key(tree: DraftTree, node: int) -> PathKey:
    """The drafted tokens from the root (excluded) to ``node``: a node's identity across prunes."""
    return tuple(tree.tokens[n] for n in tree.path(node)[1:])


class DraftLedger:
    """What a model source has seen: the committed context (root last), how much of it is in
    its cache (``fed``), and its forwards' (tokens fed, seconds) since last taken. Shared by the
    real drafter and the atlas's stand-in, so both report the same forwards to the planner."""

    context: list[int]
    fed: int
    timings: list[tuple[int, float]]

    @property
    def engaged(self) -> bool:
        """Has the model seen the prompt (paid its prefill)?"""
        return self.fed > 0 or len(self.context) <= 1

    @property
    def pending(self) -> int:
        """Committed tokens (root included) the next expansion must feed first."""
        return len(self.context) - self.fed

    @property
    def last_width(self) -> int:
        """Tokens fed to the latest forward."""
        return self.timings[-1][0] if self.timings else 0

    def take_timings(self) -> list[tuple[int, float]]:
        """(tokens fed, seconds) of the forwards since the last call; clears the record."""
        taken, self.timings = self.timings, []
        return taken


def draft_model_source(models: SourceModels, cfg: RunConfig, prompt_len: int) -> ModelSource:
    """The ``hybrid`` and ``model`` kinds' draft source: the pair's draft model."""
    if models.draft is None:
        raise ConfigError(f"drafter {cfg.drafter!r} needs a draft model; load one or use --drafter retrieval")
    return models.model_source(models.draft.model, cfg, prompt_len)


class ModelSource(DraftLedger):
    def __init__(self, model: PreTrainedModel, vocab_size: int = 0, target_vocab: int = 0) -> None:
        """``vocab_size``: draft logits over the first V ids (0 = all); ``target_vocab``: rows of
        the target's embedding, when the pair's sizes differ (Qwen2.5-7B has 152,064 rows,
        Qwen2.5-0.5B 151,936: one tokenizer, padded differently). The draft never proposes an id
        the target cannot embed, and is fed a stand-in for a committed id it cannot embed (an
        id above its own rows, which only a padding row of the target can produce): drafts
        are guesses, so this changes speed, never the output."""
        self.model = model
        full = model.get_output_embeddings().weight.shape[0]
        self.embed_rows = model.get_input_embeddings().weight.shape[0]
        limit = min(v for v in (vocab_size, target_vocab, full) if v > 0)
        self.vocab_size = limit if limit < full else 0
        if getattr(model, "talon_quant", None) == "int8":  # build the int8 head (0.8 s for 32k rows)
            int8_head(model, self.vocab_size)  # here, once, not inside the first timed draft forward
        self.context: list[int] = []  # committed tokens, root (last) included
        self.cache = DynamicCache(config=model.config)
        self.fed = 0  # committed tokens whose KV is in the cache
        self.slots: dict[PathKey, int] = {}  # tree node -> cache index, this step only
        self.timings: list[tuple[int, float]] = []  # (tokens fed, seconds) per forward since taken

    def reset(self, prompt_ids: list[int], prefill: bool = True) -> None:
        """Start a request. ``prefill=False`` defers the prompt prefill to the first expansion,
        which then catches up on everything committed so far (or never, if never asked)."""
        self.context = list(prompt_ids)
        self.cache = DynamicCache(config=self.model.config)
        self.fed = 0
        self.slots = {}
        self.timings = []
        if prefill and len(prompt_ids) > 1:  # all but the root; the root goes with the first expansion
            ids = self.embeddable_ids(prompt_ids[:-1])
            forward_hidden(self.model, self.cache, ids, torch.arange(len(ids)), None)
            self.fed = len(ids)

    def expand(self, tree: DraftTree, nodes: list[int], k: int) -> list[list[tuple[int, float]]]:
        """Top-k children (token, q) of each node in ``nodes``, with one draft forward."""
        start = time.perf_counter()
        fed = self.pending if nodes == [0] else len(nodes)
        q, tokens = self._top(tree, nodes, k)  # the layer's one copy back: the gates decide on the host
        out = [list(zip(t, p)) for t, p in zip(tokens, q)]
        self.timings.append((max(fed, 1), time.perf_counter() - start))
        return out

    def _top(self, tree: DraftTree, nodes: list[int], k: int) -> tuple[list[list[float]], list[list[int]]]:
        """Each node's top-k children: (T, k) probabilities and ids, on the host."""
        q, tokens = torch.softmax(self._logits(tree, nodes), dim=-1).topk(k, dim=-1)  # (T, k)
        return q.tolist(), tokens.tolist()

    def _logits(self, tree: DraftTree, nodes: list[int]) -> torch.Tensor:
        """(T, V) draft logits of ``nodes`` (the root alone: after feeding the pending context)."""
        if nodes == [0]:
            hidden = self._feed_context()[-1:]  # (1, H): the root's state
        else:
            hidden = self._feed_nodes(tree, nodes)  # (len(nodes), H)
        return lm_logits(self.model, hidden, self.vocab_size)

    def embeddable_ids(self, tokens: list[int]) -> torch.Tensor:
        """(L,) long: token ids as the draft can embed them (a stand-in, id 0, for any it cannot)."""
        ids = torch.tensor(tokens, dtype=torch.long)
        return torch.where(ids < self.embed_rows, ids, torch.zeros_like(ids))

    def _feed_context(self) -> torch.Tensor:
        """Feed the committed tokens not yet in the cache (they end with the root)."""
        if self.fed == len(self.context):  # the root's entry is there, its logits are not: redo it
            self.fed -= 1
            gather_entries(self.cache, list(range(self.fed)))
        pending = self.embeddable_ids(self.context[self.fed :])
        positions = torch.arange(self.fed, len(self.context))
        hidden = forward_hidden(self.model, self.cache, pending, positions, None)
        self.fed = len(self.context)
        self.slots = {(): self.fed - 1}
        return hidden

    def _feed_nodes(self, tree: DraftTree, nodes: list[int]) -> torch.Tensor:
        old = self.cache.get_seq_length()
        n_new = len(nodes)
        visible = torch.zeros(n_new, old + n_new, dtype=torch.bool)  # (T, S + T)
        visible[:, : self.fed] = True
        for row, node in enumerate(nodes):
            for anc in tree.path(node)[1:-1]:
                visible[row, self.slots[path_key(tree, anc)]] = True
            visible[row, old + row] = True
            self.slots[path_key(tree, node)] = old + row
        root_pos = len(self.context) - 1
        positions = torch.tensor([root_pos + tree.depths[n] for n in nodes])
        ids = self.embeddable_ids([tree.tokens[n] for n in nodes])
        return forward_hidden(self.model, self.cache, ids, positions, visible)

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        """Keep the cache entries of the accepted nodes the model fed; queue the other new tokens."""
        if self.slots:
            kept = []
            for node in accepted[1:]:
                slot = self.slots.get(path_key(tree, node))
                if slot is None:
                    break
                kept.append(slot)
            self._keep(kept)
            self.fed += len(kept)
        self.slots = {}
        self.context.extend(new_tokens)

    def _keep(self, slots: list[int]) -> None:
        """Make the cache the committed context plus the entries at ``slots``, in that order."""
        keep_dynamic(self.cache, self.fed, slots)

    def close(self) -> None:
        """Give back what the run held (nothing here: the cache goes with the drafter)."""

    def fork(self) -> "ModelSource":
        """An independent drafter in the same state (own cache copy): the async pre-drafter."""
        twin = copy.copy(self)
        twin.context, twin.slots, twin.timings = list(self.context), dict(self.slots), []
        twin.cache = clone_cache(self.cache)
        return twin

    def adopt_subtree(self, tree: DraftTree, node: int, subtree_nodes: list[int]) -> None:
        """Make ``node`` (a child of the root, already fed) committed context and keep the cache
        entries of ``subtree_nodes`` (its descendants, topological order) as the next tree's."""
        fed_sub = [n for n in subtree_nodes if path_key(tree, n) in self.slots]
        idx = list(range(self.fed)) + [self.slots[path_key(tree, n)] for n in [node] + fed_sub]
        gather_entries(self.cache, idx)
        self.context.append(tree.tokens[node])
        self.fed += 1
        self.slots = {(): self.fed - 1}
        for j, n in enumerate(fed_sub):
            self.slots[path_key(tree, n)[1:]] = self.fed + j
