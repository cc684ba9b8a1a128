"""The step loop: draft -> verify (the verifier accepts) -> commit -> record, one ``StepTrace`` per step.

One loop serves every mode: the autoregressive baseline is the same loop with a drafter that
returns the bare root. The target's cache holds every committed token but the last (the root),
which goes into the next verification as tree node 0. The parts it calls are the contracts of
``talon.core.contracts``; ``Engine.run`` (``talon.engine.engine``) or an atlas replay builds them.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from talon.core.contracts import Draft, Drafter, PreDraft, PreDrafter, Verdict, Verifier
from talon.cost.model import CostModel
from talon.cost.plan import Planner, drafting_without_catch_up
from talon.engine.prompt import StopCheck
from talon.run_config import RunConfig
from talon.trace import (
    PlanRecord,
    RunModels,
    RunSummary,
    StepTiming,
    StepTrace,
    StopReason,
    TreeRecord,
    VerdictRecord,
    summarize_steps,
)
from talon.tree import MODEL_NODE_SOURCE, DraftTree


class CostKeeper(Protocol):
    """What made a run and keeps the pair's cost snapshots (``Engine``): its owner hands it what a
    learn-mode run refined."""

    def adopt_costs(self, costs: CostModel, draft_vocab: int = 0) -> None: ...

    def cost_snapshots(self) -> dict[int, CostModel]: ...


@dataclass(frozen=True)
class NextDraft:
    """This step's tree, and whether it was drafted ahead, during the last verification."""

    draft: Draft
    reused: bool | None = None  # None: nothing was drafted ahead; True: adopted; False: its bet missed
    ahead_busy: tuple[tuple[float, float], ...] = ()  # the drafter thread's span drafting ahead


@dataclass(frozen=True)
class StepResult:
    """What one step hands the loop: its record, why the run stops there, the next tree in flight."""

    trace: StepTrace
    stop: StopReason | None  # None: the run goes on
    ahead: Future[PreDraft] | None  # the next tree, drafted on the drafter thread meanwhile


@dataclass
class RunParts:
    """Everything a run needs besides its configuration: built by ``Engine.run`` around the real
    models, or by ``talon.atlas.loop`` around a recorded draft atlas and the target's text."""

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
                 engine: CostKeeper | None = None) -> None:
        """``engine``: the ``Engine`` that made the run, where one did (its owner adopts what a
        learn-mode run refined: ``Engine.adopt_costs``)."""
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
        self.model_node_source = MODEL_NODE_SOURCE.get(cfg.kind.model or "", "model")  # the trace's model nodes

    @property
    def fixed_costs(self) -> bool:
        """Plan on the snapshot and predicted times alone (``cost_model="fixed"``, every replay,
        and every sampled run: its random draws depend on the tree, so a seed must reproduce the
        tree)."""
        return self.cfg.cost_model == "fixed" or not self.cfg.sampling.greedy or self.parts.predicted_times is not None

    def __iter__(self) -> Iterator[StepTrace]:
        t0 = time.perf_counter()
        ids = self.prompt_ids
        features = self.verifier.prefill(ids)  # the target's features, where the drafter reads them
        if self.planner is not None and self.cfg.uses_model and self.cfg.uses_retrieval and not self.cfg.async_draft:
            self.drafter.reset(ids, lazy_model=True, features=features)  # the planner decides when the prefill pays
        else:
            self.drafter.reset(ids, features=features)
        predrafts = self.cfg.async_draft and isinstance(self.drafter, PreDrafter)  # once, not per step
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="talon-drafter") if predrafts else None
        root, stop, ahead = ids[-1], None, None
        try:
            while stop is None and not self.cancel.is_set():
                result = self._step(root, t0, pool, ahead)
                stop, ahead = result.stop, result.ahead
                self.steps.append(result.trace)
                root = result.trace.new_tokens[-1]
                yield result.trace
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            self.drafter.close()
            self.verifier.close()
        seconds = time.perf_counter() - t0
        if self.parts.predicted_times is not None:
            seconds = sum(s.draft_s + s.verify_s + s.other_s for s in self.steps)
        self.summary = self._summarize(seconds, stop or "cancelled")

    def _next_draft(self, root: int, ahead: Future[PreDraft] | None) -> NextDraft:
        """This step's tree: the pre-draft when it bet right, else a fresh draft."""
        if ahead is None:
            return NextDraft(self._fresh_draft(root))
        pre = ahead.result()  # re-raises a drafter-thread error here
        draft = self.drafter.adopt(pre, self.steps[-1].new_tokens)
        if draft is None:
            return NextDraft(self._fresh_draft(root), reused=False, ahead_busy=(pre.busy,))
        return NextDraft(draft, reused=True, ahead_busy=(pre.busy,))

    def _fresh_draft(self, root: int) -> Draft:
        if self.planner is None:
            return self.drafter.draft(root)
        self.planner.begin_step()
        return self.drafter.draft(root, self.planner)

    def _step(
        self, root: int, t0: float, pool: ThreadPoolExecutor | None, ahead: Future[PreDraft] | None
    ) -> StepResult:
        """One step: draft a tree, verify it in one target forward (the verifier accepts a path:
        ``talon.core.contracts``), cut it at a stop, commit it, record it."""
        t_start = time.perf_counter()
        next_draft = self._next_draft(root, ahead)  # draft (or adopt the pre-draft)
        draft = next_draft.draft
        tree = draft.tree
        t_draft = time.perf_counter()
        ahead = self._predraft(pool, tree, t0)  # the next tree, drafted while the target verifies this one
        t_verify_start = time.perf_counter()
        verdict = self.verifier.verify(tree)  # verify: every node in one target forward, a path accepted
        t_verify = time.perf_counter()
        acc = verdict.acceptance
        new_tokens, stop = self.stop.cut(  # the accepted path and its bonus token, cut at a stop
            self.generated, [tree.tokens[n] for n in acc.accepted[1:]] + [acc.bonus_token]
        )
        p_accept_est = self._estimates(draft)  # what the drafter predicted, before it learns
        self.verifier.commit(verdict)  # commit: the verifier keeps the path's KV (the KV cut) ...
        self.drafter.commit(tree, acc.accepted, new_tokens, draft.match_len, verdict.features)  # ... the drafter learns
        self.generated.extend(new_tokens)
        timing = self._timing(draft, t0, next_draft.ahead_busy, (t_start, t_draft, t_verify_start, t_verify))
        plan = PlanRecord(match_len=draft.match_len, model_skipped=draft.model_skipped, trimmed=draft.trimmed,
                          draft_forwards=len(draft.forwards), p_accept_est=p_accept_est,
                          predraft_reused=next_draft.reused)
        step = StepTrace.from_parts(len(self.steps), self._tree_record(tree), self._verdict_record(verdict, new_tokens),
                                    timing, plan)  # record: one StepTrace
        if self.planner is not None:
            self._learn(draft, step)
        if stop is not None and ahead is not None:
            ahead.cancel()
        return StepResult(step, stop, ahead)

    def _predraft(self, pool: ThreadPoolExecutor | None, tree: DraftTree, t0: float) -> Future[PreDraft] | None:
        """Start drafting the next tree on the drafter thread (a ``PreDrafter`` with async drafting)."""
        if pool is None or (pre := self.drafter.begin_predraft(tree)) is None:  # see __iter__
            return None
        return pool.submit(self.drafter.grow, pre, t0)

    def _timing(self, draft: Draft, t0: float, ahead_busy: tuple[tuple[float, float], ...],
                clock: tuple[float, float, float, float]) -> StepTiming:
        """The step's split (draft, verify, other) and each lane's busy spans, from ``clock``
        (start, drafted, verify start, verified); a replay's from its cost model."""
        if self.parts.predicted_times is not None:
            timing = self._predicted_timing(draft, self.parts.predicted_times)
        else:
            t_start, t_draft, t_verify_start, t_verify = clock
            other_s = (time.perf_counter() - t_verify) + (t_verify_start - t_draft)
            timing = StepTiming(
                draft_s=t_draft - t_start, verify_s=t_verify - t_verify_start, other_s=other_s,
                drafter_busy=[*ahead_busy, (t_start - t0, t_draft - t0)],
                verifier_busy=[(t_verify_start - t0, t_verify - t0)],
            )
        if self.planner is not None:
            timing = dataclasses.replace(timing, predicted_verify_s=self.planner.costs.verify_s(len(draft.tree.tokens)))
        return timing

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

    def _tree_record(self, tree: DraftTree) -> TreeRecord:
        text = self.parts.token_text
        gates = tree.gates
        return TreeRecord(
            tokens=list(tree.tokens),
            texts=[text(t) for t in tree.tokens],
            parents=list(tree.parents),
            depths=list(tree.depths),
            q_draft=list(tree.q_draft),
            path_conf=list(tree.path_conf),
            sources=[self.model_node_source if s == "model" else s for s in tree.sources],
            gate_layer_max=[g.layer_max if g else None for g in gates],
            gate_threshold=[g.threshold if g else None for g in gates],
            gate_passed=[g.passed if g else None for g in gates],
            tree_stop=tree.stop,
        )

    def _verdict_record(self, verdict: Verdict, new_tokens: list[int]) -> VerdictRecord:
        text = self.parts.token_text
        acc = verdict.acceptance
        topk_ids, topk_probs = verdict.topk
        return VerdictRecord(
            target_top1=verdict.top1,
            target_topk_ids=topk_ids,
            target_topk_probs=topk_probs,
            target_topk_texts=[[text(t) for t in row] for row in topk_ids],
            positions=verdict.positions,
            accepted=acc.accepted,
            bonus_token=acc.bonus_token,
            bonus_text=text(acc.bonus_token),
            bonus_kind=acc.bonus_kind,
            residual_topk=[(t, round(p, 6)) for t, p in acc.residual],
            new_tokens=new_tokens,
            p_target=acc.p_target,
            p_accept=acc.p_accept,
        )

    def _estimates(self, draft: Draft) -> list[float]:
        """The acceptance model's P(node accepted) for every node (none for autoregressive runs)."""
        if not self.cfg.drafts:
            return []
        return self.drafter.acceptance.node_probs(draft.tree, draft.match_len)

    def _summarize(self, seconds: float, reason: StopReason) -> RunSummary:
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
            forward_path=models.forward_path,
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
