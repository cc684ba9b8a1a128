"""The hybrid drafter (Talon, AAAI): retrieval graft first, the model's gated tree fills the rest.

One class serves every drafter kind: ``hybrid`` (both sources), ``model`` (no retrieval),
``retrieval`` (no model) and ``none`` (autoregressive: the tree is the root alone). The decode
loop sees it through the ``Drafter`` contract (``talon.core.contracts``); its draft model is any
``DraftSource``. ``build_drafter`` makes the one for a run.

Retrieval proposes once per step at the full budget. When the draft model runs, retrieval's
share of the budget is grafted first (the head of that proposal); when it does not (the planner
chose retrieval first, or there is no model), the whole proposal is grafted: the chain prompt
lookup would send, or the trie's best branches. Under a planner, one-token matches propose too
(``SHORT_MATCH``) on steps without the model; the trim keeps such a guess only where its
calibrated acceptance pays for the extra verification on this host.

The drafter owns the run's :class:`~talon.cost.plan.CalibratedAcceptance`: it learns from every commit,
ranks the nodes of every tree the builder fills (``TreeConfig.admission``), and the planner
plans with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from talon.core.builder import Expand, Scores, build_tree, keep_best, path_confidence
from talon.core.contracts import (
    ChainingSource,
    Draft,
    DraftPlanner,
    DraftSource,
    FeatureSource,
    ForkableSource,
    PreDraft,
)
from talon.cost.plan import CalibratedAcceptance
from talon.drafters.retrieval import RetrievalProposal, Retriever
from talon.run_config import RetrievalConfig, RunConfig, TreeConfig
from talon.tree import DraftTree

SHORT_MATCH = 1  # under a planner, steps without the draft model let matches this short propose


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


class TreeDrafter:
    def __init__(
        self,
        tree_cfg: TreeConfig,
        source: DraftSource | None,
        retriever: Retriever | None,
        retrieval_cfg: RetrievalConfig,
    ) -> None:
        """One drafter per run: its acceptance model learns over the run's steps."""
        self.tree_cfg = tree_cfg
        self.source = source
        self.retriever = retriever
        self.retrieval_cfg = retrieval_cfg
        self.stats = SourceStats()
        self.acceptance = CalibratedAcceptance()
        self.forks: list[ForkableSource] = []  # pre-drafters not yet adopted or dropped (close gives them back)

    def reset(self, prompt_ids: list[int], lazy_model: bool = False, features: torch.Tensor | None = None) -> None:
        """Start a request; ``lazy_model`` leaves the draft model's prefill until it is needed;
        ``features``: the target's at the prompt's positions (for a ``FeatureSource``)."""
        self.stats = SourceStats()
        if self.source is not None:
            self.source.reset(prompt_ids, prefill=not lazy_model)
            if isinstance(self.source, FeatureSource) and features is not None:
                self.source.add_features(features)
        if self.retriever is not None:
            self.retriever.reset(prompt_ids)

    def draft(self, root_token: int, planner: DraftPlanner | None = None) -> Draft:
        """Retrieval graft first; then, unless the planner says retrieval alone does better per
        second, the model's tree fills the rest; finally the planner trims unprofitable nodes."""
        budget = self.tree_cfg.budget
        proposal = self._propose(budget, short=planner is not None)
        match_len = proposal.match_len
        shared = self._graft(DraftTree.with_root(root_token), self._shared_head(proposal))  # with the model
        alone = self._graft(DraftTree.with_root(root_token), proposal)  # without: retrieval at full strength
        skipped = ""
        if self.source is not None and planner is not None:
            skipped = planner.model_decision(shared, match_len, self.source.pending, self.source.engaged, alone)
        if self.source is not None and not skipped:
            if isinstance(self.source, ChainingSource) and self.source.chains(self.tree_cfg):
                calibrated = self.tree_cfg.admission != "confidence"
                tree = self.source.chained_tree(shared, self.tree_cfg, match_len, self.acceptance, calibrated, planner)
            else:
                scores = self.scores(match_len)
                tree = build_tree(shared, self._expand_for(planner), self.tree_cfg, budget, planner, match_len, scores)
        else:
            tree = alone
            tree.stop = "skipped" if skipped else ("retrieval" if self.retriever is not None else "none")
        trimmed = 0
        if planner is not None and tree.num_draft:
            tree, trimmed = planner.trim(tree, match_len)
        forwards = self.source.take_timings() if self.source is not None else []
        return Draft(tree=tree, match_len=match_len, model_skipped=skipped, trimmed=trimmed, forwards=forwards)

    def scores(self, match_len: int) -> Scores:
        """What ranks the nodes competing for the budget (``TreeConfig.admission``)."""
        if self.tree_cfg.admission == "confidence":
            return path_confidence
        return lambda tree: self.acceptance.node_probs(tree, match_len)

    def _propose(self, budget: int, short: bool) -> RetrievalProposal:
        """Retrieval's proposal at the full budget (empty without retrieval); ``short``: from a
        one-token match up (under a planner), else from ``min_match``."""
        if self.retriever is None:
            return RetrievalProposal()
        return self.retriever.propose(budget, SHORT_MATCH if short else None)

    def _shared_head(self, proposal: RetrievalProposal) -> RetrievalProposal:
        """What retrieval grafts when the draft model runs too: nothing below ``graft_threshold``,
        else its share of the budget, the head of the proposal."""
        if self.source is None or proposal.match_len < self.retrieval_cfg.graft_threshold:
            return proposal.head(0)
        return proposal.head(max(1, round(self.tree_cfg.budget * self.stats.retrieval_share())))

    def _expand_for(self, planner: DraftPlanner | None) -> Expand:
        """The model's ``expand``, reporting each forward to the planner's clock."""
        source = self.source
        assert source is not None
        if planner is None:
            return source.expand

        def expand(tree: DraftTree, nodes: list[int], k: int) -> list[list[tuple[int, float]]]:
            children = source.expand(tree, nodes, k)
            planner.forward_done(source.last_width)
            return children

        return expand

    @staticmethod
    def _graft(tree: DraftTree, proposal: RetrievalProposal) -> DraftTree:
        """Graft ``proposal``'s trie under the root of ``tree``; a node the tree already holds is
        marked ``both``. Returns ``tree``."""
        ids: list[int] = []
        for token, parent, q in zip(proposal.tokens, proposal.parents, proposal.q):
            at = 0 if parent < 0 else ids[parent]
            node = tree.child_with_token(at, token)
            if node is None:
                node = tree.add(at, token, q, "retrieval")
            elif tree.sources[node] == "model":
                tree.sources[node] = "both"
            ids.append(node)
        return tree

    # --- asynchronous pre-drafting -------------------------------------------------------

    def begin_predraft(self, tree: DraftTree) -> PreDraft | None:
        """Fork the model source as if the most confident path of ``tree`` were accepted.
        Cheap (a cache copy); call before ``commit``. ``PreDraft.tree`` is grown by ``grow``."""
        if not isinstance(self.source, ForkableSource) or not self.source.engaged:
            return None  # only a source that forks pre-drafts; others draft synchronously
        path = tree.path(tree.best_leaf())
        assumed = [tree.tokens[n] for n in path[1:]]
        fork = self.source.fork()
        self.forks.append(fork)
        fork.commit(tree, path, assumed)
        return PreDraft(source=fork, assumed=assumed)

    def grow(self, pre: PreDraft, clock: float) -> PreDraft:
        """Draft the next tree from the end of the assumed path (run on the drafter thread)."""
        start = time.perf_counter()
        cfg = self.tree_cfg
        root = DraftTree.with_root(pre.source.context[-1])
        device = pre.source.model.device
        if device.type == "cuda":  # its own stream, so drafting overlaps the target's kernels
            stream = torch.cuda.Stream(device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                pre.tree = build_tree(root, pre.source.expand, cfg, cfg.budget + cfg.root_k)
            stream.synchronize()
        else:
            pre.tree = build_tree(root, pre.source.expand, cfg, cfg.budget + cfg.root_k)
        pre.busy = (start - clock, time.perf_counter() - clock)
        return pre

    def adopt(self, pre: PreDraft, new_tokens: list[int]) -> Draft | None:
        """Reuse the pre-drafted tree if the target accepted exactly the assumed path and its
        bonus token is one the pre-draft expanded; prune it to that branch. None: draft anew."""
        node = None
        if pre.tree is not None and new_tokens[:-1] == pre.assumed:
            node = pre.tree.child_with_token(0, new_tokens[-1])
        self._drop(pre.source)
        if node is None or not pre.tree.children(node):
            pre.source.close()
            return None
        pre.source.adopt_subtree(pre.tree, node, pre.tree.descendants(node))
        assert self.source is not None
        self.source.close()
        self.source = pre.source
        proposal = self._propose(self.tree_cfg.budget, short=False)
        tree = self._graft(pre.tree.subtree(node), self._shared_head(proposal))
        scores = self.scores(proposal.match_len)
        return Draft(tree=keep_best(tree, self.tree_cfg.budget, scores), match_len=proposal.match_len,
                     forwards=pre.source.take_timings())

    def _drop(self, fork: ForkableSource) -> None:
        self.forks = [f for f in self.forks if f is not fork]

    def close(self) -> None:
        """Give back what the run's draft model and its pre-drafters hold (a static forward);
        call when the run ends, after the drafter thread has stopped."""
        for fork in self.forks:
            fork.close()
        self.forks = []
        if self.source is not None and hasattr(self.source, "close"):
            self.source.close()

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int], match_len: int = 0,
               features: torch.Tensor | None = None) -> None:
        """Learn from the verdict (per-source rates, the acceptance model), then advance the
        draft model and the retrieval index by the committed tokens. ``features``: the verdict's
        (T, F) features of every node; a ``FeatureSource`` gets the accepted path's (root first)."""
        self.stats.record(tree, accepted)
        self.acceptance.observe(tree, accepted, match_len)
        if self.source is not None:
            self.source.commit(tree, accepted, new_tokens)
            if isinstance(self.source, FeatureSource) and features is not None:
                index = torch.tensor(accepted[:len(new_tokens)], device=features.device)
                self.source.add_features(features.index_select(0, index))  # the root's, then each accepted node's
        if self.retriever is not None:
            self.retriever.extend(new_tokens)


def build_drafter(cfg: RunConfig, source: DraftSource | None, retriever: Retriever | None) -> TreeDrafter:
    """The run's drafter: of the sources given, those ``cfg.drafter`` names. The engine's real
    models and the atlas's replay both come through here."""
    return TreeDrafter(cfg.tree, source if cfg.uses_model else None,
                       retriever if cfg.uses_retrieval else None, cfg.retrieval)
