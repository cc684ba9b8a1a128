"""The GPU path, proven without downloads: random-weight draft/target pairs at the shapes of each
GPU preset, run through every check that matters on a CUDA device.

    python scripts/gpu_check.py                 # on a CUDA device, the presets' real shapes
    python scripts/gpu_check.py --tiny          # the same checks, shrunk, on the CPU (the test suite)
    python scripts/gpu_check.py --out report.json --pairs qwen2.5-7b

Checks per pair, each on its own (an exception fails that check only), each run with only the
models it names alive, and each skipped, with the numbers, when ``estimate_pair`` says those
models would not fit the device:

* lossless float32: greedy output equals ``generate(do_sample=False)`` (TF32 off) for every
  drafter and tree mode, async on and off;
* sampling: the first token of sampled decoding (model drafter) over many seeds is distributed as
  the target's own softmax (chi-square);
* async drafting against sync: the same tokens on the preset's pair and on the draft-sized
  target drafting for itself, some pre-drafts reused there, and on CUDA more than
  ``ASYNC_HIDDEN_MIN`` of the preset pair's drafting hidden behind verification (on the CPU
  the share is recorded only);
* a draft that *is* the target (draft-sized, float32) gets its deep paths accepted in full, and
  noisy copies of it part of them, the output always the target's;
* bf16: seeded sampling repeats; the cost probe's curves and the tree sizes the planner then
  chooses; every greedy token the target's choice (the benchmark's judge, on the target upcast in
  place, so no second copy);
* memory at the server's largest settings (the longest prompt, the most new tokens, the largest
  tree): the guard passes the GPU the preset names and refuses one a byte too small; on CUDA the
  peak of the pair alone against the estimate and the device, on the CPU the weights and KV
  caches against the estimate.

Once per run: a pair loaded by the real Hub loader from an offline snapshot in the Hugging Face
cache layout; the app's own loader switching presets (the old pair released before the guard reads
the free memory, only the new pair held after, a failed load falling back to it); the app started
in ZeroGPU mode by the real ``spaces`` package (a CUDA build of torch only; skipped elsewhere); the
app started on a random-weight pair, one ``/generate`` through gradio_client.

Prints one JSON report (also written to ``--out``) and a short table; exits 1 on any failure. A
skipped check is listed as such and is not a pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from talon.models.memory import GIB  # noqa: E402
from gpu_pairs import (  # noqa: E402
    BF16,
    F32,
    FIT_TOKENS,
    Check,
    Outcome,
    PairModels,
    PairRun,
    PairSpec,
    Role,
    Skipped,
    device_capacity,
    pair_specs,
)
from gpu_pair_checks import (  # noqa: E402
    async_matches_sync,
    bf16_judge,
    cost_model,
    draft_is_noisy_target,
    draft_is_target,
    lossless_fp32,
    memory_at_limits,
    sampling_distribution,
    seeded_sampling,
)
from gpu_run_checks import (  # noqa: E402
    app_check,
    hub_snapshot_check,
    preset_switch_check,
    zerogpu_start_check,
)


# ------------------------------------------------------------------------------------ running


@dataclass(frozen=True)
class PairCheck:
    """One check of a pair: ``needs`` the models alive while it runs (all others are dropped
    first); ``peak`` what it holds at its peak when that is more (the fit test takes the larger)."""

    name: str
    fn: Callable[[PairRun], Outcome]
    needs: tuple[Role, ...]
    peak: tuple[Role, ...] = ()


FP32_PAIR = (("target", F32), ("draft", F32))
BF16_PAIR = (("target", BF16), ("draft", BF16))
PAIR_CHECKS: list[PairCheck] = [
    PairCheck("lossless float32 (every drafter x tree x async)", lossless_fp32, FP32_PAIR),
    PairCheck("sampling: first token distributed as the target's softmax", sampling_distribution,
              FP32_PAIR),  # the draft is not used, but the next check needs it: kept, not rebuilt
    PairCheck("async drafting: same tokens as sync, pre-drafts reused, drafting hidden", async_matches_sync,
              FP32_PAIR + (("small-target", F32),)),
    PairCheck("draft is the target: deep trees, full paths", draft_is_target, (("small-target", F32),)),
    PairCheck("draft is the target + noise: partial acceptance", draft_is_noisy_target, (("small-target", F32),),
              peak=(("small-target", F32),) * 2),
    PairCheck("seeded sampling repeats", seeded_sampling, BF16_PAIR),
    PairCheck("cost model on this device", cost_model, BF16_PAIR),
    PairCheck("bf16: every token the target's choice (judge, target upcast in place)", bf16_judge, BF16_PAIR,
              peak=(("target", F32),)),
    PairCheck("memory at the server's largest settings", memory_at_limits, ()),  # fits itself, at the limits
]


def guarded(name: str, fn: Callable[[], Outcome]) -> Check:
    """A check that raises is that check failed (with the error), not a crashed report."""
    start = time.perf_counter()
    try:
        ok, detail = fn()
        check = Check(name, bool(ok), detail)
    except Skipped as why:
        check = Check(name, False, {"skipped": str(why)}, skipped=True)
    except Exception as err:  # noqa: BLE001 - every failure belongs in the report
        check = Check(name, False, {"error": f"{type(err).__name__}: {err}"})
    check.seconds = round(time.perf_counter() - start, 2)
    return check


def run_pair_check(check: PairCheck, ctx: PairRun) -> Check:
    """``check`` with only the models it names alive; skipped, before anything is allocated,
    when ``estimate_pair`` says they would not fit the device."""

    def body() -> Outcome:
        need = max(ctx.models.bytes_needed(check.needs, FIT_TOKENS), ctx.models.bytes_needed(check.peak, FIT_TOKENS))
        have = device_capacity(ctx.device)
        if need > have:
            raise Skipped(f"needs {need / GIB:.1f} GiB, the device has {have / GIB:.1f} GiB")
        ctx.models.keep(check.needs)
        return check.fn(ctx)

    return guarded(check.name, body)


def run_pair(spec: PairSpec, device: torch.device, tiny: bool) -> list[Check]:
    ctx = PairRun(spec, device, tiny, PairModels(spec, device))
    try:
        return [run_pair_check(check, ctx) for check in PAIR_CHECKS]
    finally:
        ctx.models.keep(())


def once_per_run(spec: PairSpec, device: torch.device, with_app: bool) -> list[tuple[str, Callable[[], Outcome]]]:
    """The checks run once, on the first pair: one line each."""
    checks = [("Hub loader: offline snapshot in the HF cache layout", lambda: hub_snapshot_check(spec, device))]
    if with_app:
        checks.append(("app /generate on this device", lambda: app_check(spec, device)))
    checks.append(("preset switch: release, guard, fall back", lambda: preset_switch_check(spec, device)))
    checks.append(("ZeroGPU-mode start (the real spaces package)", lambda: zerogpu_start_check(spec, device)))
    return checks


def report_rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(pair key or "(once)", check) for every check in the report."""
    pairs = [(key, c) for key, p in report["pairs"].items() for c in p["checks"]]
    return pairs + [("(once)", c) for c in report["once"]]


def verdict(report: dict[str, Any]) -> None:
    """``ok``: no check failed and one passed at least; ``failed`` and ``skipped`` list them."""
    rows = report_rows(report)
    report["failed"] = [f"{key}: {c['name']}" for key, c in rows if not c["ok"] and not c["skipped"]]
    report["skipped"] = [f"{key}: {c['name']} ({c['detail']['skipped']})" for key, c in rows if c["skipped"]]
    report["passed"] = sum(c["ok"] for _, c in rows)
    report["ok"] = not report["failed"] and report["passed"] > 0


def run_checks(tiny: bool, only: set[str], with_app: bool = True) -> dict[str, Any]:
    device = torch.device("cuda" if torch.cuda.is_available() and not tiny else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    specs = pair_specs(tiny, only)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "tiny": tiny, "torch": torch.__version__, "pairs": {}, "once": []}
    for spec in specs:
        checks = run_pair(spec, device, tiny)
        report["pairs"][spec.key] = {"target_vocab": spec.target.vocab, "draft_vocab": spec.draft.vocab,
                                     "checks": [dataclasses.asdict(c) for c in checks]}
    if specs:
        once = once_per_run(specs[0], device, with_app)
        report["once"] = [dataclasses.asdict(guarded(name, fn)) for name, fn in once]
    verdict(report)
    return report


def table(report: dict[str, Any]) -> str:
    lines = [f"device: {report['device']} (tiny={report['tiny']})", "| pair | check | ok | s |",
             "| --- | --- | --- | --- |"]
    for key, c in report_rows(report):
        state = "skipped" if c["skipped"] else "yes" if c["ok"] else "NO"
        lines.append(f"| {key} | {c['name']} | {state} | {c['seconds']} |")
    lines += [f"SKIPPED (not a pass): {s}" for s in report["skipped"]]
    lines += [f"FAILED: {f}" for f in report["failed"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="shrunk shapes on the CPU, in minutes (the test suite runs this)")
    p.add_argument("--pairs", default="", help="comma list of preset keys (default: every GPU preset)")
    p.add_argument("--no-app", action="store_true", help="skip starting the app")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    args = p.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        print("no CUDA device: run with --tiny for the CPU-sized checks", file=sys.stderr)
        return 2
    report = run_checks(args.tiny, {k for k in args.pairs.split(",") if k}, with_app=not args.no_app)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text)
    print(table(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
