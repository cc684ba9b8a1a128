"""The step loop's contracts: what ``decode.Run`` asks of a drafter and a verifier, what the
hybrid drafter asks of its draft model, and ```talon.drafters.tree_drafter.build_drafter``, the one place a
run's drafter is put together (the engine's real models and the atlas's replay both use it).

* ``DraftSource``: a source of draft-model children. ``ModelDrafter`` runs a real model;
  ``talon.atlas.replay.AtlasModel`` answers from a recording; a new source (a different
  small model, an n-gram table, a toy) implements these members and nothing else.
* ``Drafter``: what ``Run`` calls each step. ``TreeDrafter`` is the one implementation: it
  combines a ``DraftSource`` with retrieval under TALON's budget and gates.
* ``PreDrafter``: a ``Drafter`` that can also draft the next tree while the target verifies
  (async pre-drafting, its own small protocol); it needs a ``ForkableSource``.
* ``Verifier``: what ``Run`` calls to score a tree. ``talon.core.verify.TargetVerifier`` runs the
  target; ``talon.atlas.replay.TextVerifier`` matches a recorded greedy text.

Asynchronous pre-drafting needs a source that can fork (``ForkableSource``: ``ModelDrafter``);
with any other source, or a drafter that is not a ``PreDrafter``, the loop drafts synchronously.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from talon.tree import DraftTree

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from talon.drafters.model import ModelDrafter
    from talon.models import LoadedModel
    from talon.cost.plan import AcceptanceModel, Planner
    from talon.run_config import RunConfig, TreeConfig
    from talon.core.verify import Verdict

Children = list[list[tuple[int, float]]]  # per expanded node: (token, draft probability q), best first


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

    drafter: ForkableSource
    assumed: list[int]
    tree: DraftTree | None = None
    busy: tuple[float, float] = (0.0, 0.0)


@runtime_checkable
class DraftSource(Protocol):
    """The draft model's half of the hybrid drafter."""

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

    def expand(self, tree: DraftTree, nodes: list[int], k: int) -> Children:
        """The top ``k`` children of each of ``nodes`` (one layer of ``tree``)."""

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int]) -> None:
        """The target accepted ``accepted`` (node ids, root first) and committed ``new_tokens``."""

    def take_timings(self) -> list[tuple[int, float]]:
        """(tokens fed, seconds) of the forwards since the last call; clears the record."""


@runtime_checkable
class ChainingSource(DraftSource, Protocol):
    """A source that can grow a whole adaptive tree itself, on its device (``talon.graphs.chain``):
    ``StaticModelDrafter`` with ``chain``. The hybrid drafter asks ``chains`` each step."""

    def chains(self, cfg: TreeConfig) -> bool: ...

    def chained_tree(self, shared: DraftTree, cfg: TreeConfig, match_len: int, acceptance: AcceptanceModel,
                     calibrated: bool, planner: Planner | None) -> DraftTree: ...


class SourceModels(Protocol):
    """What a drafter kind's source maker (``talon.knobs``: ``source``) gets from the
    engine: the loaded pair, and a model drafter over any model on the engine's step (dynamic,
    static or CUDA graphs, with its pools)."""

    target: LoadedModel
    draft: LoadedModel | None

    def model_drafter(self, model: PreTrainedModel, cfg: RunConfig, prompt_len: int) -> ModelDrafter: ...


@runtime_checkable
class Drafter(Protocol):
    """What ``decode.Run`` calls each step."""

    acceptance: AcceptanceModel  # the run's calibrated acceptance (the planner and traces read it)

    def reset(self, prompt_ids: list[int], lazy_model: bool = False) -> None: ...

    def draft(self, root: int, planner: Planner | None = None) -> Draft: ...

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int], match_len: int = 0) -> None: ...

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


@runtime_checkable
class ForkableSource(DraftSource, Protocol):
    """A draft source that forks: an independent copy in the same state drafts ahead, and is
    adopted in place of the original when its bet held."""

    model: Any  # the module that drafts (its device picks the stream)

    def fork(self) -> ForkableSource: ...

    def adopt_subtree(self, tree: DraftTree, node: int, subtree_nodes: list[int]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Verifier(Protocol):
    """What ``decode.Run`` calls to score a tree: its cache holds every committed token but the root."""

    def prefill(self, ids: list[int]) -> None: ...

    def verify(self, tree: DraftTree) -> Verdict: ...

    def commit(self, verdict: Verdict) -> None: ...

    def close(self) -> None: ...
