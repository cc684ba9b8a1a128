"""`python -m talon.bench`: Talon against autoregressive decoding and Hugging Face's assisted
generation, on the Spec-Bench suites, with a losslessness check on every output.

Every method runs on the same models and the same chat-templated prompt ids (``encode_prompt``),
**interleaved per prompt**: for each prompt every method runs once, in an order rotated from one
prompt to the next, so machine drift (other jobs, thermal state) hits every method alike.

Measures, per suite and method (and over all suites, suite ``"all"``):

* **MAT**, tokens committed per target forward. Talon methods: committed tokens / verification
  steps (the prefill, which commits nothing, is not a step). HF methods: new tokens / target
  forwards counted with a forward hook (there the prefill forward yields the first token).
  Autoregressive decoding has MAT 1 either way.
* **tokens/s** and **speedup vs ar**: ar's wall time over the method's, same prompts, same run.
* **time split** (Talon methods): draft, verify and per-step other time from the step traces;
  ``setup_s`` is the rest of the wall time (prompt prefill, drafter reset, per-run setup).
* **lossless**: every token of every output is checked. Each output is teacher-forced through
  the target (one forward over prompt + output, float32 when the model can be upcast); at each
  position the method's token must be the target's argmax given the method's own prefix, or
  within ``tie_tol`` of the best logit (a *near-tie*: numerical noise decided an argmax);
  anything else is a *mismatch*, as is stopping early or going on after EOS. A mismatch fails
  the run for Talon methods and is only reported for HF methods. ``hf-greedy``
  (``generate(do_sample=False)``) is checked the same way: an independent greedy reference.

The package reads in pipeline order: ``options`` (what a run is asked to do), ``runners`` (one
per method), ``judge`` (losslessness), ``env`` (the machine and versions), ``loop`` (the
interleaved loop), ``results`` (rows and aggregation), ``report`` and ``charts`` (what is
written). The prompts come from ``talon.specbench``; the command line is ``talon.bench.command``
(``__main__`` runs it).
"""

from talon.bench.charts import speedup_figure, sweep_figure, time_split_figure
from talon.bench.env import BenchEnv
from talon.bench.judge import (
    Mismatch,
    OutputCheck,
    TieJudge,
    TokenCheck,
    default_tie_tol,
    first_divergence,
    tie_tolerance,
)
from talon.bench.loop import run_bench
from talon.bench.options import (
    ALL_SUITES_ROW,
    DEFAULT_LIMIT,
    DEFAULT_MAX_NEW_TOKENS,
    EQUAL_BUDGET,
    METHODS,
    SWEEP_METHODS,
    BenchConfig,
    BenchError,
    SweepCell,
    SweepConfig,
)
from talon.bench.report import markdown, speed_table, write_report
from talon.bench.results import BenchReport, ResultRow, TimeSplit, aggregate
from talon.bench.runners import (
    HfRunner,
    MethodSpec,
    Outcome,
    Runner,
    TalonRunner,
    build_runners,
    sweep_runners,
    talon_variant,
)
from talon.specbench import ALL_SUITES, SPECBENCH_SUITES, Prompt, SuiteError, default_data_dir, load_prompts

__all__ = [
    "ALL_SUITES", "ALL_SUITES_ROW", "DEFAULT_LIMIT", "DEFAULT_MAX_NEW_TOKENS", "EQUAL_BUDGET", "METHODS",
    "SPECBENCH_SUITES", "SWEEP_METHODS", "SuiteError", "BenchConfig", "BenchEnv", "BenchError", "BenchReport",
    "HfRunner", "MethodSpec", "Mismatch", "Outcome", "OutputCheck", "Prompt", "ResultRow", "Runner", "SweepCell",
    "SweepConfig",
    "TalonRunner", "TieJudge", "TimeSplit", "TokenCheck", "aggregate", "build_runners", "default_data_dir",
    "default_tie_tol", "first_divergence", "load_prompts", "markdown", "run_bench",
    "speed_table", "speedup_figure", "sweep_figure", "sweep_runners", "talon_variant", "tie_tolerance",
    "time_split_figure", "write_report",
]
