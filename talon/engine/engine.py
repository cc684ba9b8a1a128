"""The engine: the loaded pair, how its forwards run, its cost snapshots, and a ``Run`` per request.

``Engine`` owns what outlives a request (the models, their pools of static forwards, the probed
cost curves, retrieval corpora) behind two locks; every ``run`` gets its own caches, drafter and
verifier, assembled into ``RunParts`` for the step loop (``talon.engine.run``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from transformers import PreTrainedModel

from talon.core.contracts import FeatureSource
from talon.cost.cache import retire_if_contradicted
from talon.cost.model import CostModel
from talon.cost.probe import load_or_probe
from talon.drafters import SOURCE_MAKERS
from talon.drafters.model import ModelSource
from talon.drafters.retrieval import CorpusIndex, Retriever
from talon.drafters.tree_drafter import TreeDrafter, build_drafter
from talon.engine.forwards import Forwards
from talon.engine.prompt import PromptError, StopCheck, encode_prompt, eos_ids
from talon.engine.run import Run, RunParts
from talon.graphs.pool import StaticPool
from talon.knobs import HEAD_KINDS
from talon.models import LoadedModel
from talon.models.attention import resolve_fold, set_fold
from talon.models.eagle3 import is_head
from talon.models.head import head_rows
from talon.models.mtp import mtp_refusal
from talon.run_config import ConfigError, RunConfig
from talon.trace import RunModels, RunSummary, StepTrace


class Engine:
    """Owns the loaded models; every ``run`` gets its own caches and drafter state."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        cost_cache: Path | None = None,
        costs: CostModel | None = None,
        forward: str = "auto",
        chain: bool = False,
        fold: bool | None = None,
    ) -> None:
        """``cost_cache``: the directory where probed cost curves are cached (None = probe once
        per engine, cache nothing); ``costs``: a given cost model (tests, what-if runs). ``forward``:
        how the target verifies and the draft model drafts: ``dynamic`` (a cache that grows, one
        forward of the tree's own size), ``static`` (``talon.graphs.static``: a preallocated cache,
        bucketed sizes), ``graphs`` (static, each bucket replayed as a CUDA graph; CUDA only) or
        ``auto`` (``resolve_forward``). ``chain``: on a static forward, TALON's adaptive trees grow on
        the draft model's device, their layers chained with no host turnaround (``talon.graphs.chain``).
        ``fold``: grouped-query attention folded (``talon.models.attention``; None: the device kind's
        proven default). It switches the models' attention, so engines sharing a model share it."""
        wanted = resolve_fold(fold, target.device)
        self.fold = set_fold(target.model, wanted)  # False for a model on eager or flash attention
        if draft is not None and not is_head(draft.model):  # a head runs its own attention
            set_fold(draft.model, wanted)
        self.forwards = Forwards(forward, target, draft, chain)
        self.forward = self.forwards.forward
        self.target = target
        self.draft = draft
        self.cost_cache = cost_cache
        self._given_costs = costs
        self._snapshots: dict[int, CostModel] = {}  # draft_vocab -> the curves every run starts from
        self._token_text: dict[int, str] = {}
        self._text_lock = threading.Lock()
        self._cost_lock = threading.Lock()
        self._corpora: dict[str, CorpusIndex] = {}
        self._source_snapshots: dict[tuple[int, int], CostModel] = {}  # (draft_vocab, id(source)) -> curves

    @property
    def forward_path(self) -> str:
        """How this engine's forwards run, as a run's summary and the cost cache name it: the
        forward, then ``+chain`` and ``+fold`` where on (``dynamic+fold``, ``graphs``)."""
        return self.forward + ("+chain" if self.forwards.chain else "") + ("+fold" if self.fold else "")

    @property
    def static_pools(self) -> dict[str, StaticPool]:
        """The static forward's pools of forwards by role (none on the dynamic forward)."""
        return self.forwards.roles(self.draft.model if self.draft is not None else None)

    def cost_snapshot(self, draft_vocab: int = 0, drafting: PreTrainedModel | None = None,
                      refresh: bool = False) -> CostModel:
        """The pair's cost model as read once (the probe, or the cache): what every run starts
        from. A run plans on its own copy and never changes this one; ``adopt_costs`` does,
        between runs, when the caller says so. ``drafting``: the model that drafts, where it is
        not the pair's draft model (a view of the target): its curves are its own. ``refresh``:
        probe again on this engine's forward, whatever is cached (``talon costs --probe``)."""
        pair = drafting is None or (self.draft is not None and drafting is self.draft.model)
        model = (self.draft.model if self.draft is not None else None) if pair else drafting
        store: dict = self._snapshots if pair else self._source_snapshots
        key = draft_vocab if pair else (draft_vocab, id(drafting))
        with self._cost_lock:
            if key not in store or refresh:
                if self._given_costs is not None:
                    store[key] = self._given_costs.copy()
                else:
                    name = self.draft.name if self.draft is not None else "none"
                    if not pair:
                        name = f"{self.target.name}|{getattr(drafting, 'talon_name', 'source')}"
                    store[key] = load_or_probe(self.target.model, model, (self.target.name, name), self.cost_cache,
                                               draft_vocab, refresh, forward=self.forward_path,
                                               timers=self.forwards.timers(model))
            return store[key]

    def cost_snapshots(self) -> dict[int, CostModel]:
        """The snapshots read so far, by draft vocabulary (what the runs planned on)."""
        with self._cost_lock:
            return dict(self._snapshots)

    def adopt_costs(self, costs: CostModel, draft_vocab: int = 0) -> None:
        """Make ``costs`` (a learn-mode run's refined copy) the snapshot later runs start from; a
        cached curve it contradicts is retired (``talon.cost.cache``)."""
        with self._cost_lock:
            if (old := self._snapshots.get(draft_vocab)) is not None and self._given_costs is None:
                retire_if_contradicted(self.cost_cache, old, costs)
            self._snapshots[draft_vocab] = costs.copy()

    def corpus(self, path: str) -> CorpusIndex:
        """The static retrieval datastore for ``path``, built once per engine (ValueError if bad)."""
        with self._text_lock:
            if path not in self._corpora:
                tok = self.target.tokenizer
                self._corpora[path] = CorpusIndex.from_file(
                    path, lambda text: tok(text, add_special_tokens=False)["input_ids"]
                )
            return self._corpora[path]

    def model_source(self, model: PreTrainedModel, cfg: RunConfig, prompt_len: int) -> ModelSource:
        """A model source over ``model`` on this engine's forward (``SourceModels``)."""
        return self.forwards.model_source(model, cfg, prompt_len)

    def make_drafter(self, cfg: RunConfig, prompt_len: int = 0) -> TreeDrafter:
        """The run's drafter: its kind's draft source (``talon.knobs``), retrieval, and
        ``build_drafter`` over them (after ``prepare``, which refuses a kind it cannot serve)."""
        source = SOURCE_MAKERS[cfg.drafter](self, cfg, prompt_len) if cfg.uses_model else None
        corpus = self.corpus(cfg.retrieval.corpus) if cfg.uses_retrieval and cfg.retrieval.corpus else None
        retriever = Retriever(cfg.retrieval, corpus) if cfg.uses_retrieval else None
        return build_drafter(cfg, source, retriever)

    def token_text(self, token: int) -> str:
        with self._text_lock:
            if token not in self._token_text:
                self._token_text[token] = self.target.tokenizer.decode([token])
            return self._token_text[token]

    def prepare(self, prompt: str | list[int], cfg: RunConfig) -> list[int]:
        """The prompt's token ids, after every check a run makes before touching a device: the
        prompt, the context window, a drafter that needs a draft model (PromptError, ConfigError).
        Tokenizer and configs only, so it may run where no device may be touched (ZeroGPU)."""
        if cfg.needs_draft_model and self.draft is None:
            raise ConfigError(
                f"drafter {cfg.drafter!r} needs a draft model; load one or use --drafter retrieval"
            )
        head = self.draft is not None and is_head(self.draft.model)
        if cfg.needs_draft_model and head:
            raise ConfigError(f"the draft is an EAGLE-3 head, not a model: use --drafter "
                              f"{' or '.join(HEAD_KINDS)}")
        if cfg.needs_head and not head:
            raise ConfigError(f"drafter {cfg.drafter!r} needs an EAGLE-3 head as the draft (--draft DIR, a "
                              "head's checkpoint: its config.json names draft_vocab_size)")
        if cfg.needs_mtp:
            reason = mtp_refusal(self.target.model.config, None)
            if reason is not None:
                raise ConfigError(f"drafter {cfg.drafter!r}: {reason}")
        if cfg.reads_features and cfg.async_draft:
            raise ConfigError(f"drafter {cfg.drafter!r} drafts from the features the target's verification returns, "
                              "so it cannot draft the next tree during that verification: turn async_draft off")
        vocab = head_rows(self.target.model)  # a shape: no device touched
        prompt_ids = encode_prompt(self.target.tokenizer, prompt, cfg.chat_template, vocab)
        limit = getattr(self.target.model.config, "max_position_embeddings", None)
        if limit and len(prompt_ids) + cfg.max_new_tokens + cfg.tree.budget + 1 > limit:
            raise PromptError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) "
                f"+ budget ({cfg.tree.budget}) exceeds the model's context window ({limit} tokens)"
            )
        return prompt_ids

    def run(self, prompt: str | list[int], cfg: RunConfig, cancel: threading.Event | None = None,
            prepared: Sequence[int] | None = None) -> "Run":
        """A run of ``prompt`` verified by the target model (PromptError, ConfigError if bad);
        ``prepared``: its ids as ``prepare`` gave them for this pair (not checked again)."""
        tok = self.target.tokenizer
        prompt_ids = list(prepared) if prepared is not None else self.prepare(prompt, cfg)
        drafter = self.make_drafter(cfg, len(prompt_ids))
        costs = None
        if cfg.tree.cost_aware and cfg.drafts:
            costs = self.cost_snapshot(cfg.draft_vocab, getattr(drafter.source, "model", None)).copy()
        parts = RunParts(
            prompt_ids=prompt_ids,
            prompt_text=prompt if isinstance(prompt, str) else tok.decode(prompt),
            drafter=drafter,
            verifier=self.forwards.verifier(cfg, len(prompt_ids), feature_layers(drafter)),
            stop=StopCheck(tok, eos_ids(self.target), cfg.stop_strings, cfg.max_new_tokens),
            token_text=self.token_text,
            detokenize=lambda ids: tok.decode(ids, skip_special_tokens=True),
            models=RunModels(
                target=self.target.name,
                draft=self.draft.name if self.draft is not None else "none",
                dtype=str(self.target.dtype).removeprefix("torch."),
                device=str(self.target.device),
                forward_path=self.forward_path,
            ),
            costs=costs,
        )
        return Run(cfg, parts, cancel, engine=self)


def feature_layers(drafter: TreeDrafter) -> tuple[int, ...]:
    """The target layers whose entering hidden states the run's draft source reads (an EAGLE-3
    head's), so the verifier returns them; () for every other source."""
    return drafter.source.feature_layers if isinstance(drafter.source, FeatureSource) else ()


def generate(engine: Engine, prompt: str | list[int], cfg: RunConfig) -> tuple[RunSummary, list[StepTrace]]:
    """Run to the end; returns the summary (text, MAT, tokens/s, ...) and every step."""
    run = engine.run(prompt, cfg)
    for _ in run:
        pass
    assert run.summary is not None
    return run.summary, run.steps
