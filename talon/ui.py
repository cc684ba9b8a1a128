"""The Gradio app: layout, then wiring. Figures come from ``talon.figures`` (pure functions of
traces); models come from one cached loader; per-session data lives in ``gr.State``.

Tabs: Decode (one run, streamed, with a step slider and a step-through mode), Compare (two
configurations on one prompt), Threshold explorer (mu x N heatmaps from a small sweep or a
``talon.bench --sweep`` results.json). A run's trace downloads as JSON and replays with no model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import html
import json
import logging
import math
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from talon import figures as F
from talon.config import DRAFTER_KINDS, TREE_MODES, ConfigError, RetrievalConfig, RunConfig, SamplingConfig, TreeConfig
from talon.decode import Engine, PromptError, Run
from talon.examples import DEFAULT_PRESET, Example, ModelPreset, available_presets, load_examples, startup_preset
from talon.models import ModelLoadError, load_pair
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, Settings
from talon.trace import TRACE_FORMAT, RunSummary, StepTrace, dump_trace, summarize_steps

try:  # Hugging Face ZeroGPU: installed on Spaces, absent elsewhere (see on_gpu)
    import spaces
except ImportError:
    spaces = None

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 20 * 1024 * 1024  # trace and results.json uploads
MAX_TRACE_STEPS = 100_000
MAX_TREE_NODES = 4096
# Streaming throttle: the browser re-draws every figure it receives, which on a small laptop
# costs more than a decoding step. Text, tree and summary stream at most twice a second; the
# other figures every few seconds, and all of them at the end.
LIGHT_UPDATE_S = 0.5
FULL_UPDATE_S = 3.0
MAX_SWEEP_CELLS = 30
TRACE_DIR_NAME = "talon-traces"
TRACE_MAX_AGE_S = 3600
MODEL_CONCURRENCY_ID = "model"
# ZeroGPU reservation per run: loading and prefill, then a generous per-token cost, capped.
GPU_BASE_S = 20
GPU_PER_TOKEN_S = 0.1
GPU_MAX_S = 300
UI_DRAFTERS = tuple(d for d in DRAFTER_KINDS if d != "none")


# ---------------------------------------------------------------------------------------------
# Models: one cached loader
# ---------------------------------------------------------------------------------------------

_LOAD_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _cached_engine(target: str, draft: str, dtype: str, device: str, allow_remote_code: bool, cache_dir: str) -> Engine:
    target_lm, draft_lm = load_pair(target, draft, dtype, device, allow_remote_code, cache_dir)
    return Engine(target_lm, draft_lm)


def load_engine(settings: Settings, preset: ModelPreset) -> Engine:
    """The engine for a preset, loaded once and kept (one pair at a time; loads are serialised).
    TALON_DTYPE, when it names a dtype, wins over the preset's."""
    target, draft = preset.target or settings.target, preset.draft or settings.draft
    dtype = settings.dtype if settings.dtype != "auto" else preset.dtype or "auto"
    with _LOAD_LOCK:
        return _cached_engine(target, draft, dtype, settings.device, settings.allow_remote_code, str(settings.cache_dir))


def warm_up(settings: Settings) -> None:
    """Load the start-up pair now (call from a background thread at start); errors are logged
    here and shown to the user on their first run."""
    try:
        load_engine(settings, find_preset(settings, initial_preset(settings)))
    except (ModelLoadError, ConfigError, OSError, torch.cuda.OutOfMemoryError) as error:
        log.error("could not pre-load the models: %s", error)
        release_memory()


def cuda_available() -> bool:
    return torch.cuda.is_available()


def presets(settings: Settings) -> list[ModelPreset]:
    """The presets this server offers: the GPU pairs only with CUDA and TALON_DEVICE not cpu."""
    return available_presets(cuda_available() and not settings.device.startswith("cpu"))


def initial_preset(settings: Settings) -> str:
    """The preset selected (and loaded) at start; see ``talon.examples.startup_preset``."""
    gpu = any(p.needs_cuda for p in presets(settings))
    return startup_preset(gpu, (settings.target, settings.draft) != (EMBEDDED_TARGET, EMBEDDED_DRAFT))


def find_preset(settings: Settings, key: str) -> ModelPreset:
    offered = presets(settings)
    for preset in offered:
        if preset.key == key:
            return preset
    raise ConfigError(f"model preset must be one of {[p.key for p in offered]} on this server, got {key!r}")


def queue_limits(settings: Settings) -> tuple[int, int]:
    """(default_concurrency_limit, max_size) for the queue."""
    return settings.queue_concurrency, settings.queue_max_size


# ---------------------------------------------------------------------------------------------
# Controls -> validated RunConfig
# ---------------------------------------------------------------------------------------------


def _as_int(name: str, value: Any) -> int:
    """An integer from a UI/API value (sliders send floats); refuses 2.5, True, 'x'."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    return int(value)


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Controls:
    """The values of the run controls, as the API and the UI send them (all have defaults, so an
    API call may pass the prompt alone)."""

    preset: str = DEFAULT_PRESET
    drafter: str = RunConfig.drafter
    tree_mode: str = TreeConfig.mode
    budget: float = TreeConfig.budget
    root_k: float = TreeConfig.root_k
    top_k: float = TreeConfig.top_k
    mu: float = TreeConfig.mu
    max_depth: float = TreeConfig.max_depth
    min_conf: float = TreeConfig.min_conf
    retrieval_threshold: float = RetrievalConfig.graft_threshold
    temperature: float = SamplingConfig.temperature
    top_p: float = SamplingConfig.top_p
    seed: float = SamplingConfig.seed
    max_new_tokens: float = RunConfig.max_new_tokens
    async_draft: bool = RunConfig.async_draft

    def run_config(self, max_new_tokens_limit: int) -> RunConfig:
        """The validated RunConfig; raises ConfigError with a message a user can act on."""
        if self.drafter not in UI_DRAFTERS:
            raise ConfigError(f"drafter must be one of {UI_DRAFTERS}, got {self.drafter!r}")
        max_new = _as_int("max_new_tokens", self.max_new_tokens)
        if max_new > max_new_tokens_limit:
            raise ConfigError(f"max_new_tokens must be at most {max_new_tokens_limit} on this server, got {max_new}")
        tree = TreeConfig(
            mode=str(self.tree_mode),  # type: ignore[arg-type]
            budget=_as_int("budget", self.budget),
            root_k=_as_int("root_k", self.root_k),
            top_k=_as_int("top_k", self.top_k),
            mu=_as_float("mu", self.mu),
            max_depth=_as_int("max_depth", self.max_depth),
            min_conf=_as_float("min_conf", self.min_conf),
        )
        sampling = SamplingConfig(
            temperature=_as_float("temperature", self.temperature),
            top_p=_as_float("top_p", self.top_p),
            seed=_as_int("seed", self.seed),
        )
        retrieval = RetrievalConfig(graft_threshold=_as_int("retrieval_threshold", self.retrieval_threshold))
        return RunConfig(
            drafter=self.drafter,  # type: ignore[arg-type]
            tree=tree,
            retrieval=retrieval,
            sampling=sampling,
            max_new_tokens=max_new,
            async_draft=bool(self.async_draft),
        )


def check_prompt(prompt: Any, settings: Settings) -> str:
    """Cheap checks before any model work (the engine checks the token count)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptError("the prompt is empty: type some text, or pick an example")
    max_chars = 16 * settings.max_prompt_tokens
    if len(prompt) > max_chars:
        raise PromptError(f"the prompt has {len(prompt)} characters; this server accepts at most {max_chars}")
    return prompt


def user_error(message: str) -> gr.Error:
    """A gr.Error whose message may quote user input: Gradio renders error messages as HTML."""
    return gr.Error(html.escape(F.clean_text(message), quote=False))


def plan_run(settings: Settings, prompt: Any, controls: Controls, **overrides: Any) -> tuple[ModelPreset, RunConfig]:
    """Validate a request without touching a model (``overrides`` replace RunConfig fields);
    every problem a user can fix becomes a gr.Error with the validator's message."""
    try:
        check_prompt(prompt, settings)
        cfg = controls.run_config(settings.max_new_tokens_limit).replace(**overrides)
        return find_preset(settings, controls.preset), cfg
    except (ConfigError, PromptError) as error:
        raise user_error(str(error)) from error


def open_run(settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig, cancel: threading.Event) -> Run:
    """Load the preset's models (cached) and start a run, before any forward: a model that cannot
    be loaded or a prompt the server refuses becomes a gr.Error that says why."""
    try:
        run = load_engine(settings, preset).run(prompt, cfg, cancel)
    except (ConfigError, PromptError, ModelLoadError) as error:
        raise user_error(str(error)) from error
    if len(run.prompt_ids) > settings.max_prompt_tokens:
        raise gr.Error(
            f"the prompt has {len(run.prompt_ids)} tokens; this server accepts at most {settings.max_prompt_tokens}"
        )
    return run


# ---------------------------------------------------------------------------------------------
# Running on the device: a ZeroGPU reservation per run, recovery from out-of-memory
# ---------------------------------------------------------------------------------------------


def on_gpu(duration: Callable[..., int]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``spaces.GPU(duration=duration)`` where the ``spaces`` package is importable: on ZeroGPU it
    reserves a GPU for each call, for the seconds ``duration`` computes from the call's own
    arguments. Elsewhere the function is returned unchanged."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn if spaces is None else spaces.GPU(duration=duration)(fn)

    return decorate


def gpu_seconds(settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig, cancel_id: str) -> int:
    """GPU seconds to reserve for one run (same arguments as ``decode_on_device``): a base for
    loading and prefill plus a per-token cost of max_new_tokens, capped at GPU_MAX_S."""
    return min(GPU_MAX_S, math.ceil(GPU_BASE_S + GPU_PER_TOKEN_S * cfg.max_new_tokens))


def is_out_of_memory(error: BaseException) -> bool:
    """A device (or host) allocation failure: torch's OutOfMemoryError or a RuntimeError saying so."""
    text = str(error).lower()
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
    )


def release_memory() -> None:
    """Return freed tensors to the device: collect garbage, then empty CUDA's caching allocator."""
    gc.collect()
    if cuda_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def out_of_memory_as_error(cfg: RunConfig) -> Iterator[None]:
    """Turn running out of memory into a gr.Error that says what to shrink, after freeing what the
    failed run held (its frames are cleared, so its caches can go), so the server keeps serving."""
    try:
        yield
    except RuntimeError as error:
        if not is_out_of_memory(error):
            raise
        log.warning("out of memory (budget %d, max_new_tokens %d): %s", cfg.tree.budget, cfg.max_new_tokens, error)
        traceback.clear_frames(error.__traceback__)
        release_memory()
        raise gr.Error(
            f"the device ran out of memory (budget N {cfg.tree.budget}, max new tokens {cfg.max_new_tokens}): "
            "try a smaller budget, fewer new tokens, a shorter prompt or a smaller model pair. "
            "The memory was freed; you can run again."
        ) from None


# cancel_id -> the run's Stop flag. decode_on_device takes the id, not the Event: on ZeroGPU its
# arguments are pickled into a GPU worker process (where the id finds nothing; see DeviceRun).
_CANCELS: dict[str, threading.Event] = {}
_CANCELS_LOCK = threading.Lock()


@on_gpu(duration=gpu_seconds)
def decode_on_device(
    settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig, cancel_id: str
) -> Iterator[StepTrace | RunSummary]:
    """Run a planned request: yields its StepTraces, then its RunSummary. Takes and yields only
    picklable values, and every failure a user can act on leaves it as a gr.Error."""
    with out_of_memory_as_error(cfg):
        yield from _decode(settings, preset, prompt, cfg, _CANCELS.get(cancel_id) or threading.Event())


def _decode(
    settings: Settings, preset: ModelPreset, prompt: str, cfg: RunConfig, cancel: threading.Event
) -> Iterator[StepTrace | RunSummary]:
    run = open_run(settings, preset, prompt, cfg, cancel)
    yield from run
    assert run.summary is not None
    yield run.summary


class DeviceRun:
    """One validated run, executed by ``decode_on_device``: iterate it for StepTraces; ``summary``
    is set at the end. Creating it validates the request and loads the models here, in the
    server process, so every error a user can fix is raised before any output changes."""

    def __init__(
        self, settings: Settings, prompt: str, controls: Controls, cancel: threading.Event, **overrides: Any
    ) -> None:
        self.preset, self.cfg = plan_run(settings, prompt, controls, **overrides)
        with out_of_memory_as_error(self.cfg):
            open_run(settings, self.preset, prompt, self.cfg, cancel)  # checks only; nothing runs yet
        self.settings, self.prompt, self.cancel = settings, prompt, cancel
        self.summary: RunSummary | None = None

    def __iter__(self) -> Iterator[StepTrace]:
        cancel_id = uuid.uuid4().hex
        with _CANCELS_LOCK:
            _CANCELS[cancel_id] = self.cancel
        items = decode_on_device(self.settings, self.preset, self.prompt, self.cfg, cancel_id)
        stop_seen = False
        try:
            for item in items:
                if isinstance(item, RunSummary):
                    self.summary = item
                elif stop_seen:  # a run that cannot see the flag (ZeroGPU worker) ends when closed
                    break
                else:
                    stop_seen = self.cancel.is_set()
                    yield item
        finally:
            items.close()
            with _CANCELS_LOCK:
                _CANCELS.pop(cancel_id, None)


# ---------------------------------------------------------------------------------------------
# Per-session data (lives in gr.State)
# ---------------------------------------------------------------------------------------------


@dataclass
class Session:
    """One browser session's run: the traces every figure is re-plotted from.

    ``cancel`` is created per run (never deep-copied: the initial State value has none);
    ``follow`` is False once the user scrubs, so streaming stops moving the step view."""

    steps: list[StepTrace] = field(default_factory=list)
    summary: RunSummary | None = None
    ar_summary: RunSummary | None = None
    cancel: threading.Event | None = None
    follow: bool = True
    step_through: bool = False
    shown: int = 0
    trace_path: str | None = None

    def begin(self, step_through: bool, cancel: threading.Event | None) -> None:
        """Forget the previous run; a new one starts (or a trace is replayed: no cancel)."""
        self.steps, self.summary, self.ar_summary, self.trace_path = [], None, None, None
        self.follow, self.step_through, self.shown = True, step_through, 0
        self.cancel = cancel

    def clamp(self, index: Any) -> int:
        try:
            value = int(index)
        except (TypeError, ValueError, OverflowError):
            value = 0
        return max(0, min(value, len(self.steps) - 1)) if self.steps else 0


@dataclass
class CompareSession:
    runs: list[tuple[str, list[StepTrace]]] = field(default_factory=list)
    summaries: list[RunSummary | None] = field(default_factory=list)
    cancel: threading.Event | None = None


# ---------------------------------------------------------------------------------------------
# Trace files: download (dump_trace) and upload (validated, never eval'd)
# ---------------------------------------------------------------------------------------------


class TraceFileError(ValueError):
    """An uploaded file is not a usable trace or results file; the message says what is wrong."""


def trace_dir() -> Path:
    path = Path(tempfile.gettempdir()) / TRACE_DIR_NAME
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_trace(summary: RunSummary, steps: list[StepTrace]) -> str:
    """Write the run as a talon-trace/1 JSON file for download; old files are swept away."""
    folder = trace_dir()
    now = time.time()
    for old in folder.glob("talon-trace-*.json"):
        with contextlib.suppress(OSError):  # another session may be sweeping too
            if now - old.stat().st_mtime > TRACE_MAX_AGE_S:
                old.unlink()
    path = folder / f"talon-trace-{uuid.uuid4().hex[:12]}.json"
    dump_trace(str(path), summary, steps)
    return str(path)


def read_json_upload(path: str | Path) -> Any:
    """Parse an uploaded JSON file after a size check; errors say what is wrong."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_UPLOAD_BYTES:
        raise TraceFileError(f"the file is {size / 2**20:.1f} MB; the limit is {MAX_UPLOAD_BYTES // 2**20} MB")
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as error:
        raise TraceFileError(f"the file is not UTF-8 text ({error.reason} at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise TraceFileError(
            f"the file is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
        ) from None
    except RecursionError:
        raise TraceFileError("the file's JSON is nested too deeply to be a trace") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# field -> check of each element (for per-node lists) or of the value
_NODE_FIELDS: dict[str, Callable[[Any], bool]] = {
    "tokens": _is_int,
    "texts": lambda v: isinstance(v, str),
    "parents": _is_int,
    "depths": _is_int,
    "q_draft": _is_num,
    "path_conf": _is_num,
    "sources": lambda v: v in ("root", "model", "retrieval", "both"),
    "gate_layer_max": lambda v: v is None or _is_num(v),
    "gate_threshold": lambda v: v is None or _is_num(v),
    "gate_passed": lambda v: v is None or isinstance(v, bool),
    "target_top1": _is_int,
}
_SCALAR_FIELDS: dict[str, Callable[[Any], bool]] = {
    "step": _is_int,
    "bonus_token": _is_int,
    "bonus_text": lambda v: isinstance(v, str),
    "draft_s": _is_num,
    "verify_s": _is_num,
    "other_s": _is_num,
    "match_len": _is_int,
    "predraft_reused": lambda v: v is None or isinstance(v, bool),
}
_LIST_FIELDS: dict[str, Callable[[Any], bool]] = {
    "accepted": _is_int,
    "new_tokens": _is_int,
    "p_target": lambda v: v is None or _is_num(v),
    "p_accept": lambda v: v is None or _is_num(v),
    "drafter_busy": lambda v: isinstance(v, list) and len(v) == 2 and all(_is_num(x) for x in v),
    "verifier_busy": lambda v: isinstance(v, list) and len(v) == 2 and all(_is_num(x) for x in v),
}
_OPTIONAL = {
    "p_target",
    "p_accept",
    "draft_s",
    "verify_s",
    "other_s",
    "drafter_busy",
    "verifier_busy",
    "predraft_reused",
    "match_len",
}


def _check_fields(data: dict, where: str) -> None:
    for name, ok in {**_NODE_FIELDS, **_LIST_FIELDS}.items():
        if name not in data:
            if name in _OPTIONAL:
                continue
            raise TraceFileError(f"{where}: missing field {name!r}")
        value = data[name]
        if not isinstance(value, list) or not all(ok(v) for v in value):
            raise TraceFileError(f"{where}: field {name!r} must be a list of valid entries")
    for name, ok in _SCALAR_FIELDS.items():
        if name in data and not ok(data[name]):
            raise TraceFileError(f"{where}: field {name!r} has an invalid value")
        if name not in data and name not in _OPTIONAL:
            raise TraceFileError(f"{where}: missing field {name!r}")


def _check_tree(data: dict, where: str) -> None:
    n = len(data["tokens"])
    if not 1 <= n <= MAX_TREE_NODES:
        raise TraceFileError(f"{where}: the tree must have 1 to {MAX_TREE_NODES} nodes, has {n}")
    if any(len(data[name]) != n for name in _NODE_FIELDS):
        raise TraceFileError(f"{where}: the per-node lists must all have {n} entries")
    parents, depths = data["parents"], data["depths"]
    if (
        parents[0] != -1
        or depths[0] != 0
        or any(not 0 <= parents[i] < i or depths[i] != depths[parents[i]] + 1 for i in range(1, n))
    ):
        raise TraceFileError(f"{where}: parents/depths do not describe a tree rooted at node 0")
    accepted = data["accepted"]
    if (
        not accepted
        or accepted[0] != 0
        or any(not 0 < a < n or parents[a] != b for b, a in zip(accepted, accepted[1:]))
    ):
        raise TraceFileError(f"{where}: 'accepted' must be a root-to-node path of the tree")
    if not 1 <= len(data["new_tokens"]) <= len(accepted):
        raise TraceFileError(f"{where}: 'new_tokens' must hold 1 to {len(accepted)} tokens")


def parse_step(data: Any, index: int) -> StepTrace:
    where = f"step {index}"
    if not isinstance(data, dict):
        raise TraceFileError(f"{where} must be a JSON object")
    _check_fields(data, where)
    _check_tree(data, where)
    return StepTrace.from_dict(data)


def parse_summary(data: Any, steps: list[StepTrace]) -> RunSummary:
    """A RunSummary from the file's summary when it is well formed, else rebuilt from the steps."""
    fields = {f.name: f for f in dataclasses.fields(RunSummary)}
    known = {k: v for k, v in data.items() if k in fields} if isinstance(data, dict) else {}
    agg = summarize_steps(steps)
    tokens = [t for st in steps for t in st.new_tokens]
    base = dict(
        text="", token_ids=tokens, prompt_token_ids=[], steps=len(steps), tokens_per_second=0.0, seconds=0.0, **agg
    )
    for key, value in known.items():
        default = base.get(key, getattr(RunSummary, key, None))
        if default is None or isinstance(value, type(default)) or (isinstance(default, float) and _is_num(value)):
            base[key] = value
    return RunSummary(**base)


def parse_trace(data: Any) -> tuple[RunSummary, list[StepTrace]]:
    """Validate a talon-trace/1 document (already JSON-parsed) and rebuild its records."""
    if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
        raise TraceFileError(f'not a Talon trace: expected a JSON object with "format": "{TRACE_FORMAT}"')
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not 1 <= len(raw_steps) <= MAX_TRACE_STEPS:
        raise TraceFileError(f"'steps' must be a list of 1 to {MAX_TRACE_STEPS} steps")
    steps = [parse_step(s, i) for i, s in enumerate(raw_steps)]
    return parse_summary(data.get("summary"), steps), steps


def parse_sweep(data: Any) -> list[F.SweepRow]:
    """Rows of a ``talon.bench --sweep`` results.json: {"env": ..., "results": [...]}."""
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise TraceFileError('not a sweep results file: expected a JSON object with a "results" list')
    rows = []
    for i, row in enumerate(data["results"]):
        if not isinstance(row, dict) or not _is_num(row.get("mu")) or not _is_num(row.get("budget")):
            raise TraceFileError(f"results[{i}] needs numeric 'mu' and 'budget'")
        metrics = {
            k: row.get(k) if _is_num(row.get(k)) else None for k in ("mat", "tokens_per_second", "speedup_vs_ar")
        }
        rows.append(
            F.SweepRow(
                str(row.get("suite", "")), str(row.get("method", "")), float(row["mu"]), int(row["budget"]), **metrics
            )
        )
    if not rows:
        raise TraceFileError("the results list is empty")
    return rows


# ---------------------------------------------------------------------------------------------
# Rendering a session into component updates
# ---------------------------------------------------------------------------------------------


@dataclass
class DecodeView:
    """Output components of the Decode tab; ``outputs()`` keeps their order for the API."""

    summary: gr.HTML
    text: gr.HTML
    slider: gr.Slider
    caption: gr.HTML
    tree: gr.Plot
    gates: gr.Plot
    mask: gr.Plot
    timeline: gr.Plot
    per_step: gr.Plot
    by_depth: gr.Plot
    sources: gr.Plot
    speed: gr.Plot
    download: gr.File
    state: gr.State

    def outputs(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def step_updates(self, session: Session, index: int, full: bool = True) -> dict[Any, Any]:
        """One step, re-plotted from the stored traces: the text up to it (step-through) or all
        of it with the step highlighted, and its figures (``full=False``: text and tree only)."""
        steps = session.steps
        if not steps:
            return {}
        index = session.clamp(index)
        session.shown = index
        st = steps[index]
        updates: dict[Any, Any] = {
            self.text: F.text_html(steps, upto=index if session.step_through else None, highlight=index),
            self.slider: gr.update(maximum=max(len(steps) - 1, 1), value=index),
            self.caption: F.step_caption_html(steps, index),
            self.tree: F.tree_figure(st, F.token_vocab(steps[max(0, index - 50) : index + 1])),
        }
        if full:
            updates[self.gates] = F.gate_figure(st)
            updates[self.mask] = F.mask_figure(st)
            updates[self.timeline] = F.timeline_figure(steps, index)
            updates[self.per_step] = F.accepted_per_step_figure(steps, index)
        return updates

    def summary_updates(self, session: Session, status: str = "") -> dict[Any, Any]:
        return {
            self.summary: F.summary_html(session.summary, session.steps, session.ar_summary, status),
            self.state: session,
        }

    def run_updates(self, session: Session, status: str = "") -> dict[Any, Any]:
        """The summary and the run-level figures."""
        steps = session.steps
        return {
            **self.summary_updates(session, status),
            self.by_depth: F.acceptance_by_depth_figure(steps),
            self.sources: F.source_share_figure(steps),
            self.speed: F.throughput_figure(steps),
        }

    def live_updates(self, session: Session, status: str, full: bool = True) -> dict[Any, Any]:
        """A streaming update: the newest step unless the user is scrubbing (then only the
        slider's range grows) or in step-through mode (then nothing is revealed yet). A light
        update (``full=False``) carries only the summary, the text and the tree."""
        updates = self.run_updates(session, status) if full else self.summary_updates(session, status)
        steps = session.steps
        if session.step_through:
            updates[self.text] = F.text_html(
                [], status=f"{len(steps)} steps recorded; step-through reveals them after the run."
            )
        elif session.follow and steps:
            updates.update(self.step_updates(session, len(steps) - 1, full))
        elif steps:
            updates[self.slider] = gr.update(maximum=max(len(steps) - 1, 1))
            if full:
                updates[self.per_step] = F.accepted_per_step_figure(steps, session.shown)
        return updates


# ---------------------------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------------------------


def _stream(run: Iterable[StepTrace], on_step: Callable[[StepTrace], None]) -> Iterator[bool]:
    """Iterate a run, calling ``on_step``; yields when a UI update is due: True for a full
    update (every figure), False for a light one (text, tree, summary)."""
    last = last_full = -math.inf
    for step in run:
        on_step(step)
        now = time.perf_counter()
        if now - last_full >= FULL_UPDATE_S:
            last = last_full = now
            yield True
        elif now - last >= LIGHT_UPDATE_S:
            last = now
            yield False


def run_autoregressive(
    settings: Settings, prompt: str, controls: Controls, cancel: threading.Event
) -> RunSummary | None:
    """The same prompt and sampling with no drafter: one target forward per token."""
    run = DeviceRun(settings, prompt, controls, cancel, drafter="none", async_draft=False)
    for _ in run:
        pass
    return None if cancel.is_set() else run.summary


def make_generate(view: DecodeView, settings: Settings) -> Callable[..., Iterator[dict[Any, Any]]]:
    def generate(
        prompt: str, session: Session, compare_ar: bool = False, step_through: bool = False, **controls: Any
    ) -> Iterator[dict[Any, Any]]:
        """Run speculative decoding on the prompt; streams the text, the figures of the newest
        step, the run-level figures and, at the end, the summary and the trace file."""
        values = Controls(**controls)
        cancel = threading.Event()
        run = DeviceRun(settings, prompt, values, cancel)
        session.begin(bool(step_through), cancel)
        yield view.live_updates(session, "running…")
        for full in _stream(run, session.steps.append):
            yield view.live_updates(session, f"running… step {len(session.steps)}", full)
        session.summary = run.summary
        if compare_ar and not cancel.is_set():
            yield view.live_updates(session, "measuring the autoregressive baseline…")
            session.ar_summary = run_autoregressive(settings, prompt, values, cancel)
        yield final_updates(view, session)

    return generate


def final_updates(view: DecodeView, session: Session) -> dict[Any, Any]:
    cancelled = session.summary.stop_reason == "cancelled" if session.summary else bool(session.steps)
    status = "stopped" if cancelled else ""
    if session.summary is not None and session.steps:
        session.trace_path = write_trace(session.summary, session.steps)
    updates = view.run_updates(session, status)
    if session.steps:
        session.follow = not session.step_through
        updates.update(view.step_updates(session, 0 if session.step_through else len(session.steps) - 1))
    updates[view.download] = session.trace_path
    return updates


def make_replay(view: DecodeView) -> Callable[[Any, Session], dict[Any, Any]]:
    def replay(trace_file: Any, session: Session) -> dict[Any, Any]:
        """Load a downloaded trace (talon-trace/1 JSON) and re-plot every figure, no model needed."""
        if not trace_file:
            raise gr.Error("no file: upload a trace JSON downloaded from this app")
        try:
            summary, steps = parse_trace(read_json_upload(_upload_path(trace_file)))
        except (TraceFileError, OSError) as error:
            raise user_error(f"cannot replay this trace: {error}") from error
        session.begin(step_through=False, cancel=None)
        session.steps, session.summary = steps, summary
        updates = final_updates(view, session)
        updates[view.summary] = F.summary_html(summary, steps, None, f"replayed trace of {len(steps)} steps")
        return updates

    return replay


def _upload_path(value: Any) -> str:
    """The local path of an uploaded file (gr.File gives a path; API clients may send a dict)."""
    if isinstance(value, Mapping):
        return str(value.get("path") or value.get("name") or "")
    return str(getattr(value, "name", value))


def make_show_step(view: DecodeView) -> Callable[[Any, Session], dict[Any, Any]]:
    def show_step(index: Any, session: Session) -> dict[Any, Any]:
        session.follow = False
        return view.step_updates(session, session.clamp(index))

    return show_step


def make_nudge(view: DecodeView, delta: int) -> Callable[[Session], dict[Any, Any]]:
    def nudge(session: Session) -> dict[Any, Any]:
        if delta == 0:  # "latest": follow the run again
            session.follow = True
            return view.step_updates(session, len(session.steps) - 1)
        session.follow = False
        return view.step_updates(session, session.clamp(session.shown + delta))

    return nudge


def stop(session: Session, cmp: CompareSession | None = None) -> None:
    """Ask the running decode (and compare) to stop after the current step."""
    for cancel in (session.cancel, cmp.cancel if cmp else None):
        if cancel is not None:
            cancel.set()


# ---------------------------------------------------------------------------------------------
# Compare and sweep handlers
# ---------------------------------------------------------------------------------------------


@dataclass
class CompareView:
    summary: gr.HTML
    text_a: gr.HTML
    text_b: gr.HTML
    tree_a: gr.Plot
    tree_b: gr.Plot
    chart: gr.Plot
    state: gr.State

    def outputs(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def updates(self, cmp: CompareSession, status: str = "") -> dict[Any, Any]:
        out: dict[Any, Any] = {self.state: cmp, self.summary: compare_summary_html(cmp, status)}
        for (label, steps), text, tree in zip(cmp.runs, (self.text_a, self.text_b), (self.tree_a, self.tree_b)):
            out[text] = F.text_html(steps, highlight=len(steps) - 1)
            out[tree] = (
                F.tree_figure(steps[-1], F.token_vocab(steps[-50:]))
                if steps
                else F.empty_figure(f"{label}: no steps yet")
            )
        if cmp.runs:
            out[self.chart] = F.compare_figure(cmp.runs)
        return out


def compare_summary_html(cmp: CompareSession, status: str) -> str:
    rows = []
    for (label, steps), summary in zip(cmp.runs, cmp.summaries + [None] * len(cmp.runs)):
        tokens = sum(len(st.new_tokens) for st in steps)
        seconds = summary.seconds if summary else (F.step_end_times(steps)[-1] if steps else 0.0)
        mat = tokens / len(steps) if steps else 0.0
        tps = tokens / seconds if seconds > 0 else 0.0
        rows.append(
            f"<tr><td>{F.esc(label)}</td><td>{mat:.2f}</td><td>{tps:.1f}</td><td>{tokens}</td><td>{len(steps)}</td></tr>"
        )
    table = (
        "<table><tr><th>run</th><th>MAT</th><th>tokens/s</th><th>tokens</th><th>steps</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    note = f'<div class="talon-status">{F.esc(status)}</div>' if status else ""
    return f'<div class="talon-summary talon-compare">{table}{note}</div>'


def describe(cfg: RunConfig) -> str:
    t = cfg.tree
    gate = f", μ {t.mu:g}" if t.mode == "adaptive" else ""
    return f"{cfg.drafter} · {t.mode} · N {t.budget}{gate}"


def make_compare(view: CompareView, settings: Settings) -> Callable[..., Iterator[dict[Any, Any]]]:
    def compare(
        prompt: str,
        cmp: CompareSession,
        tree_mode_b: str = "static",
        drafter_b: str = "hybrid",
        mu_b: float = 0.1,
        **controls: Any,
    ) -> Iterator[dict[Any, Any]]:
        """Run the current configuration (A) and a variant (B) on the same prompt, one after the other."""
        a = Controls(**controls)
        b = dataclasses.replace(a, tree_mode=tree_mode_b, drafter=drafter_b, mu=mu_b)
        cancel = threading.Event()
        runs = [DeviceRun(settings, prompt, c, cancel) for c in (a, b)]
        cmp.runs, cmp.summaries, cmp.cancel = [], [], cancel
        for label, run in zip("AB", runs):
            steps: list[StepTrace] = []
            cmp.runs.append((f"{label}: {describe(run.cfg)}", steps))
            for _ in _stream(run, steps.append):
                yield view.updates(cmp, f"running {label}… step {len(steps)}")
            cmp.summaries.append(run.summary)
        yield view.updates(cmp)

    return compare


@dataclass
class SweepView:
    progress: gr.HTML
    mat: gr.Plot
    speed: gr.Plot
    suite: gr.Dropdown
    method: gr.Dropdown
    state: gr.State

    def outputs(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


def parse_grid(name: str, text: str, convert: Callable[[str], float]) -> list[float]:
    try:
        values = sorted({convert(part) for part in text.replace(";", ",").split(",") if part.strip()})
    except ValueError:
        raise user_error(f"{name}: write numbers separated by commas, got {text!r}") from None
    if not values:
        raise gr.Error(f"{name}: give at least one value")
    return values


def select_rows(rows: Sequence[F.SweepRow], suite: str | None, method: str | None) -> list[F.SweepRow]:
    return [r for r in rows if (not suite or r.suite == suite) and (not method or r.method == method)]


def sweep_updates(
    view: SweepView, rows: list[F.SweepRow], suite: str | None, method: str | None, status: str
) -> dict[Any, Any]:
    suites = sorted({r.suite for r in rows})
    methods = sorted({r.method for r in rows})
    suite = suite if suite in suites else (suites[0] if suites else None)
    method = method if method in methods else (methods[0] if methods else None)
    chosen = select_rows(rows, suite, method)
    return {
        view.progress: f'<div class="talon-status">{F.esc(status)}</div>',
        view.mat: F.sweep_heatmap(chosen, "mat"),
        view.speed: F.sweep_heatmap(chosen, "tokens_per_second"),
        view.suite: gr.update(choices=suites, value=suite),
        view.method: gr.update(choices=methods, value=method),
        view.state: rows,
    }


def make_sweep(view: SweepView, settings: Settings) -> Callable[..., Iterator[dict[Any, Any]]]:
    def sweep(
        prompt: str,
        rows_state: Any,
        mus: str = "0.02, 0.1, 0.3",
        budgets: str = "8, 16, 32",
        sweep_tokens: float = 24,
        **controls: Any,
    ) -> Iterator[dict[Any, Any]]:
        """Short runs of the current prompt for every (mu, N) pair: MAT and tokens/s heatmaps."""
        mu_values = parse_grid("μ values", mus, float)
        budget_values = [int(b) for b in parse_grid("budgets", budgets, lambda s: float(int(s)))]
        if len(mu_values) * len(budget_values) > MAX_SWEEP_CELLS:
            raise gr.Error(
                f"at most {MAX_SWEEP_CELLS} (μ, N) cells per sweep; got {len(mu_values) * len(budget_values)}"
            )
        base = dataclasses.replace(Controls(**controls), tree_mode="adaptive", max_new_tokens=sweep_tokens)
        rows: list[F.SweepRow] = []
        cancel = threading.Event()
        for mu in mu_values:
            for budget in budget_values:
                run = DeviceRun(settings, prompt, dataclasses.replace(base, mu=mu, budget=budget), cancel)
                for _ in run:
                    pass
                s = run.summary
                rows.append(
                    F.SweepRow(
                        "this prompt",
                        f"{run.cfg.drafter} · adaptive",
                        mu,
                        budget,
                        s.mean_accepted_tokens,
                        s.tokens_per_second,
                    )
                )
                yield sweep_updates(
                    view, rows, None, None, f"{len(rows)} of {len(mu_values) * len(budget_values)} runs done"
                )
        yield sweep_updates(view, rows, None, None, f"sweep done: {len(rows)} runs of {int(sweep_tokens)} tokens")

    return sweep


def make_load_sweep(view: SweepView) -> Callable[[Any], dict[Any, Any]]:
    def load_sweep(results_file: Any) -> dict[Any, Any]:
        """Show a ``python -m talon.bench --sweep`` results.json as heatmaps."""
        if not results_file:
            raise gr.Error("no file: upload the results.json of a sweep")
        try:
            rows = parse_sweep(read_json_upload(_upload_path(results_file)))
        except (TraceFileError, OSError) as error:
            raise user_error(f"cannot read these results: {error}") from error
        return sweep_updates(view, rows, None, None, f"loaded {len(rows)} results")

    return load_sweep


def make_filter_sweep(view: SweepView) -> Callable[[str, str, Any], dict[Any, Any]]:
    def filter_sweep(suite: str, method: str, rows: Any) -> dict[Any, Any]:
        return sweep_updates(view, list(rows or []), suite, method, "") if rows else {}

    return filter_sweep


# ---------------------------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------------------------

HEADER = """
<div class="talon-header">
  <h1>Talon <span>tree speculative decoding, one step at a time</span></h1>
  <p>A small <b>drafter</b> (a draft model and/or retrieval from the text so far) proposes a
  <b>tree</b> of possible next tokens; the big <b>target</b> model checks the whole tree in one
  forward pass and keeps the longest path it agrees with, plus one token of its own (the
  <b>bonus</b>). The output is exactly what the target alone would write, only faster.</p>
</div>
"""

TEXT_LEGEND = """
<div class="talon-legend">
  <span class="tk src-model">draft model</span>
  <span class="tk src-retrieval">retrieval</span>
  <span class="tk src-both">model + retrieval</span>
  <span class="tk src-bonus">target's bonus token</span>
  <span class="legend-note">│ separates steps · hover a token for its step and probabilities ·
  ←/→ keys step through</span>
</div>
"""

EXPLAIN: dict[str, str] = {
    "tree": (
        "**Draft tree.** Left to right = tokens ahead of the text. Colour: who drafted the token "
        "(blue model, orange retrieval, purple both). **Bold ring**: accepted by the target. "
        "**Faded**: rejected, or never reached because an ancestor was rejected. **⊗**: gated out, "
        "too unsure to expand. **★**: the bonus token the target adds itself. Hover a node for q "
        "(drafter probability), c (path confidence) and the target's top-1."
    ),
    "gates": (
        "**Confidence gates.** Each dot is a candidate of one layer; height = its path confidence "
        "c (product of q along the path, log scale). Dashed line: the layer's threshold μ × max. "
        "Above it the node proposes children; below it is gated out. Small μ: wide, shallow trees; "
        "large μ: narrow, deep ones."
    ),
    "mask": (
        "**Tree attention mask.** The target checks every node in one forward. Row i shows what "
        "token i may attend to: itself and its ancestors (and all committed text, not drawn), so "
        "each branch sees only its own path. Dark row: the accepted path."
    ),
    "timeline": (
        "**Timeline.** When the drafter and the target (verifier) are busy, in ms. Synchronous "
        "decoding takes turns; with *async* on, the drafter pre-drafts the next tree while the "
        "target verifies, so the bars overlap."
    ),
    "per_step": (
        "**Tokens per step.** Each bar is one target forward: the accepted drafts by source plus the "
        "bonus token. The line is the running mean, MAT; plain decoding has MAT = 1."
    ),
    "by_depth": (
        "**Acceptance by depth.** Of the steps whose tree reached depth d, how many had their accepted "
        "path reach d. It falls with depth: every extra token must match too."
    ),
    "sources": "**Sources.** Which drafter produced the committed tokens; the bonus token is the target's own.",
    "speed": "**Tokens per second.** Per step (bars) and overall (line). Compare with autoregressive in the summary.",
    "compare": (
        "**Compare.** Runs configuration A (the controls on the left) and B (A with the changes "
        "below) on the same prompt, one after the other. Greedy decoding writes the same text in "
        "both; what differs is how many target forwards it takes."
    ),
    "sweep": (
        "**Threshold explorer.** Short runs of the current prompt for each gate μ and budget N "
        "(other knobs from the left), or the `results.json` of `python -m talon.bench --sweep`. "
        "MAT rewards big trees; tokens/s shows what they cost."
    ),
}


def theme() -> gr.themes.Base:
    """Local fonts only: the app must work offline."""
    return gr.themes.Soft(
        primary_hue="blue",
        neutral_hue="slate",
        font=[gr.themes.Font(name) for name in ("Inter", "Segoe UI", "system-ui", "sans-serif")],
        font_mono=[
            gr.themes.Font(name) for name in ("JetBrains Mono", "ui-monospace", "Menlo", "Consolas", "monospace")
        ],
    )


@dataclass
class ControlPanel:
    """The input components shared by every tab: the prompt and the run controls."""

    prompt: gr.Textbox
    components: dict[str, Any]  # Controls field -> component
    compare_ar: gr.Checkbox
    step_through: gr.Checkbox
    run: gr.Button
    stop: gr.Button


def _controls(settings: Settings, examples: list[Example]) -> ControlPanel:
    prompt = gr.Textbox(label="Prompt", value=examples[0].prompt, lines=6, max_lines=14, elem_id="talon-prompt")
    picker = gr.Dropdown(
        label="Example prompts (SpecBench suites)",
        choices=[(ex.label, i) for i, ex in enumerate(examples)],
        value=None,
        elem_id="talon-examples",
    )
    picker.input(
        lambda i: examples[int(i)].prompt if i is not None else gr.skip(), picker, prompt, api_visibility="private"
    )
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id="talon-run")
        stop = gr.Button("Stop", variant="stop", elem_id="talon-stop")
    defaults, limit = Controls(), settings.max_new_tokens_limit
    offered, initial = presets(settings), initial_preset(settings)
    c: dict[str, Any] = {}
    with gr.Accordion("Drafter and tree", open=True):
        c["preset"] = gr.Dropdown(label="Models", choices=[(p.label, p.key) for p in offered], value=initial)
        c["drafter"] = gr.Radio(label="Drafter", choices=list(UI_DRAFTERS), value=defaults.drafter)
        c["tree_mode"] = gr.Radio(label="Tree", choices=list(TREE_MODES), value=defaults.tree_mode)
        c["budget"] = gr.Slider(1, 128, value=defaults.budget, step=1, label="Budget N (nodes verified per step)")
        c["root_k"] = gr.Slider(1, 16, value=defaults.root_k, step=1, label="Root K (children of the root)")
        c["top_k"] = gr.Slider(1, 8, value=defaults.top_k, step=1, label="k (children per expanded node)")
        c["mu"] = gr.Slider(0.0, 1.0, value=defaults.mu, step=0.01, label="Gate μ (expand if c ≥ μ × layer max)")
        c["max_depth"] = gr.Slider(1, 32, value=defaults.max_depth, step=1, label="Max depth")
        c["min_conf"] = gr.Slider(
            0.0, 1.0, value=defaults.min_conf, step=0.01, label="Min confidence (stop deepening below it; 0 = off)"
        )
        c["retrieval_threshold"] = gr.Slider(
            1, 16, value=defaults.retrieval_threshold, step=1, label="Retrieval threshold (match length to graft)"
        )
    with gr.Accordion("Sampling and length", open=False):
        c["temperature"] = gr.Slider(0.0, 2.0, value=defaults.temperature, step=0.05, label="Temperature (0 = greedy)")
        c["top_p"] = gr.Slider(0.05, 1.0, value=defaults.top_p, step=0.05, label="Top-p")
        c["seed"] = gr.Number(value=defaults.seed, precision=0, label="Seed", minimum=0)
        c["max_new_tokens"] = gr.Slider(
            1, limit, value=min(defaults.max_new_tokens, limit), step=1, label="Max new tokens"
        )
    c["async_draft"] = gr.Checkbox(
        value=defaults.async_draft, label="Async drafting (draft the next tree while verifying)"
    )
    compare_ar = gr.Checkbox(value=False, label="Compare with autoregressive (runs the prompt again without drafts)")
    step_through = gr.Checkbox(value=False, label="Step-through: reveal the run one step per click")
    return ControlPanel(prompt, c, compare_ar, step_through, run, stop)


def _figure_row(key: str, label: str) -> gr.Plot:
    with gr.Row(equal_height=False):
        plot = gr.Plot(
            label=label, show_label=False, scale=3, min_width=420, elem_classes=["talon-plot"], elem_id=f"talon-{key}"
        )
        gr.Markdown(EXPLAIN[key], elem_classes=["talon-explain"], min_width=200)
    return plot


def _decode_tab() -> tuple[DecodeView, dict[str, gr.Button]]:
    summary = gr.HTML(F.summary_html(None, []), label="summary", elem_id="talon-summary")
    gr.HTML(TEXT_LEGEND)
    text = gr.HTML(F.text_html([]), label="text", elem_id="talon-text", autoscroll=True, max_height=420)
    with gr.Row(elem_id="talon-stepper"):
        prev = gr.Button("◀ Prev", size="sm", min_width=70, scale=0, elem_id="talon-prev")
        slider = gr.Slider(0, 1, value=0, step=1, label="Step", scale=6, elem_id="talon-slider")
        nxt = gr.Button("Next ▶", size="sm", min_width=70, scale=0, elem_id="talon-next")
        latest = gr.Button("Latest »", size="sm", min_width=80, scale=0, elem_id="talon-latest")
    caption = gr.HTML(F.step_caption_html([], 0), label="step caption", elem_id="talon-caption")
    tree = _figure_row("tree", "Draft tree")
    gates = _figure_row("gates", "Confidence gates")
    mask = _figure_row("mask", "Attention mask")
    timeline = _figure_row("timeline", "Timeline")
    gr.Markdown("### The whole run")
    with gr.Row():
        with gr.Column(min_width=320):
            per_step = gr.Plot(label="tokens per step", show_label=False, elem_id="talon-per-step")
            gr.Markdown(EXPLAIN["per_step"], elem_classes=["talon-explain"])
        with gr.Column(min_width=320):
            by_depth = gr.Plot(label="acceptance by depth", show_label=False, elem_id="talon-by-depth")
            gr.Markdown(EXPLAIN["by_depth"], elem_classes=["talon-explain"])
    with gr.Row():
        with gr.Column(min_width=320):
            sources = gr.Plot(label="sources", show_label=False, elem_id="talon-sources")
            gr.Markdown(EXPLAIN["sources"], elem_classes=["talon-explain"])
        with gr.Column(min_width=320):
            speed = gr.Plot(label="tokens per second", show_label=False, elem_id="talon-speed")
            gr.Markdown(EXPLAIN["speed"], elem_classes=["talon-explain"])
    with gr.Row():
        download = gr.File(label="Download the trace (JSON)", interactive=False, elem_id="talon-download")
        upload = gr.File(label="Replay a trace (no model needed)", file_types=[".json"], elem_id="talon-upload")
    view = DecodeView(
        summary,
        text,
        slider,
        caption,
        tree,
        gates,
        mask,
        timeline,
        per_step,
        by_depth,
        sources,
        speed,
        download,
        gr.State(Session()),
    )
    return view, {"prev": prev, "next": nxt, "latest": latest, "upload": upload}


def _model_event(settings: Settings) -> dict[str, Any]:
    """Listener options of every event that runs a model: one shared concurrency group."""
    return dict(
        concurrency_id=MODEL_CONCURRENCY_ID, concurrency_limit=queue_limits(settings)[0], show_progress="minimal"
    )


def _wire_decode(
    view: DecodeView, panel: ControlPanel, buttons: dict[str, Any], compare: CompareView, settings: Settings
) -> None:
    model_events = _model_event(settings)
    kwargs = {
        **panel.components,
        "compare_ar": panel.compare_ar,
        "step_through": panel.step_through,
        "session": view.state,
    }
    run_inputs: dict[str, Any] = dict(inputs=[panel.prompt], inputs_kwargs=kwargs, outputs=view.outputs())
    generate = make_generate(view, settings)
    panel.run.click(generate, **run_inputs, api_name="generate", **model_events)
    panel.prompt.submit(generate, **run_inputs, api_visibility="private", **model_events)
    quick = dict(outputs=view.outputs(), concurrency_limit=None, show_progress="hidden", api_visibility="private")
    panel.stop.click(stop, [view.state, compare.state], None, concurrency_limit=None, api_visibility="private")
    view.slider.input(make_show_step(view), [view.slider, view.state], trigger_mode="always_last", **quick)
    buttons["prev"].click(make_nudge(view, -1), [view.state], **quick)
    buttons["next"].click(make_nudge(view, +1), [view.state], **quick)
    buttons["latest"].click(make_nudge(view, 0), [view.state], **quick)
    buttons["upload"].upload(
        make_replay(view), [buttons["upload"], view.state], view.outputs(), api_name="replay", concurrency_limit=None
    )


def _compare_tab(panel: ControlPanel, settings: Settings) -> CompareView:
    gr.Markdown(EXPLAIN["compare"], elem_classes=["talon-explain"])
    with gr.Row():
        tree_b = gr.Radio(label="B: tree", choices=list(TREE_MODES), value="static")
        drafter_b = gr.Radio(label="B: drafter", choices=list(UI_DRAFTERS), value=Controls().drafter)
        mu_b = gr.Slider(0.0, 1.0, value=Controls().mu, step=0.01, label="B: gate μ")
    go_button = gr.Button("Run A and B", variant="primary", elem_id="talon-compare-run")
    summary = gr.HTML(compare_summary_html(CompareSession(), "Press “Run A and B”."))
    chart = gr.Plot(show_label=False)
    with gr.Row():
        with gr.Column(min_width=320):
            text_a = gr.HTML(F.text_html([]), max_height=260)
            tree_a = gr.Plot(show_label=False)
        with gr.Column(min_width=320):
            text_b = gr.HTML(F.text_html([]), max_height=260)
            tree_b_plot = gr.Plot(show_label=False)
    view = CompareView(summary, text_a, text_b, tree_a, tree_b_plot, chart, gr.State(CompareSession()))
    kwargs = {**panel.components, "tree_mode_b": tree_b, "drafter_b": drafter_b, "mu_b": mu_b, "cmp": view.state}
    go_button.click(
        make_compare(view, settings),
        inputs=[panel.prompt],
        inputs_kwargs=kwargs,
        outputs=view.outputs(),
        api_name="compare",
        **_model_event(settings),
    )
    return view


def _sweep_tab(panel: ControlPanel, settings: Settings) -> None:
    gr.Markdown(EXPLAIN["sweep"], elem_classes=["talon-explain"])
    with gr.Row():
        mus = gr.Textbox(label="μ values", value="0.02, 0.1, 0.3")
        budgets = gr.Textbox(label="Budgets N", value="8, 16, 32")
        tokens = gr.Slider(4, 128, value=24, step=1, label="New tokens per run")
    with gr.Row():
        go_button = gr.Button("Sweep the current prompt", variant="primary")
        results = gr.File(label="…or load results.json", file_types=[".json"])
    with gr.Row():
        suite = gr.Dropdown(label="Suite", choices=[], value=None, allow_custom_value=True)
        method = gr.Dropdown(label="Method", choices=[], value=None, allow_custom_value=True)
    progress = gr.HTML("")
    with gr.Row():
        mat = gr.Plot(show_label=False)
        speed = gr.Plot(show_label=False)
    view = SweepView(progress, mat, speed, suite, method, gr.State([]))
    kwargs = {**panel.components, "mus": mus, "budgets": budgets, "sweep_tokens": tokens, "rows_state": view.state}
    go_button.click(
        make_sweep(view, settings),
        inputs=[panel.prompt],
        inputs_kwargs=kwargs,
        outputs=view.outputs(),
        api_name="sweep",
        **_model_event(settings),
    )
    results.upload(make_load_sweep(view), [results], view.outputs(), api_name="load_sweep")
    filter_sweep = make_filter_sweep(view)
    for box in (suite, method):
        box.input(filter_sweep, [suite, method, view.state], view.outputs(), api_visibility="private")


def build_ui(settings: Settings) -> gr.Blocks:
    """The whole app. Pass css/head/theme to ``launch()`` (Gradio 6)."""
    examples = load_examples()
    with gr.Blocks(title="Talon: tree speculative decoding, step by step", delete_cache=(3600, 3600)) as demo:
        gr.HTML(HEADER)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=300, elem_id="talon-controls"):
                panel = _controls(settings, examples)
            with gr.Column(scale=3, min_width=480):
                with gr.Tabs():
                    with gr.Tab("Decode", id="decode"):
                        view, buttons = _decode_tab()
                    with gr.Tab("Compare", id="compare"):
                        compare = _compare_tab(panel, settings)
                    with gr.Tab("Threshold explorer", id="sweep"):
                        _sweep_tab(panel, settings)
        _wire_decode(view, panel, buttons, compare, settings)
    return demo
