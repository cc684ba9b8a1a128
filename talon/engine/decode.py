"""The step loop: draft -> verify -> accept -> commit, one ``StepTrace`` per step.

One loop serves every mode: the autoregressive baseline is the same loop with a drafter that
returns the bare root. The target's cache holds every committed token but the last (the root),
which goes into the next verification as tree node 0.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from talon.models.attention import resolve_fold, set_fold
from talon.cost.model import CostModel
from talon.cost.cache import load_or_probe, retire_if_contradicted
from talon.drafters import SOURCES
from talon.drafters.base import Draft, Drafter, PreDraft, PreDrafter, Verifier
from talon.drafters.tree_drafter import TreeDrafter, build_drafter
from talon.drafters.model import ModelDrafter
from talon.drafters.retrieval import CorpusIndex, RetrievalDrafter
from talon.models import LoadedModel
from talon.cost.plan import Planner, drafting_without_catch_up
from talon.engine.prompt import PromptError, StopCheck, encode_prompt, eos_ids
from talon.run_config import ConfigError, RunConfig
from talon.trace import RunModels, RunSummary, StepTiming, StepTrace, summarize_steps
from talon.graphs.pool import StaticPool
from talon.engine.forwards import Forwards
from talon.core.verify import Verdict, head_rows

log = logging.getLogger(__name__)
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
        if draft is not None:
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
    def path(self) -> str:
        """How this engine's forwards run, as a run's summary and the cost cache name it: the
        forward, then ``+chain`` and ``+fold`` where on (``dynamic+fold``, ``graphs``)."""
        return self.forward + ("+chain" if self.forwards.chain else "") + ("+fold" if self.fold else "")

    @property
    def static_pools(self) -> dict[str, StaticPool]:
        """The static step's pools of forwards by role (none on the dynamic forward)."""
        return self.forwards.roles(self.draft.model if self.draft is not None else None)

    def cost_snapshot(self, draft_vocab: int = 0, source: PreTrainedModel | None = None,
                      refresh: bool = False) -> CostModel:
        """The pair's cost model as read once (the probe, or the cache): what every run starts
        from. A run plans on its own copy and never changes this one; ``adopt_costs`` does,
        between runs, when the caller says so. ``source``: the model that drafts, where it is
        not the pair's draft model (a view of the target): its curves are its own. ``refresh``:
        probe again on this engine's forward, whatever is cached (``talon costs --probe``)."""
        pair = source is None or (self.draft is not None and source is self.draft.model)
        model = (self.draft.model if self.draft is not None else None) if pair else source
        store: dict = self._snapshots if pair else self._source_snapshots
        key = draft_vocab if pair else (draft_vocab, id(source))
        with self._cost_lock:
            if key not in store or refresh:
                if self._given_costs is not None:
                    store[key] = self._given_costs.copy()
                else:
                    name = self.draft.name if self.draft is not None else "none"
                    if not pair:
                        name = f"{self.target.name}|{getattr(source, 'talon_name', 'source')}"
                    store[key] = load_or_probe(self.target.model, model, (self.target.name, name), self.cost_cache,
                                               draft_vocab, refresh, forward=self.path,
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

    def model_drafter(self, model: PreTrainedModel, cfg: RunConfig, prompt_len: int) -> ModelDrafter:
        """A model drafter over ``model`` on this engine's forward (``SourceModels``)."""
        return self.forwards.model_drafter(model, cfg, prompt_len)

    def make_drafter(self, cfg: RunConfig, prompt_len: int = 0) -> TreeDrafter:
        """The run's drafter: its kind's draft source (``talon.knobs``), retrieval, and
        ``build_drafter`` over them (after ``prepare``, which refuses a kind it cannot serve)."""
        model = SOURCES[cfg.drafter](self, cfg, prompt_len) if cfg.uses_model else None
        corpus = self.corpus(cfg.retrieval.corpus) if cfg.uses_retrieval and cfg.retrieval.corpus else None
        retrieval = RetrievalDrafter(cfg.retrieval, corpus) if cfg.uses_retrieval else None
        return build_drafter(cfg, model, retrieval)

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
            costs = self.cost_snapshot(cfg.draft_vocab, getattr(drafter.model, "model", None)).copy()
        parts = RunParts(
            prompt_ids=prompt_ids,
            prompt_text=prompt if isinstance(prompt, str) else tok.decode(prompt),
            drafter=drafter,
            verifier=self.forwards.verifier(cfg, len(prompt_ids)),
            stop=StopCheck(tok, eos_ids(self.target), cfg.stop_strings, cfg.max_new_tokens),
            token_text=self.token_text,
            detokenize=lambda ids: tok.decode(ids, skip_special_tokens=True),
            models=RunModels(
                target=self.target.name,
                draft=self.draft.name if self.draft is not None else "none",
                dtype=str(self.target.dtype).removeprefix("torch."),
                device=str(self.target.device),
                forward=self.path,
            ),
            costs=costs,
        )
        return Run(cfg, parts, cancel, engine=self)


@dataclass
class RunParts:
    """Everything a run needs besides its configuration: built by ``Engine.run`` around the real
    models, or by ``talon.atlas.replay`` around a recorded draft atlas and the target's text."""

    prompt_ids: list[int]
    prompt_text: str
    drafter: Drafter
    verifier: Verifier
    stop: StopCheck
    token_text: Callable[[int], str]
    detokenize: Callable[[list[int]], str]
    models: RunModels
    costs: CostModel | None = None  # this run's own copy of the cost snapshot (cost-aware runs)
    predicted_times: CostModel | None = None  # step times from this cost model, not the clock (replays)


class Run:
    """Iterate to get StepTraces as they happen; ``summary`` is set when the iteration ends."""

    def __init__(self, cfg: RunConfig, parts: RunParts, cancel: threading.Event | None = None,
                 engine: Engine | None = None) -> None:
        self.engine = engine
        self.cfg = cfg
        self.parts = parts
        self.cancel = cancel or threading.Event()
        self.prompt_ids = parts.prompt_ids
        self.prompt_text = parts.prompt_text
        self.drafter = parts.drafter
        self.verifier = parts.verifier
        self.stop = parts.stop
        self.costs = parts.costs
        self.planner: Planner | None = None
        if self.costs is not None:
            self.planner = Planner(
                self.costs, cfg.tree, cfg.max_new_tokens, predicted=self.fixed_costs,
                acceptance=self.drafter.acceptance,
            )
        self.generated: list[int] = []
        self.steps: list[StepTrace] = []
        self.summary: RunSummary | None = None

    @property
    def fixed_costs(self) -> bool:
        """Plan on the snapshot and predicted times alone (``cost_model="fixed"``, every replay,
        and every sampled run: its random draws depend on the tree, so a seed must reproduce the
        tree)."""
        return self.cfg.cost_model == "fixed" or not self.cfg.sampling.greedy or self.parts.predicted_times is not None

    def __iter__(self) -> Iterator[StepTrace]:
        t0 = time.perf_counter()
        ids = self.prompt_ids
        self.verifier.prefill(ids)
        if self.planner is not None and self.cfg.uses_model and self.cfg.uses_retrieval and not self.cfg.async_draft:
            self.drafter.reset(ids, lazy_model=True)  # the planner decides when the model's prefill pays
        else:
            self.drafter.reset(ids)
        predrafts = self.cfg.async_draft and isinstance(self.drafter, PreDrafter)  # once, not per step
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="talon-drafter") if predrafts else None
        root, reason, ahead = ids[-1], "", None
        try:
            while not reason and not self.cancel.is_set():
                step, reason, ahead = self._step(root, t0, pool, ahead)
                self.steps.append(step)
                root = step.new_tokens[-1]
                yield step
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            self.drafter.close()
            self.verifier.close()
        seconds = time.perf_counter() - t0
        if self.parts.predicted_times is not None:
            seconds = sum(s.draft_s + s.verify_s + s.other_s for s in self.steps)
        self.summary = self._summarize(seconds, reason or "cancelled")

    def _next_draft(self, root: int, ahead: Future | None) -> tuple[Draft, bool | None, list]:
        """This step's tree: the pre-draft when it bet right, else a fresh draft."""
        if ahead is None:
            return self._fresh_draft(root), None, []
        pre: PreDraft = ahead.result()  # re-raises a drafter-thread error here
        draft = self.drafter.adopt(pre, self.steps[-1].new_tokens)
        if draft is None:
            return self._fresh_draft(root), False, [pre.busy]
        return draft, True, [pre.busy]

    def _fresh_draft(self, root: int) -> Draft:
        if self.planner is None:
            return self.drafter.draft(root)
        self.planner.begin_step()
        return self.drafter.draft(root, self.planner)

    def _step(
        self, root: int, t0: float, pool: ThreadPoolExecutor | None, ahead: Future | None
    ) -> tuple[StepTrace, str, Future | None]:
        t_start = time.perf_counter()
        draft, reused, pre_busy = self._next_draft(root, ahead)
        tree = draft.tree
        t_draft = time.perf_counter()
        ahead = None
        if pool is not None and (pre := self.drafter.begin_predraft(tree)) is not None:  # a PreDrafter: see __iter__
            ahead = pool.submit(self.drafter.grow, pre, t0)
        t_verify_start = time.perf_counter()
        verdict = self.verifier.verify(tree)
        t_verify = time.perf_counter()
        acc = verdict.acceptance
        new_tokens, reason = self.stop.cut(
            self.generated, [tree.tokens[n] for n in acc.accepted[1:]] + [acc.bonus_token]
        )
        self.verifier.commit(verdict)
        p_accept_est = self._estimates(draft)  # before the drafter learns from this step
        self.drafter.commit(tree, acc.accepted, new_tokens, draft.match_len)
        self.generated.extend(new_tokens)
        record = self._record(draft, verdict, new_tokens)
        if self.parts.predicted_times is not None:
            timing = self._predicted_timing(draft, self.parts.predicted_times)
        else:
            other_s = (time.perf_counter() - t_verify) + (t_verify_start - t_draft)
            timing = StepTiming(
                draft_s=t_draft - t_start, verify_s=t_verify - t_verify_start, other_s=other_s,
                drafter_busy=[*pre_busy, (t_start - t0, t_draft - t0)],
                verifier_busy=[(t_verify_start - t0, t_verify - t0)],
            )
        if self.planner is not None:
            timing = dataclasses.replace(timing, predicted_verify_s=self.planner.costs.verify_s(len(tree.tokens)))
        step = StepTrace(**record, **dataclasses.asdict(timing), p_accept_est=p_accept_est,
                         predraft_reused=reused, draft_forwards=len(draft.forwards))
        if self.planner is not None:
            self._learn(draft, step)
        if reason and ahead is not None:
            ahead.cancel()
        return step, reason, ahead

    def _predicted_timing(self, draft: Draft, costs: CostModel) -> StepTiming:
        """A replay's step times: what the cost model predicts for its forwards and tree, laid
        end to end after the steps before it."""
        draft_s = sum(costs.draft_s(w) for w, _ in draft.forwards)
        verify_s = costs.verify_s(len(draft.tree.tokens))
        start = sum(s.draft_s + s.verify_s + s.other_s for s in self.steps)
        return StepTiming(
            draft_s=draft_s, verify_s=verify_s, other_s=costs.other_s,
            drafter_busy=[(start, start + draft_s)],
            verifier_busy=[(start + draft_s, start + draft_s + verify_s)],
        )

    def _learn(self, draft: Draft, step: StepTrace) -> None:
        """Fold the step's timings into the cost model and its outcome into the planner (a
        seeded planner learns from predicted times only, and leaves the cost model as probed)."""
        planner, forwards = self.planner, draft.forwards
        costs = planner.costs
        if not planner.predicted:
            costs.observe_verify(len(step.tokens), step.verify_s)
            for width, seconds in forwards:
                costs.observe_draft(width, seconds)
            costs.observe_other(step.other_s)
            timed = list(forwards)
            step_s = step.draft_s + step.verify_s + step.other_s
        else:
            timed = [(w, costs.draft_s(w)) for w, _ in forwards]
            step_s = sum(s for _, s in timed) + step.predicted_verify_s + costs.other_s
        model_s = drafting_without_catch_up(timed, costs)
        planner.record_step(
            draft.tree, step.accepted, len(step.new_tokens),
            model_ran=bool(forwards), model_draft_s=model_s, step_s=step_s,
        )

    def _record(self, draft: Draft, verdict: Verdict, new_tokens: list[int]) -> dict[str, Any]:
        """The step's tree, verdict and acceptance as StepTrace fields (the timing comes apart)."""
        tree = draft.tree
        text = self.parts.token_text
        acc, top1, positions = verdict.acceptance, verdict.top1, verdict.positions
        topk_ids, topk_probs = verdict.topk
        gates = tree.gates
        return dict(
            step=len(self.steps),
            tokens=list(tree.tokens),
            texts=[text(t) for t in tree.tokens],
            parents=list(tree.parents),
            depths=list(tree.depths),
            q_draft=list(tree.q_draft),
            path_conf=list(tree.path_conf),
            sources=list(tree.sources),
            gate_layer_max=[g.layer_max if g else None for g in gates],
            gate_threshold=[g.threshold if g else None for g in gates],
            gate_passed=[g.passed if g else None for g in gates],
            target_top1=top1,
            target_topk_ids=topk_ids,
            target_topk_probs=topk_probs,
            target_topk_texts=[[text(t) for t in row] for row in topk_ids],
            positions=positions,
            accepted=acc.accepted,
            bonus_token=acc.bonus_token,
            bonus_text=text(acc.bonus_token),
            bonus_kind=acc.bonus_kind,
            residual_topk=[(t, round(p, 6)) for t, p in acc.residual],
            new_tokens=new_tokens,
            p_target=acc.p_target,
            p_accept=acc.p_accept,
            match_len=draft.match_len,
            tree_stop=tree.stop,
            model_skipped=draft.model_skipped,
            trimmed=draft.trimmed,
        )

    def _estimates(self, draft: Draft) -> list[float]:
        """The acceptance model's P(node accepted) for every node (none for autoregressive runs)."""
        if not self.cfg.drafts:
            return []
        return self.drafter.acceptance.node_probs(draft.tree, draft.match_len)

    def _summarize(self, seconds: float, reason: str) -> RunSummary:
        models = self.parts.models
        agg = summarize_steps(self.steps)
        return RunSummary(
            text=self.parts.detokenize(self.generated),
            token_ids=list(self.generated),
            prompt_token_ids=list(self.prompt_ids),
            steps=len(self.steps),
            tokens_per_second=len(self.generated) / seconds if seconds > 0 else 0.0,
            seconds=seconds,
            target=models.target,
            draft=models.draft,
            dtype=models.dtype,
            device=models.device,
            forward=models.forward,
            config=self.cfg.to_dict(),
            stop_reason=reason,
            cost_model=self._cost_record(),
            prompt=self.prompt_text,
            **agg,
        )

    def _cost_record(self) -> dict:
        """The cost model the run planned on (learn mode: as refined by the end of the run)."""
        if self.costs is None:
            return {}
        return {**self.costs.to_dict(), "mode": "fixed" if self.fixed_costs else "learn"}


def generate(engine: Engine, prompt: str | list[int], cfg: RunConfig) -> tuple[RunSummary, list[StepTrace]]:
    """Run to the end; returns the summary (text, MAT, tokens/s, ...) and every step."""
    run = engine.run(prompt, cfg)
    for _ in run:
        pass
    assert run.summary is not None
    return run.summary, run.steps
