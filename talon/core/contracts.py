"""The step loop's contracts, in the order ``Run._step`` reads them: draft, verify, commit.

Acceptance is the verifier's: ``Verifier.verify`` scores the tree and accepts a path in the same
call (``Verdict.acceptance``: greedy or the sampled rule of ``talon.core.accept``); the loop only
cuts that path at a stop (``StopCheck``) before both sides commit it.

* ``Drafter`` proposes a step's tree (``draft`` -> ``Draft``) and learns from the verdict
  (``commit``). ``talon.drafters.tree_drafter.TreeDrafter`` is the one implementation; its
  model half is any ``DraftSource`` (``ModelSource`` runs a real model,
  ``talon.atlas.loop.AtlasModel`` answers from a recording). A ``PreDrafter`` can also draft
  the next tree while the target verifies; it needs a ``ForkableSource``.
* ``Verifier`` scores a tree in one target forward and accepts a path (``verify`` -> ``Verdict``),
  and keeps the accepted path's KV (``commit``). ``talon.core.verify.TargetVerifier`` runs the target,
  ``talon.graphs.pool.StaticVerifier`` its static-shape forward, ``talon.atlas.loop.TextVerifier``
  matches a recorded greedy text.
* ``AcceptanceModel``: P(node accepted | parent accepted), what the builder ranks nodes by and the
  planner prices layers with (``talon.cost.plan.CalibratedAcceptance`` learns it per run).
* ``DraftPlanner``: what a drafter asks the cost-aware planner (``talon.cost.plan.Planner``).
* ``FeatureSource``: a draft source that reads the target's own hidden states (an EAGLE-3 head,
  ``talon.drafters.eagle3``): the verifier returns them (``Verdict.features``) and the drafter
  hands those of the committed positions over.
* ``KVCut``: the one cache cut every commit makes, with two implementations in
  ``talon.core.kv`` (``keep_dynamic`` on a growing cache, ``keep_slots`` on preallocated slots).

Nothing here runs a model: these are the shapes the loop's parts agree on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from talon.tree import DraftTree

if TYPE_CHECKING:  # the contracts import no torch: the planner and its cost model are plain Python
    from torch import Tensor, nn
    from transformers import Cache, PreTrainedModel

    from talon.core.accept import Acceptance
    from talon.models import LoadedModel
    from talon.run_config import RunConfig, TreeConfig

Children = list[tuple[int, float]]  # one node's draft children: (token, draft probability q), best first


# ------------------------------------------------------------------------------------- draft


@dataclass
class Draft:
    """This step's tree, the retrieval match it grew from, and what the planner decided."""

    tree: DraftTree
    match_len: int = 0
    model_skipped: str = ""  # why the draft model did not run this step ("" = it ran or is absent)
    trimmed: int = 0  # nodes the goodput trim cut
    forwards: list[tuple[int, float]] = field(default_factory=list)  # (tokens fed, seconds) per draft forward


@dataclass
class PreDraft:
    """A tree drafted ahead, assuming the path ``assumed`` of the current tree is accepted.

    Its root is the last assumed token; its root's children are the bonus tokens it bets on."""

    source: ForkableSource
    assumed: list[int]
    tree: DraftTree | None = None
    busy: tuple[float, float] = (0.0, 0.0)


class AcceptanceModel(Protocol):
    """P(node accepted | its parent accepted), per node of a tree. Invariant: ``node_probs`` is 1
    at the root and never grows along a path (a product of conditionals, each at most 1)."""

    def p_cond(self, node_source: str, q: float, match_len: int, depth: int = 1) -> float:
        """P(a node accepted | its parent accepted); ``node_source``: ``talon.tree.SOURCES``."""

    def node_probs(self, tree: DraftTree, match_len: int) -> list[float]:
        """(T,) P(node accepted); the root is 1."""

    def observe(self, tree: DraftTree, accepted: list[int], match_len: int) -> None:
        """Learn from a verdict: every node whose parent was accepted was tested."""


class LayerPlanner(Protocol):
    """What the tree builder asks before drafting a layer (``talon.core.builder.build_tree``)."""

    def worth_layer(self, tree: DraftTree, frontier: list[int], k: int, budget: int, match_len: int) -> bool:
        """Do the expected accepted tokens of expanding ``frontier`` pay for its forward and verification?"""


class DraftPlanner(LayerPlanner, Protocol):
    """What a drafter asks the cost-aware planner during a step (``talon.cost.plan.Planner``)."""

    def forward_done(self, width: int) -> None:
        """The drafter ran one draft forward over ``width`` tokens."""

    def model_decision(self, shared: DraftTree, match_len: int, pending: int, engaged: bool,
                       alone: DraftTree | None = None) -> str:
        """"" to run the draft model this step, else why not."""

    def trim(self, tree: DraftTree, match_len: int) -> tuple[DraftTree, int]:
        """The goodput-best prefix of ``tree``, and how many nodes it cut."""


@runtime_checkable
class DraftSource(Protocol):
    """The draft model's half of a drafter: expands tree nodes into their top-k children."""

    context: list[int]  # the committed tokens, root last

    @property
    def engaged(self) -> bool:
        """Has the source seen the prompt (paid its prefill)?"""

    @property
    def pending(self) -> int:
        """Committed tokens the next expansion must feed first (the planner prices them)."""

    @property
    def last_width(self) -> int:
        """Tokens fed to the latest forward."""

    def reset(self, prompt_ids: list[int], prefill: bool = True) -> None:
        """Start a request (``prefill`` False: feed the prompt on the first expansion)."""

    def expand(self, tree: DraftTree, nodes: list[int], k: int) -> list[Children]:
        """The top ``k`` children of each of ``nodes`` (one layer of ``tree``)."""

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        """The target accepted ``accepted`` (node ids, root first) and committed ``new_tokens``."""

    def take_timings(self) -> list[tuple[int, float]]:
        """(tokens fed, seconds) of the forwards since the last call; clears the record."""


@runtime_checkable
class ForkableSource(DraftSource, Protocol):
    """A draft source that forks: an independent copy in the same state drafts ahead, and is
    adopted in place of the original when its bet held."""

    model: nn.Module  # the module that drafts (its device picks the stream)

    def fork(self) -> ForkableSource: ...

    def adopt_subtree(self, tree: DraftTree, node: int, subtree_nodes: list[int]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class FeatureSource(DraftSource, Protocol):
    """A source that drafts from the target's features: the hidden states entering the target's
    layers ``feature_layers`` (HF ``output_hidden_states`` indices), concatenated. The feature at a
    committed position pairs with the token after it. It cannot pre-draft: the features of a step
    exist once that step is verified."""

    feature_layers: tuple[int, ...]

    def add_features(self, features: Tensor) -> None:
        """(n, F): the target's features at the next n committed positions, in order (the prompt's
        but its root's after the prefill; the root's and the accepted nodes' after a step)."""


@runtime_checkable
class ChainingSource(DraftSource, Protocol):
    """A source that grows a whole adaptive tree itself, on its device (``talon.graphs.chain``):
    ``StaticModelSource`` with ``chain``. The tree drafter asks ``chains`` each step."""

    def chains(self, cfg: TreeConfig) -> bool: ...

    def chained_tree(self, shared: DraftTree, cfg: TreeConfig, match_len: int, acceptance: AcceptanceModel,
                     calibrated: bool, planner: DraftPlanner | None) -> DraftTree: ...


class SourceModels(Protocol):
    """What a drafter kind's source maker (``talon.drafters.SOURCE_MAKERS``) gets from the engine:
    the loaded pair, and a model source over any model on the engine's forward (dynamic,
    static or CUDA graphs, with its pools)."""

    target: LoadedModel
    draft: LoadedModel | None

    def model_source(self, model: PreTrainedModel, cfg: RunConfig, prompt_len: int) -> ForkableSource: ...


@runtime_checkable
class Drafter(Protocol):
    """What ``Run._step`` calls to draft (``draft``) and to learn from the verdict (``commit``)."""

    acceptance: AcceptanceModel  # the run's calibrated acceptance (the planner and traces read it)

    def reset(self, prompt_ids: list[int], lazy_model: bool = False, features: Tensor | None = None) -> None:
        """Start a request; ``features``: the prefill's (``Verifier.prefill``), for a ``FeatureSource``."""

    def draft(self, root: int, planner: DraftPlanner | None = None) -> Draft: ...

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int], match_len: int = 0,
               features: Tensor | None = None) -> None:
        """Learn from the verdict; ``features``: ``Verdict.features`` (None unless a source reads them)."""

    def close(self) -> None: ...


@runtime_checkable
class PreDrafter(Drafter, Protocol):
    """A drafter that drafts the next tree during verification (``RunConfig.async_draft``)."""

    def begin_predraft(self, tree: DraftTree) -> PreDraft | None:
        """A fork betting on ``tree``'s likeliest path (None: draft this step in line)."""

    def grow(self, pre: PreDraft, clock: float) -> PreDraft:
        """Draft the next tree on the fork (on the drafter thread)."""

    def adopt(self, pre: PreDraft, new_tokens: list[int]) -> Draft | None:
        """The pre-drafted tree, if its bet held (None: draft anew)."""


# ------------------------------------------------------------------------------------ verify


@dataclass(frozen=True)
class Verdict:
    """What verifying one tree told: the target's argmax after each node, the accepted path
    with its bonus token, the target's top 5 per node, and each node's position id."""

    top1: list[int]  # (T,) -1 where unknown (a replay knows the target only along its text)
    acceptance: Acceptance  # the accepted path (node ids, root first), the bonus token, p_target
    topk: tuple[list[list[int]], list[list[float]]]  # (T, 5) ids and probabilities
    positions: list[int]  # (T,) position ids; positions[0] is the root's, the committed length
    features: Tensor | None = None  # (T, F): the target's features at every node, where a FeatureSource reads them


@runtime_checkable
class Verifier(Protocol):
    """What ``Run._step`` calls to score a tree. Its cache holds every committed token but the
    root; ``verify`` adds the tree's entries, ``commit`` cuts them to the accepted path (``KVCut``)."""

    def prefill(self, ids: list[int]) -> Tensor | None:
        """Fill the cache with every prompt token but the root; returns the target's features at
        those positions where it reads them (``feature_layers``), else None."""

    def verify(self, tree: DraftTree) -> Verdict: ...

    def commit(self, verdict: Verdict) -> None: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------------------------ commit


class KVCut(Protocol):
    """Keep the accepted path's KV, every layer, in place.

    ``cache``'s entries ``[0, start)`` stay; the entries at ``slots`` (ascending, each >= ``start``)
    become entries ``start .. start + len(slots) - 1``. Invariant: afterwards those entries equal
    the cache of a plain causal forward over the prefix plus the accepted tokens, so the next
    forward cannot tell a tree step from sequential decoding. A dynamic cache drops everything
    after them; a slot cache leaves stale slots past them, which no later mask lets a node see."""

    def __call__(self, cache: Cache, start: int, slots: list[int]) -> None: ...
