"""A target's own MTP layers as a draft source (``talon.models.mtp`` holds the layers and their loading).

Pair j of a run is (the target's last hidden state at position j, token j + 1), at position id
j + 1, as transformers' ``MTPCandidateGenerator`` feeds it; a tree node at depth d feeds its
parent's output (``MtpLayer``'s, after its post norm, as transformers and SGLang chain it) with its
own token at position root + d. ``MtpSource`` drafts every depth with layer 0 (vLLM V1's and
SGLang's rule); its cache and the cut after a commit are ``PairSource``'s, as an EAGLE-3 head's are.

``MtpChainSource`` (``--mtp-layers chained``) drafts depth k + 1 with layer k, as transformers'
``MTPCandidateGenerator`` and vLLM V2 run a checkpoint of L layers. Layer k's entry for pair j
is (layer k - 1's output for pair j, token j + k + 1) at position j + k + 1 (layer 0's: the
target's hidden state), in that layer's own part of the cache. The committed entries of layer k
reach pair root - k. A tree node at depth i has an entry in every layer k >= i: at pair root - k + i,
its own token at position root + 1 + i, fed layer k - 1's entry of its parent. Its entry in layer
i drafts its children; the others are what deeper descendants attend to in their layer, as
transformers' layer k attends to its last k entries, whose tokens are drafts. On a chain this is
transformers' rule exactly; in a tree, siblings share their ancestors' entries and never see
each other. The tree is at most L levels deep.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING

import torch

from talon.core.forward import additive_mask
from talon.drafters.model import PathKey, path_key
from talon.drafters.pairs import PairSource
from talon.models.mtp import MtpLayers, checkpoint_dir, load_mtp
from talon.run_config import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from talon.core.contracts import SourceModels
    from talon.run_config import RunConfig
    from talon.tree import DraftTree

# target -> its MTP layers, loaded once per target (the layers share its embedding and LM head)
LOADED: weakref.WeakKeyDictionary[PreTrainedModel, MtpLayers] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class MtpSource(PairSource):
    """A target's MTP layers as a draft source (``FeatureSource``): pair j at position j + 1."""

    position_lead = 1
    name = "an MTP layer"

    def __init__(self, layers: MtpLayers) -> None:
        super().__init__(layers, layers.feature_layers, layers.window)


Entry = tuple[int, PathKey]  # (MTP layer, tree node): one entry of a chained source's cache this step


class MtpChainSource(MtpSource):
    """A target's MTP layers chained: layer k drafts depth k + 1 (see the module's docstring)."""

    def __init__(self, layers: MtpLayers) -> None:
        super().__init__(layers)
        self.layers = layers
        self.depths = layers.layers  # the deepest level it drafts

    def reset(self, prompt_ids: list[int], prefill: bool = True) -> None:
        super().reset(prompt_ids, prefill)
        self.layer_fed = [0] * self.depths  # committed pairs in each layer's cache
        # each layer's outputs for its committed pairs, until the next layer has read them
        self.pair_outs: list[dict[int, torch.Tensor]] = [{} for _ in range(self.depths)]
        self.entries: dict[Entry, int] = {}  # this step's entries: cache index in their layer
        self.entry_outs: dict[Entry, torch.Tensor] = {}  # and their outputs (the root's: its committed pairs')
        self.entry_logits: dict[Entry, torch.Tensor] = {}  # and logits (a node's in its own layer: its children)

    def expand(self, tree: DraftTree, nodes: list[int], k: int) -> list[list[tuple[int, float]]]:
        """Top-k children (target token, q) of each node; none below depth L (no layer drafts there)."""
        start = time.perf_counter()
        if nodes == [0]:
            rows, logits = self._feed_committed()
            live = [0]
        else:
            live = [n for n in nodes if tree.depths[n] < self.depths and self._feedable(tree, n)]
            rows, logits = self._feed_tree(tree, live)
        drafted: dict[int, list[tuple[int, float]]] = {}
        if live:
            q, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)  # (T, k)
            drafted = {n: list(zip(t, p)) for n, t, p in zip(live, ids.tolist(), q.tolist())}
        if rows:
            self.timings.append((rows, time.perf_counter() - start))
        return [drafted.get(n, []) for n in nodes]

    def _visible_committed(self, layer: int, positions: torch.Tensor) -> torch.Tensor:
        """(T, fed) bool: which of ``layer``'s committed pairs rows at ``positions`` see (its window)."""
        seen = torch.ones(positions.shape[0], self.layer_fed[layer], dtype=torch.bool)
        window = self.layers.windows[layer]
        if window:
            pair_pos = torch.arange(self.layer_fed[layer]) + layer + 1
            seen &= positions[:, None] - pair_pos[None, :] < window
        return seen

    def _run(self, layer: int, g: torch.Tensor, ids: list[int], positions: torch.Tensor,
             visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layers(g, torch.tensor(ids), positions, self.cache, additive_mask(visible, self.model.dtype),
                          layer=layer)

    def _held(self, layer: int) -> int:
        return self.cache.get_seq_length(layer) if len(self.cache.layers) > layer else 0

    def _crop(self, layer: int, keep: int) -> None:
        """Keep ``layer``'s first ``keep`` cache entries."""
        if self._held(layer) > keep:
            entry = self.cache.layers[layer]
            entry.keys, entry.values = entry.keys[..., :keep, :], entry.values[..., :keep, :]

    def _feed_committed(self) -> tuple[int, torch.Tensor]:
        """Feed every layer its committed pairs not yet in its cache, up to pair root - k, whose
        output is the root's in that layer; returns the rows fed and layer 0's logits at the root."""
        root = len(self.context) - 2
        if root < 0:
            raise ConfigError(f"{self.name} needs a prompt of at least two tokens")
        if len(self.features) <= root:
            raise RuntimeError(f"{self.name} has features for {len(self.features)} positions, needs {root + 1}")
        self.entries, self.entry_outs, self.entry_logits, rows, first = {}, {}, {}, 0, None
        for layer in range(self.depths):
            last = root - layer
            self.layer_fed[layer] = min(self.layer_fed[layer], max(last, 0))  # the root's own pair is fed again
            self._crop(layer, self.layer_fed[layer])
            if last < 0:
                continue
            pairs = range(self.layer_fed[layer], last + 1)
            source = self.features if layer == 0 else self.pair_outs[layer - 1]
            g = torch.stack([source[j] for j in pairs])
            positions = torch.tensor(list(pairs)) + layer + 1
            held = self.layer_fed[layer]
            visible = torch.ones(len(pairs), held + len(pairs), dtype=torch.bool).tril(diagonal=held)
            visible &= torch.cat([self._visible_committed(layer, positions),
                                  torch.ones(len(pairs), len(pairs), dtype=torch.bool)], dim=1)
            out, logits = self._run(layer, g, [self.context[j + layer + 1] for j in pairs], positions, visible)
            if layer + 1 < self.depths:
                self.pair_outs[layer].update(zip(pairs, out))
            self.layer_fed[layer] = last + 1
            self.entries[(layer, ())], self.entry_outs[(layer, ())] = last, out[-1]
            rows += len(pairs)
            if layer == 0:
                first = logits[-1:]
        # what the next layer has read is dropped, but for its last pair (the root fed again reads it)
        for layer in range(self.depths - 1):
            for j in [j for j in self.pair_outs[layer] if j < self.layer_fed[layer + 1] - 1]:
                del self.pair_outs[layer][j]
        self.fed = self.layer_fed[0]
        assert first is not None
        return rows, first

    def _feedable(self, tree: DraftTree, node: int) -> bool:
        """Is the parent's entry in layer depth - 1 there (the parent was expanded)?"""
        return (tree.depths[node] - 1, path_key(tree, tree.parents[node])) in self.entry_outs

    def _feed_tree(self, tree: DraftTree, nodes: list[int]) -> tuple[int, torch.Tensor]:
        """Each node's entry in layer ``depth`` (it drafts the node's children), with the entries
        of its ancestors that layer lacks, shallowest first, in one forward per layer."""
        root, rows = len(self.context) - 2, 0
        for layer in sorted({tree.depths[n] for n in nodes}):
            wanted = [n for n in nodes if tree.depths[n] == layer]
            batch: list[int] = []
            for node in wanted:
                for anc in tree.path(node)[1:]:
                    key = (layer, path_key(tree, anc))
                    if key not in self.entries and anc not in batch and root - layer + tree.depths[anc] >= 0:
                        batch.append(anc)
            batch.sort(key=lambda n: tree.depths[n])
            if batch:
                self._feed_layer(tree, layer, batch)
                rows += len(batch)
        if not nodes:
            return rows, torch.empty(0)
        return rows, torch.stack([self.entry_logits[(tree.depths[n], path_key(tree, n))] for n in nodes])

    def _feed_layer(self, tree: DraftTree, layer: int, batch: list[int]) -> None:
        """One forward of ``layer`` over tree nodes ``batch`` (ancestors before descendants)."""
        held = self._held(layer)
        keys = [path_key(tree, n) for n in batch]
        slots = {key: where for (at, key), where in self.entries.items() if at == layer}
        slots.update({key: held + row for row, key in enumerate(keys)})
        positions = torch.tensor([len(self.context) - 1 + tree.depths[n] for n in batch])  # root + 1 + depth
        visible = torch.zeros(len(batch), held + len(batch), dtype=torch.bool)
        visible[:, :self.layer_fed[layer]] = self._visible_committed(layer, positions)
        for row, node in enumerate(batch):
            for seen in self._attended(tree, node):
                if (where := slots.get(path_key(tree, seen))) is not None:
                    visible[row, where] = True
        g = torch.stack([self.entry_outs[(layer - 1, path_key(tree, tree.parents[n]))] for n in batch])
        out, logits = self._run(layer, g, [tree.tokens[n] for n in batch], positions, visible)
        for row, key in enumerate(keys):
            self.entries[(layer, key)] = held + row
            self.entry_outs[(layer, key)], self.entry_logits[(layer, key)] = out[row], logits[row]

    def _attended(self, tree: DraftTree, node: int) -> list[int]:
        """The tree nodes whose entries in a layer ``node``'s entry there attends to: its ancestors
        below the root (the root's is a committed pair's) and itself; never a sibling."""
        return tree.path(node)[1:]

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        """Cut every layer's tree entries; the accepted tokens are fed again with their features."""
        for layer in range(self.depths):
            self._crop(layer, self.layer_fed[layer])
        self.entries, self.entry_outs, self.entry_logits = {}, {}, {}
        self.context.extend(new_tokens)


def mtp_layers_of(target: PreTrainedModel, path: str) -> MtpLayers:
    """``target``'s MTP layers from its checkpoint ``path`` (a directory or a Hub id), loaded at first use."""
    with _LOCK:
        if target not in LOADED:
            LOADED[target] = load_mtp(target, checkpoint_dir(path))
        return LOADED[target]


def attach_mtp(target: PreTrainedModel, layers: MtpLayers) -> None:
    """Give ``target`` MTP layers built in memory (a check's, a test's), in place of its checkpoint's."""
    with _LOCK:
        LOADED[target] = layers


def mtp_source(models: SourceModels, cfg: RunConfig, prompt_len: int) -> MtpSource:
    """The ``mtp`` kinds' draft source: the target's own MTP layers (no draft model)."""
    target = models.target
    layers = mtp_layers_of(target.model, target.name)
    return MtpChainSource(layers) if cfg.mtp_layers == "chained" else MtpSource(layers)
