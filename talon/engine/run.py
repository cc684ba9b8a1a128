"""The step loop: draft -> verify -> accept -> commit -> record, one ``StepTrace`` per step.

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
from typing import Any

from talon.core.contracts import Draft, Drafter, PreDraft, PreDrafter, Verdict, Verifier
from talon.cost.model import CostModel
from talon.cost.plan import Planner, drafting_without_catch_up
from talon.engine.prompt import StopCheck
from talon.run_config import RunConfig
from talon.trace import RunModels, RunSummary, StepTiming, StepTrace, summarize_steps
from talon.tree import DraftTree


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
                 engine: Any = None) -> None:
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
        self.model_source = "head" if cfg.kind.model == "head" else "model"  # what the trace calls model nodes

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
        """One step: draft a tree, verify it in one target forward, accept a path, commit it,
        record it. Returns the step, why the run stops ("" = it goes on) and the next pre-draft."""
        t_start = time.perf_counter()
        draft, reused, pre_busy = self._next_draft(root, ahead)  # draft (or adopt the pre-draft)
        tree = draft.tree
        t_draft = time.perf_counter()
        ahead = self._predraft(pool, tree, t0)  # the next tree, drafted while the target verifies this one
        t_verify_start = time.perf_counter()
        verdict = self.verifier.verify(tree)  # verify: every node in one target forward
        t_verify = time.perf_counter()
        acc = verdict.acceptance  # accept: the path the verdict accepted, its bonus token, cut at a stop
        new_tokens, reason = self.stop.cut(
            self.generated, [tree.tokens[n] for n in acc.accepted[1:]] + [acc.bonus_token]
        )
        p_accept_est = self._estimates(draft)  # what the drafter predicted, before it learns
        self.verifier.commit(verdict)  # commit: the verifier keeps the path's KV (the KV cut) ...
        self.drafter.commit(tree, acc.accepted, new_tokens, draft.match_len, verdict.features)  # ... the drafter learns
        self.generated.extend(new_tokens)
        record = self._record(draft, verdict, new_tokens)  # record: one StepTrace
        timing = self._timing(draft, t0, pre_busy, (t_start, t_draft, t_verify_start, t_verify))
        step = StepTrace(**record, **dataclasses.asdict(timing), p_accept_est=p_accept_est,
                         predraft_reused=reused, draft_forwards=len(draft.forwards))
        if self.planner is not None:
            self._learn(draft, step)
        if reason and ahead is not None:
            ahead.cancel()
        return step, reason, ahead

    def _predraft(self, pool: ThreadPoolExecutor | None, tree: DraftTree, t0: float) -> Future | None:
        """Start drafting the next tree on the drafter thread (a ``PreDrafter`` with async drafting)."""
        if pool is None or (pre := self.drafter.begin_predraft(tree)) is None:  # see __iter__
            return None
        return pool.submit(self.drafter.grow, pre, t0)

    def _timing(self, draft: Draft, t0: float, pre_busy: list,
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
                drafter_busy=[*pre_busy, (t_start - t0, t_draft - t0)],
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
            sources=[self.model_source if s == "model" else s for s in tree.sources],
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
