"""Why async? The Talon paper's third claim: drafting the next tree while the target verifies this
one removes the mutual wait. From a replayed run's timeline (the app's default configuration, the
times the cost model predicts for every step), how much drafting could hide behind verification,
and the bound each schedule reaches:

* **async off**: every step costs draft + verify + bookkeeping, one after the other;
* **async on, at best**: the next step's drafting runs beside this step's verification, so a step
  costs max(draft, verify) + bookkeeping (an upper bound: a pre-drafted tree is thrown away when
  the target rejects the path it assumed).

Under this host's measured curves (where, on a 2-core CPU, both sides compete for the same cores,
so the overlap is a bound the host cannot reach), and under a GPU-like cost curve where the
draft runs beside the target: ``GPU_LIKE``, a model, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.cost import synthetic_costs
from talon.run_config import RunConfig
from talon.trace import StepTrace

# A GPU-like curve (a model, not a measurement): verification nearly flat in tree size, a draft
# forward a tenth of a target forward, per-step bookkeeping 1 ms.
GPU_LIKE = {"verify": {1: 0.025, 16: 0.026, 64: 0.03, 128: 0.036}, "draft": {1: 0.0025, 16: 0.0026, 64: 0.003},
            "other_s": 0.001}


@dataclass(frozen=True)
class AsyncBound:
    """One replayed run's timeline under one cost model."""

    label: str
    tokens: int
    draft_s: float
    verify_s: float
    other_s: float
    overlap_s: float  # sum over steps of min(draft, verify): drafting that could hide behind verification

    @property
    def sync_s(self) -> float:
        return self.draft_s + self.verify_s + self.other_s

    @property
    def async_s(self) -> float:
        return self.sync_s - self.overlap_s

    @property
    def sync_rate(self) -> float:
        return self.tokens / self.sync_s if self.sync_s > 0 else 0.0

    @property
    def async_rate(self) -> float:
        return self.tokens / self.async_s if self.async_s > 0 else 0.0

    @property
    def gain(self) -> float:
        return self.sync_s / self.async_s if self.async_s > 0 else 1.0


def bound_of(label: str, steps: list[StepTrace], tokens: int) -> AsyncBound:
    """Sum a timeline: each step's drafting, verification, bookkeeping, and their overlap."""
    return AsyncBound(label, tokens, sum(s.draft_s for s in steps), sum(s.verify_s for s in steps),
                      sum(s.other_s for s in steps), sum(min(s.draft_s, s.verify_s) for s in steps))


@dataclass(frozen=True)
class AsyncLesson:
    suite: str
    prompt: str
    host: AsyncBound
    gpu_like: AsyncBound


def async_lesson(atlas: Atlas, base: RunConfig | None = None) -> AsyncLesson:
    """The default configuration replayed on ``atlas`` under its own curves and under ``GPU_LIKE``
    (where the planner, which plans on the curves, may draft more)."""
    cfg = (base or RunConfig()).replace(max_new_tokens=len(atlas.output), cost_model="fixed",
                                        draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab)))
    host = replay(atlas, cfg)
    gpu_atlas = Atlas(**{**atlas.__dict__, "costs": synthetic_costs(
        GPU_LIKE["verify"], GPU_LIKE["draft"], other_s=GPU_LIKE["other_s"]).to_dict()})
    gpu = replay(gpu_atlas, cfg)
    return AsyncLesson(atlas.suite, atlas.prompt,
                       bound_of("this host's measured curves", host.steps, len(host.summary.token_ids)),
                       bound_of("a GPU-like curve (a model)", gpu.steps, len(gpu.summary.token_ids)))


def async_table(lessons: list[AsyncLesson]) -> str:
    """Markdown: per prompt, drafting's share of a step and the async bound, on both curves."""
    lines = ["| suite | drafting share (host) | async bound (host) | drafting share (GPU-like) | async bound (GPU-like) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for x in lessons:
        cells = []
        for b in (x.host, x.gpu_like):
            cells += [f"{100 * b.draft_s / b.sync_s:.0f} %" if b.sync_s else "–", f"{b.gain:.2f}x"]
        lines.append(f"| {x.suite} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
