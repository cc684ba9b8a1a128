"""The GPU path, proven without downloads: random-weight draft/target pairs at the shapes of each
GPU preset, run through every check that matters on a CUDA device.

    python -m talon.gpucheck                 # on a CUDA device, the presets' real shapes
    python -m talon.gpucheck --tiny          # the same checks, shrunk, on the CPU (the test suite)
    python -m talon.gpucheck --out report.json --pairs qwen2.5-7b

Checks per pair, each on its own (an exception fails that check only), each run with only the
models it names alive, and each skipped, with the numbers, when ``estimate_pair`` says those
models would not fit the device:

* lossless float32: greedy output equals ``generate(do_sample=False)`` (TF32 off) for every
  drafter and tree mode, async on and off, on the default path (CUDA graphs unfolded on CUDA);
  and on the other paths (``OTHER_PATHS``: the fold switched, the dynamic cache, the eager static
  step, the tree grown on the device). Every configuration must accept drafts at depth (mean
  accepted tokens at least ``MAT_FLOOR``; a step that accepts nothing never reads a tree
  position or mask) or it fails; ``--plant position|mask`` runs them with a bug planted in the
  verification and passes only if every one catches it;
* sampling: the first token of sampled decoding (model drafter) over many seeds is distributed as
  the target's own softmax (chi-square);
* async drafting against sync: the same tokens on the preset's pair and on the draft-sized
  target drafting for itself, some pre-drafts reused there (the share of drafting hidden behind
  verification is recorded: a question of speed, for ``talon/gpucheck/speed.py``);
* a draft that *is* the target (draft-sized, float32) gets its deep paths accepted in full, and
  noisy copies of it part of them, the output always the target's;
* bf16: seeded sampling repeats; the planner grows large trees on a flat cost curve and small
  ones on a steep one (the probed curves and their trees recorded); every greedy token the
  target's choice (the benchmark's judge, on the target upcast in place, so no second copy);
* memory at the server's largest settings (the longest prompt, the most new tokens, the largest
  tree): the guard passes the GPU the preset names and refuses one a byte too small; on CUDA the
  peak of the pair alone against the estimate and the device, on the CPU the weights and KV
  caches against the estimate.

Once per run: a pair loaded by the real Hub loader from an offline snapshot in the Hugging Face
cache layout; the app's own loader switching presets (the old pair released before the guard reads
the free memory, only the new pair held after, a failed load falling back to it); the app started
in ZeroGPU mode by the real ``spaces`` package (a CUDA build of torch only; skipped elsewhere); the
app started on a random-weight pair, one ``/generate`` through gradio_client.

Every model is built by ``check_model`` (conditioned, with a planted bigram chain) and gated
before each check that uses it: a model past the gate's bounds makes the check *invalid* (the
numbers in its detail), neither pass nor fail. The once-per-run checks come first, then the
pair's, in the order a Space needs them; ``--stream FILE`` writes each as it ends, and
``--deadline-s`` starts none past the deadline.

Prints one JSON report (also written to ``--out``) and a short table; exits 1 on any failure or
invalid check. A skipped check is listed as such and is not a pass.
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

from talon.gpucheck.check_model import PLANTS, planted
from talon.gpucheck.head import head_forward
from talon.gpucheck.pair_checks import (
    async_matches_sync,
    bf16_judge,
    cost_model,
    draft_is_noisy_target,
    draft_is_target,
    lossless_fp32,
    memory_at_limits,
    sampling_distribution,
    seeded_sampling,
    static_step_lossless,
)
from talon.gpucheck.pairs import (
    BF16,
    F32,
    FIT_TOKENS,
    Check,
    CheckOutcome,
    Invalid,
    PairModels,
    PairRun,
    PairSpec,
    Role,
    Skipped,
    device_capacity,
    pair_specs,
)
from talon.gpucheck.run_checks import (
    app_check,
    hub_snapshot_check,
    preset_switch_check,
    zerogpu_start_check,
)
from talon.models.memory import GIB

# ------------------------------------------------------------------------------------ running


@dataclass(frozen=True)
class PairCheck:
    """One check of a pair: ``needs`` the models alive while it runs (all others are dropped
    first, and each is gated before the check runs); ``peak`` what it holds at its peak when that
    is more (the fit test takes the larger)."""

    key: str  # what ``--checks`` names it by, exactly
    name: str
    fn: Callable[[PairRun], CheckOutcome]
    needs: tuple[Role, ...]
    peak: tuple[Role, ...] = ()
    slots: tuple[str, ...] = ("model",)  # the pairs it runs on (PairSpec.slot): a draft model's, a head's, an MTP's


FP32_PAIR = (("target", F32), ("draft", F32))
BF16_PAIR = (("target", BF16), ("draft", BF16))
# What a Space meets first comes first: losslessness, async, memory and sampling on the default
# step, then the other steps, the bf16 checks, then the deep-tree ones (each is reported the moment it
# ends: see ``Stream``).
PAIR_CHECKS: list[PairCheck] = [
    PairCheck("lossless", "lossless float32 (every drafter x tree x async)", lossless_fp32, FP32_PAIR,
              slots=("model", "head", "mtp")),
    PairCheck("async", "async drafting: same tokens as sync, pre-drafts reused", async_matches_sync,
              FP32_PAIR + (("small-target", F32),)),
    PairCheck("memory", "memory at the server's largest settings", memory_at_limits, ()),  # fits itself, at the limits
    # the draft is not used, but the next check needs it: kept, not rebuilt
    PairCheck("sampling", "sampling: first token distributed as the target's softmax",
              sampling_distribution, FP32_PAIR, slots=("model", "mtp")),
    PairCheck("steps", "the other steps (dynamic, static, graphs with the tree grown on the device; graphs are the "
              "default on CUDA): greedy equals generate()",
              static_step_lossless, FP32_PAIR, slots=("model", "head", "mtp")),
    PairCheck("head", "the EAGLE-3 head's forward timed at the preset's width (bf16)", head_forward,
              (("target", F32), ("draft", F32)), slots=("head",)),
    PairCheck("bf16", "bf16: every token the target's choice (judge, target upcast in place)", bf16_judge, BF16_PAIR,
              peak=(("target", F32),)),
    PairCheck("seeded", "seeded sampling repeats", seeded_sampling, BF16_PAIR),
    PairCheck("costs", "cost model on this device", cost_model, BF16_PAIR),
    PairCheck("deep", "draft is the target: deep trees, full paths", draft_is_target, (("small-target", F32),)),
    PairCheck("noise", "draft is the target + noise: partial acceptance", draft_is_noisy_target,
              (("small-target", F32),),
              peak=(("small-target", F32),) * 2),
]


class Stream:
    """Where each check's result goes the moment it ends: one JSON line per check, flushed, so a
    run cut off by a time limit keeps every check but the one in flight. ``deadline``: a
    ``clock()`` reading after which no new check starts (each is reported skipped, out of time)."""

    def __init__(self, path: Path | None = None, deadline: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.deadline, self.clock = path, deadline, clock
        if path is not None:
            path.write_text("", encoding="utf-8")

    def out_of_time(self) -> bool:
        return self.deadline is not None and self.clock() > self.deadline

    def write(self, where: str, check: Check) -> None:
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"pair": where, **dataclasses.asdict(check)}) + "\n")


def guarded(name: str, fn: Callable[[], CheckOutcome], stream: Stream | None = None, where: str = "(once)") -> Check:
    """A check that raises is that check failed (with the error), not a crashed report. A check
    whose model fails its gate is invalid; one that cannot run here, or not before the deadline,
    is skipped."""
    stream = stream or Stream()
    start = time.perf_counter()
    try:
        if stream.out_of_time():
            raise Skipped("out of time: the run's deadline passed before this check could start")
        ok, detail = fn()
        check = Check(name, bool(ok), detail)
    except Skipped as why:
        check = Check(name, False, {"skipped": str(why)}, skipped=True)
    except Invalid as why:
        check = Check(name, False, {"invalid": str(why), **why.detail}, invalid=True)
    except Exception as err:  # noqa: BLE001 - every failure belongs in the report
        check = Check(name, False, {"error": f"{type(err).__name__}: {err}"})
    check.seconds = round(time.perf_counter() - start, 2)
    stream.write(where, check)
    return check


def gate_models(ctx: PairRun, roles: tuple[Role, ...]) -> dict[str, Any]:
    """Gate every model ``roles`` names (built if need be); Invalid, with the numbers, if one fails."""
    gates = {f"{role}/{str(dtype).removeprefix('torch.')}": ctx.models.gate(role, dtype) for role, dtype in roles}
    detail = {"conditioning": {k: g.as_detail() for k, g in gates.items()}}
    bad = [f"{k}: {g.why}" for k, g in gates.items() if not g.valid]
    if bad:
        raise Invalid("the check model is not well conditioned, so this check proves nothing: " + "; ".join(bad),
                      detail)
    return detail


def run_pair_check(check: PairCheck, ctx: PairRun, stream: Stream | None = None) -> Check:
    """``check`` with only the models it names alive, each gated first; skipped, before anything
    is allocated, when ``estimate_pair`` says they would not fit the device."""

    # the target's MTP layer drafts: no draft model is held
    needs = tuple(r for r in check.needs if ctx.spec.slot != "mtp" or r[0] == "target")

    def body() -> CheckOutcome:
        need = max(ctx.models.bytes_needed(needs, FIT_TOKENS), ctx.models.bytes_needed(check.peak, FIT_TOKENS))
        have = device_capacity(ctx.device)
        if need > have:
            raise Skipped(f"needs {need / GIB:.1f} GiB, the device has {have / GIB:.1f} GiB")
        ctx.models.keep(needs)
        gates = gate_models(ctx, needs)
        ok, detail = check.fn(ctx)
        return ok, {**detail, **gates}

    return guarded(check.name, body, stream, ctx.spec.key)


def run_pair(spec: PairSpec, device: torch.device, tiny: bool, stream: Stream | None = None,
             checks: list[PairCheck] | None = None) -> list[Check]:
    """``checks``: the pair checks to run (every one, ``PAIR_CHECKS``, by default)."""
    ctx = PairRun(spec, device, tiny, PairModels(spec, device, 24 if tiny else 64))
    try:
        return [run_pair_check(check, ctx, stream) for check in (PAIR_CHECKS if checks is None else checks)
                if spec.slot in check.slots]
    finally:
        ctx.models.keep(())


def once_per_run(spec: PairSpec, device: torch.device, with_app: bool) -> list[tuple[str, Callable[[], CheckOutcome]]]:
    """The checks run once, on the first pair, before the pairs' checks (a Space needs them
    first): one line each."""
    checks = []
    if with_app:
        checks.append(("app /generate on this device", lambda: app_check(spec, device)))
    checks.append(("ZeroGPU-mode start (the real spaces package)", lambda: zerogpu_start_check(spec, device)))
    checks.append(("preset switch: release, guard, fall back", lambda: preset_switch_check(spec, device)))
    checks.append(("Hub loader: offline snapshot in the HF cache layout", lambda: hub_snapshot_check(spec, device)))
    return checks


def report_rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(pair key or "(once)", check) for every check in the report."""
    pairs = [(key, c) for key, p in report["pairs"].items() for c in p["checks"]]
    return pairs + [("(once)", c) for c in report["once"]]


def verdict(report: dict[str, Any]) -> None:
    """``ok``: no check failed or invalid and one passed at least; ``failed``, ``invalid`` and
    ``skipped`` list them."""
    rows = report_rows(report)
    report["failed"] = [f"{key}: {c['name']}" for key, c in rows
                        if not c["ok"] and not c["skipped"] and not c.get("invalid")]
    report["invalid"] = [f"{key}: {c['name']} ({c['detail']['invalid']})" for key, c in rows if c.get("invalid")]
    report["skipped"] = [f"{key}: {c['name']} ({c['detail']['skipped']})" for key, c in rows if c["skipped"]]
    report["passed"] = sum(c["ok"] for _, c in rows)
    report["ok"] = not report["failed"] and not report["invalid"] and report["passed"] > 0


def run_checks(tiny: bool, only: set[str], with_app: bool = True, stream: Stream | None = None,
               once: bool = True, tiny_on_cuda: bool = False, checks: list[PairCheck] | None = None) -> dict[str, Any]:
    """``tiny_on_cuda``: the tiny shapes on the CUDA device (a quick pass of the device's paths);
    ``checks``: the pair checks to run (every one by default)."""
    device = torch.device("cuda" if torch.cuda.is_available() and (not tiny or tiny_on_cuda) else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    specs = pair_specs(tiny, only)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "tiny": tiny, "torch": torch.__version__, "pairs": {}, "once": []}
    if specs and once:
        report["once"] = [dataclasses.asdict(guarded(name, fn, stream))
                          for name, fn in once_per_run(specs[0], device, with_app)]
    for spec in specs:
        done = run_pair(spec, device, tiny, stream, checks)
        report["pairs"][spec.key] = {"target_vocab": spec.target.vocab, "draft_vocab": spec.draft.vocab,
                                     "checks": [dataclasses.asdict(c) for c in done]}
    verdict(report)
    return report


def check_table(report: dict[str, Any]) -> str:
    lines = [f"device: {report['device']} (tiny={report['tiny']})", "| pair | check | ok | s |",
             "| --- | --- | --- | --- |"]
    for key, c in report_rows(report):
        state = "skipped" if c["skipped"] else "INVALID" if c.get("invalid") else "yes" if c["ok"] else "NO"
        lines.append(f"| {key} | {c['name']} | {state} | {c['seconds']} |")
    lines += [f"SKIPPED (not a pass): {s}" for s in report["skipped"]]
    lines += [f"INVALID (neither pass nor fail): {s}" for s in report["invalid"]]
    lines += [f"FAILED: {f}" for f in report["failed"]]
    if "planted" in report:
        planted_bug = report["planted"]
        lines.append(f"PLANTED {planted_bug['bug']} bug: configurations that caught it, by pair: "
                     f"{planted_bug['caught_by']}; missed by {planted_bug['missed'] or 'no path'}")
        for key, rows in planted_bug.get("paths", {}).items():
            for path, row in rows.items():
                lines.append(f"  {key} {path}: caught by {len(row['caught'])} of {len(row['run'])} "
                             f"({', '.join(row['caught']) or 'none'}); cannot express it: "
                             f"{', '.join(sorted(row['cannot'])) or 'none'}")
    return "\n".join(lines)


def choose_checks(keys: str, after: Path | None) -> list[PairCheck]:
    """The pair checks to run: those ``keys`` names (comma list, exact), less those that passed
    in the ``after`` stream (a check skipped there and passed in a later call counts as passed;
    one that failed or was invalid for any pair runs again)."""
    chosen = list(PAIR_CHECKS)
    if keys:
        wanted = [k for k in keys.split(",") if k]
        unknown = sorted(set(wanted) - {c.key for c in PAIR_CHECKS})
        if unknown:
            raise ValueError(f"unknown check key(s) {', '.join(unknown)}: the keys are "
                             + ", ".join(c.key for c in PAIR_CHECKS))
        chosen = [c for c in chosen if c.key in wanted]
    if after is not None:
        lines = [json.loads(line) for line in after.read_text(encoding="utf-8").splitlines() if line.strip()]
        failed = {x["name"] for x in lines if not x.get("ok") and not x.get("skipped")}
        passed = {x["name"] for x in lines if x.get("ok")} - failed
        chosen = [c for c in chosen if c.name not in passed]
    return chosen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true",
                   help="shrunk shapes on the CPU, in minutes (the test suite runs this)")
    p.add_argument("--pairs", default="", help="comma list of preset keys (default: every GPU preset)")
    p.add_argument("--no-app", action="store_true", help="skip starting the app")
    p.add_argument("--checks", default="", help="comma list of check keys (" + ", ".join(c.key for c in PAIR_CHECKS)
                   + "): run only those pair checks (and no once-per-run check)")
    p.add_argument("--after", type=Path, default=None,
                   help="a --stream file of an earlier run: run only the pair checks that did not pass there")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    p.add_argument("--stream", type=Path, default=None,
                   help="write one JSON line per check here as each ends (a time limit loses only the check in flight)")
    p.add_argument("--tiny-on-cuda", action="store_true", help="with --tiny: the tiny shapes on the CUDA device")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="start no check after this many seconds (the rest are reported skipped, out of time)")
    p.add_argument("--plant", choices=sorted(PLANTS), default=None,
                   help="run with a bug planted in the verification (tree positions or mask): the run passes "
                   "(exit 0) only if every lossless check it runs catches it")
    args = p.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        print("no CUDA device: run with --tiny for the CPU-sized checks", file=sys.stderr)
        return 2
    deadline = None if args.deadline_s is None else time.monotonic() + args.deadline_s
    try:
        chosen = choose_checks(args.checks, args.after)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    once = not args.checks and args.after is None and args.plant is None
    with planted(args.plant):
        report = run_checks(args.tiny, {k for k in args.pairs.split(",") if k}, with_app=not args.no_app,
                            stream=Stream(args.stream, deadline), once=once, tiny_on_cuda=args.tiny_on_cuda,
                            checks=chosen)
    if args.plant is not None:
        caught_planted(report, args.plant)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    print(text)
    print(check_table(report))
    return 0 if report["ok"] else 1


LOSSLESS_KEYS = ("lossless", "steps")


def unexpressed(bug: str, config: str) -> str:
    """Why a configuration (``drafter/mode[/async]``) cannot show ``bug``, or "" where it can."""
    drafter, mode = config.split("/")[:2]
    if drafter == "none":
        return "drafts nothing: no tree to misplace"
    if bug == "mask" and mode == "chain":
        return "a chain has no siblings: a mask that shows a node its elder siblings changes nothing"
    return ""


def plant_paths(report: dict[str, Any], bug: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Per pair, per step path (the lossless check's default path, and each of the other paths the
    steps check runs): the configurations run, those whose tokens differed from ``generate()``
    (caught), those that could not express ``bug`` (with why), and whether the path caught it in
    a configuration that can."""
    names = {c.name: c.key for c in PAIR_CHECKS if c.key in LOSSLESS_KEYS}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, check in report_rows(report):
        if check["name"] not in names or check["skipped"]:
            continue
        detail, paths = check["detail"], out.setdefault(key, {})
        failures = set(detail.get("failures", ()))
        for run in detail.get("mat", {}):
            path, config = ((detail.get("forward", "default"), run) if names[check["name"]] == "lossless"
                            else tuple(run.split("/", 1)))
            row = paths.setdefault(path, {"run": [], "caught": [], "cannot": {}})
            row["run"].append(config)
            if run in failures:
                row["caught"].append(config)
            elif unexpressed(bug, config):
                row["cannot"][config] = unexpressed(bug, config)
        for row in paths.values():
            row["ok"] = any(not unexpressed(bug, c) for c in row["caught"])
    return out


def caught_planted(report: dict[str, Any], bug: str) -> None:
    """With a bug planted, the run is ``ok`` when, on every pair, every step path its lossless
    checks ran saw a token differ from ``generate()`` (not an error, not a floor) in at least one
    configuration whose tree can express the bug: the check's teeth, proven on each path."""
    paths = plant_paths(report, bug)
    missed = sorted(f"{key}: {path}" for key, rows in paths.items() for path, row in rows.items() if not row["ok"])
    missed += sorted(key for key, rows in paths.items() if not rows)  # checks that ran nothing (errors)
    caught_by = {key: sum(len(r["caught"]) for r in rows.values()) for key, rows in paths.items()}
    report["planted"] = {"bug": bug, "pairs": len(paths), "missed": missed, "paths": paths, "caught_by": caught_by}
    report["ok"] = bool(paths) and not missed and not report["invalid"]


if __name__ == "__main__":
    sys.exit(main())
