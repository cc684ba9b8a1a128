"""The continuations of a suffix match merged into a small frequency trie (a RetrievalProposal)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------- records


@dataclass
class RetrievalProposal:
    """A retrieval draft: a trie under the root (the last context token).

    ``tokens[i]`` is a drafted token, ``parents[i]`` the index of its parent in ``tokens`` (or
    -1: a child of the root), so parents always precede children. ``q[i]`` is the fraction of
    the parent's occurrences that continue with ``tokens[i]``. ``match_len`` is reported even
    when the proposal is empty (below ``min_match``), so the hybrid rule and the UI can show it.
    """

    match_len: int = 0
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    q: list[float] = field(default_factory=list)
    source: str = "none"  # "context" | "corpus" | "none"
    num_occurrences: int = 0  # earlier occurrences of the match the trie was built from

    def __len__(self) -> int:
        return len(self.tokens)

    def head(self, nodes: int) -> RetrievalProposal:
        """The first ``nodes`` nodes: the trie ``build_trie`` would have built with that cap
        (it admits nodes best first, so a smaller cap stops the same sequence earlier)."""
        n = max(nodes, 0)
        return RetrievalProposal(self.match_len, self.tokens[:n], self.parents[:n], self.q[:n],
                                 self.source, self.num_occurrences)

    @property
    def depths(self) -> list[int]:
        """Depth of each node; the root's children have depth 1."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return out

    def path(self, node: int) -> list[int]:
        """Tokens from the root's child down to ``node``, both included."""
        out: list[int] = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]


# ----------------------------------------------------------------------------- trie


def _branch(
    members: list[int], depth: int, continuations: Sequence[Sequence[int]], max_branches: int
) -> list[tuple[int, float, list[int]]]:
    """Children of a trie node: (token, q, members), count desc, then the one that occurred
    earliest, at most ``max_branches``. ``members`` index ``continuations`` (most recent first)
    and all share the node's path; ``depth`` is the index of the child token in each
    continuation. Between equally frequent continuations the earliest wins, as in prompt lookup:
    in a summary or an edit the first occurrence is usually the source passage (the prompt) and
    later ones the output's own paraphrase of it (measured on held-out sum atlases: 2.7 % less
    predicted time)."""
    groups: dict[int, list[int]] = {}
    for member in members:
        cont = continuations[member]
        if len(cont) > depth:
            groups.setdefault(cont[depth], []).append(member)
    total = sum(len(g) for g in groups.values())
    ranked = sorted(groups.items(), key=lambda item: (-len(item[1]), -item[1][-1]))
    return [(token, len(g) / total, g) for token, g in ranked[:max_branches]]


def build_trie(
    continuations: Sequence[Sequence[int]], max_nodes: int, max_depth: int, max_branches: int
) -> tuple[list[int], list[int], list[float]]:
    """Merge continuations (most recent first) into a trie of at most ``max_nodes`` nodes.

    Nodes are admitted best-first by path confidence (product of q), so the trie is deep where
    the occurrences agree and wide where they do not; a child's path confidence never exceeds
    its parent's, so the admission order is a topological order. Returns (tokens, parents, q).
    """
    tokens: list[int] = []
    parents: list[int] = []
    q: list[float] = []
    roots = _branch(list(range(len(continuations))), 0, continuations, max_branches)
    # (-path_conf, tie-break, parent, token, q, depth, members)
    heap = [(-qc, i, -1, tok, qc, 1, members) for i, (tok, qc, members) in enumerate(roots)]
    heapq.heapify(heap)
    seq = len(heap)
    while heap and len(tokens) < max_nodes:
        neg_conf, _, parent, token, q_node, depth, members = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(token)
        parents.append(parent)
        q.append(q_node)
        if depth >= max_depth:
            continue
        for child, q_child, child_members in _branch(members, depth, continuations, max_branches):
            entry = (neg_conf * q_child, seq, node, child, q_child, depth + 1, child_members)
            heapq.heappush(heap, entry)
            seq += 1
    return tokens, parents, q
