"""The hybrid drafter (Talon, AAAI): retrieval graft first, the model's gated tree fills the rest.

One class serves every drafter kind: ``hybrid`` (both sources), ``model`` (no retrieval),
``retrieval`` (no model) and ``none`` (autoregressive: the tree is the root alone). The decode
loop only sees ``reset`` / ``draft`` / ``commit``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from talon.builder import build_tree
from talon.config import RetrievalConfig, TreeConfig
from talon.drafters.model import ModelDrafter
from talon.drafters.retrieval import RetrievalDrafter, RetrievalProposal
from talon.tree import DraftTree


@dataclass
class Draft:
    tree: DraftTree
    match_len: int = 0


@dataclass
class SourceStats:
    """Running acceptance per source: drafted nodes on one side, accepted on the other."""

    proposed: dict[str, int] = field(default_factory=lambda: {"model": 0, "retrieval": 0})
    accepted: dict[str, int] = field(default_factory=lambda: {"model": 0, "retrieval": 0})

    def rate(self, source: str) -> float:
        return (self.accepted[source] + 1) / (self.proposed[source] + 2)  # Laplace prior 1/2

    def retrieval_share(self) -> float:
        """Fraction of the budget retrieval may take when both sources draft: [0.25, 0.75]."""
        r, m = self.rate("retrieval"), self.rate("model")
        return min(max(r / (r + m), 0.25), 0.75)

    def record(self, tree: DraftTree, accepted: list[int]) -> None:
        on_path = set(accepted)
        for node in range(1, len(tree)):
            src = tree.sources[node]
            for side in ("model", "retrieval"):
                if src in (side, "both"):
                    self.proposed[side] += 1
                    self.accepted[side] += node in on_path


class HybridDrafter:
    def __init__(
        self,
        tree_cfg: TreeConfig,
        model: ModelDrafter | None,
        retrieval: RetrievalDrafter | None,
        retrieval_cfg: RetrievalConfig,
    ) -> None:
        self.tree_cfg = tree_cfg
        self.model = model
        self.retrieval = retrieval
        self.retrieval_cfg = retrieval_cfg
        self.stats = SourceStats()

    def reset(self, prompt_ids: list[int]) -> None:
        self.stats = SourceStats()
        if self.model is not None:
            self.model.reset(prompt_ids)
        if self.retrieval is not None:
            self.retrieval.reset(prompt_ids)

    def draft(self, root_token: int) -> Draft:
        tree = DraftTree.with_root(root_token)
        budget = self.tree_cfg.budget
        match_len = 0
        if self.retrieval is not None:
            match_len = self._graft(tree, budget)
        if self.model is not None:
            tree = build_tree(tree, self.model.expand, self.tree_cfg, budget)
        return Draft(tree=tree, match_len=match_len)

    def _graft(self, tree: DraftTree, budget: int) -> int:
        """Graft the retrieval trie under the root when its match is long enough."""
        alone = self.model is None
        cap = budget if alone else max(1, round(budget * self.stats.retrieval_share()))
        proposal: RetrievalProposal = self.retrieval.propose(cap)
        threshold = self.retrieval_cfg.min_match if alone else self.retrieval_cfg.graft_threshold
        if proposal.match_len < threshold:
            return proposal.match_len
        ids = []
        for token, parent, q in zip(proposal.tokens, proposal.parents, proposal.q):
            ids.append(tree.add(0 if parent < 0 else ids[parent], token, q, "retrieval"))
        return proposal.match_len

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        self.stats.record(tree, accepted)
        if self.model is not None:
            self.model.commit(tree, accepted, new_tokens)
        if self.retrieval is not None:
            self.retrieval.extend(new_tokens)
