"""Why async? The Talon paper's third claim: drafting the next tree while the target verifies this
one removes the mutual wait. From a replayed run's timeline (the app's default configuration, the
times the cost model predicts for every step), how much drafting could hide behind verification,
and the bound each schedule reaches:

* **async off**: every step costs draft + verify + bookkeeping, one after the other;
* **async on, at best**: the next step's drafting runs beside this step's verification, so a step
  costs max(draft, verify) + bookkeeping (an upper bound: a pre-drafted tree is thrown away when
  the target rejects the path it assumed).

Under this host's measured curves (where, on a 2-core CPU, both sides compete for the same cores,
so the overlap is a bound the host cannot reach), and under a GPU's measured curves: ``GPU_COSTS``,
an H100 replaying CUDA graphs at the 7B preset's shapes (``talon/gpucheck/speed.py``), where a draft
forward is a third of a verification.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from talon.atlas.data import Atlas
from talon.atlas.replay import replay
from talon.atlas.result import for_slot
from talon.cost.model import CostModel
from talon.run_config import RunConfig
from talon.trace import StepTrace

# A GPU's measured step costs (talon-cost/1): the H100, bf16, the 7B preset's shapes, CUDA graphs
GPU_COSTS = Path(__file__).resolve().parents[2] / "data" / "gpu_costs" / "h100-80gb-hbm3-graph-qwen2.5-7b.cost.json"
GPU_LABEL = "H100, CUDA graphs (measured)"


def gpu_costs() -> CostModel:
    return CostModel.from_dict(json.loads(GPU_COSTS.read_text(encoding="utf-8")))


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
    gpu: AsyncBound
    reads_features: bool = False  # an EAGLE-3 head or an MTP layer drafted: it cannot pre-draft


def async_lesson(atlas: Atlas, base: RunConfig | None = None) -> AsyncLesson:
    """The default configuration replayed on ``atlas`` under its own curves and under ``GPU_COSTS``
    (where the planner, which plans on the curves, may draft more). A head or an MTP layer drafts
    from the target's feature of the last committed token, which only the verification gives: it
    cannot draft the next tree during it, so nothing overlaps (the bound is 1x)."""
    cfg = for_slot(atlas, (base or RunConfig()).replace(max_new_tokens=len(atlas.output), cost_model="fixed",
                                        draft_vocab=int(atlas.models.get("draft_vocab", RunConfig.draft_vocab))))
    host = replay(atlas, cfg)
    gpu_atlas = Atlas(**{**atlas.__dict__, "costs": gpu_costs().to_dict()})
    gpu = replay(gpu_atlas, cfg)
    bounds = [bound_of("this host's measured curves", host.steps, len(host.summary.token_ids)),
              bound_of(GPU_LABEL, gpu.steps, len(gpu.summary.token_ids))]
    if atlas.reads_features:
        bounds = [dataclasses.replace(b, overlap_s=0.0) for b in bounds]
    return AsyncLesson(atlas.suite, atlas.prompt, *bounds, reads_features=atlas.reads_features)


def async_table(lessons: list[AsyncLesson]) -> str:
    """Markdown: per prompt, drafting's share of a step and the async bound, on both curves."""
    lines = ["| suite | drafting share (host) | async bound (host) | drafting share (H100 graphs) "
             "| async bound (H100 graphs) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for x in lessons:
        cells = []
        for b in (x.host, x.gpu):
            cells += [f"{100 * b.draft_s / b.sync_s:.0f} %" if b.sync_s else "–", f"{b.gain:.2f}x"]
        lines.append(f"| {x.suite} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
