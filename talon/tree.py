"""The draft tree: parent pointers are the single source of truth.

Node 0 is the root: the last committed token, whose KV is not yet in the target's cache. Every
other node holds a drafted token, its parent (always an earlier node, so node order is a
topological order), the drafter's probability ``q`` of the token given its parent path, the
path confidence ``path_conf = prod(q along the path)``, its source and what the confidence gate
saw when the builder considered expanding it. Depths, the ancestor mask, positions and paths are
derived from the parents. ``layer_width`` and ``ancestor_rows`` are the tree's shape from a
parent list alone (torch-free: traces and figures use them too); ``STOPS`` names why a tree
stopped growing, the one vocabulary of the host's builder and the device-grown tree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

NodeSource = Literal["root", "model", "retrieval", "both"]
SOURCES: tuple[NodeSource, ...] = get_args(NodeSource)
# a step's node sources as its trace records them: "model" is "head" where an EAGLE-3 head drafted, "mtp" where
# the target's own MTP layer did
TraceSource = Literal[NodeSource, "head", "mtp"]
TRACE_SOURCES: tuple[TraceSource, ...] = (*SOURCES, "head", "mtp")
# the trace's name for model nodes, by which model drafted (``talon.knobs.DraftingModel``)
MODEL_NODE_SOURCE: dict[str, TraceSource] = {"head": "head", "mtp": "mtp"}


# Why a tree stopped growing (DraftTree.stop): the budget is full and no frontier node can place a
# child among the N best; max_depth reached; the best path confidence fell below min_conf; the
# next layer would not pay for itself (cost-aware); the drafter proposed nothing new; the draft
# model did not run this step (retrieval first, or not worth its prefill); a retrieval-only
# drafter's trie as proposed; no drafter at all (autoregressive).
TreeStop = Literal["budget", "depth", "min_conf", "cost", "empty", "skipped", "retrieval", "none"]
STOPS: tuple[TreeStop, ...] = get_args(TreeStop)
# the same stops as the codes a tree grown on the device keeps (``talon.graphs.chain``; 0: still growing)
STOP_CODES: dict[str, int] = {name: code for code, name in enumerate(STOPS, start=1)}

@dataclass
class Gate:
    """What the confidence gate saw for one node: expand iff path_conf >= threshold."""

    layer_max: float
    threshold: float
    passed: bool


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    q_draft: list[float] = field(default_factory=lambda: [1.0])
    path_conf: list[float] = field(default_factory=lambda: [1.0])
    sources: list[NodeSource] = field(default_factory=lambda: ["root"])
    gates: list[Gate | None] = field(default_factory=lambda: [None])
    depths: list[int] = field(default_factory=lambda: [0])
    stop: TreeStop | Literal[""] = ""  # why the builder stopped growing it ("": still growing)
    # node -> its children, indexed as nodes are appended (``children``: the builder asks it for
    # every node it admits; a scan of ``parents`` each time made a wide tree's build quadratic)
    _kids: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _indexed: tuple[int, int] = field(default=(0, 0), init=False, repr=False, compare=False)

    @staticmethod
    def with_root(root_token: int) -> "DraftTree":
        return DraftTree(tokens=[int(root_token)])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_draft(self) -> int:
        """Draft nodes, root excluded: what the budget counts."""
        return len(self.tokens) - 1

    def add(self, parent: int, token: int, q_draft: float, node_source: NodeSource) -> int:
        """Append a child of ``parent``; returns the new node id."""
        if not 0 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} must be a node of the tree (0 to {len(self.tokens) - 1})")
        if node_source not in SOURCES:
            raise ValueError(f"node_source must be one of {SOURCES}, got {node_source!r}")
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.q_draft.append(float(q_draft))
        self.path_conf.append(self.path_conf[parent] * float(q_draft))
        self.sources.append(node_source)
        self.gates.append(None)
        self.depths.append(self.depths[parent] + 1)
        return len(self.tokens) - 1

    def child_with_token(self, parent: int, token: int) -> int | None:
        for node in self.children(parent):
            if self.tokens[node] == token:
                return node
        return None

    def children(self, node: int) -> list[int]:
        """``node``'s children, in node order."""
        parents = self.parents
        seen_list, seen = self._indexed
        if seen_list != id(parents) or seen > len(parents):  # a new parents list: index it again
            self._kids, seen = {}, 0
        for i in range(seen, len(parents)):
            self._kids.setdefault(parents[i], []).append(i)
        self._indexed = (id(parents), len(parents))
        return list(self._kids.get(node, ()))

    def path(self, node: int) -> list[int]:
        """Node ids from the root to ``node``, both included."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def leaves(self) -> list[int]:
        has_child = set(self.parents[1:])
        return [i for i in range(len(self.tokens)) if i not in has_child]

    def descendants(self, node: int) -> list[int]:
        """Every node below ``node``, in node (topological) order."""
        below = {node}
        out = []
        for i in range(node + 1, len(self.tokens)):
            if self.parents[i] in below:
                below.add(i)
                out.append(i)
        return out

    def subtree(self, node: int) -> "DraftTree":
        """The subtree under ``node`` as a tree of its own, ``node`` becoming the root."""
        out = DraftTree.with_root(self.tokens[node])
        new_id = {node: 0}
        for i in self.descendants(node):
            j = out.add(new_id[self.parents[i]], self.tokens[i], self.q_draft[i], self.sources[i])
            out.gates[j] = self.gates[i]
            new_id[i] = j
        return out

    def best_leaf(self) -> int:
        """The end of the most confident path: the leaf with the highest path confidence."""
        return max(self.leaves(), key=lambda n: (self.path_conf[n], self.depths[n]))


def layer_width(depths: Sequence[int]) -> int:
    """Largest number of nodes on one layer, the root's layer (depth 0) excluded."""
    return max(Counter(d for d in depths if d > 0).values(), default=0)


def ancestor_rows(parents: Sequence[int]) -> list[list[bool]]:
    """(T, T) bool as nested lists: row i is True at i and at every ancestor of i. Parents come
    before children (``parents[i] < i``), so each row extends its parent's."""
    rows: list[list[bool]] = []
    for node, parent in enumerate(parents):
        row = list(rows[parent]) if parent >= 0 else [False] * len(parents)
        row[node] = True
        rows.append(row)
    return rows
