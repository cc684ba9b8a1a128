"""The model pairs the app offers (``ModelPreset``): the default pair from Settings and the larger
GPU pairs, which one a machine loads at start, and which the Space bakes into its image."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    """A target/draft pair the UI offers. ``None`` models mean: the ones from Settings.

    ``dtype`` is the weights dtype unless TALON_DTYPE names one; ``preload`` marks the pairs whose
    weights the Space bakes into its image at build time (README ``preload_from_hub``)."""

    key: str
    label: str
    target: str | None = None
    draft: str | None = None
    needs_cuda: bool = False
    dtype: str | None = None
    preload: bool = False
    draft_quant: str | None = None  # None: TALON_DRAFT_QUANT
    target_weights: str | None = None  # None: TALON_TARGET_WEIGHTS
    gpu_gib: float | None = None  # the GPU memory the pair is meant for (the memory guard names it)
    head: bool = False  # the draft is an EAGLE-3 head (drafter kinds eagle3, eagle3-hybrid)
    mtp: bool = False  # the target's own MTP layers draft (kinds mtp, mtp-hybrid): no draft model (draft "none")

    @property
    def repos(self) -> tuple[str, ...]:
        return tuple(name for name in (self.target, self.draft) if name not in (None, EMPTY_SLOT))


EMPTY_SLOT = "none"  # a preset's draft slot left empty (its target drafts for itself: ``mtp``)
DEFAULT_PRESET = "default"
# The pair a CUDA machine selects and loads at start, unless TALON_TARGET/TALON_DRAFT name models.
STARTUP_GPU_PRESET = "qwen2.5-7b"
PRESETS: tuple[ModelPreset, ...] = (
    ModelPreset(DEFAULT_PRESET, "Default pair (TALON_TARGET + TALON_DRAFT)"),
    ModelPreset(
        "qwen2.5-7b",
        "Qwen2.5-7B-Instruct + Qwen2.5-0.5B-Instruct (GPU, bf16)",
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen/Qwen2.5-0.5B-Instruct",
        needs_cuda=True,
        dtype="bfloat16",
        preload=True,
        gpu_gib=24,
    ),
    ModelPreset(
        "qwen2.5-coder-7b",
        "Qwen2.5-Coder-7B-Instruct + Qwen2.5-Coder-0.5B-Instruct (GPU, bf16)",
        "Qwen/Qwen2.5-Coder-7B-Instruct",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        needs_cuda=True,
        dtype="bfloat16",
        preload=True,
        gpu_gib=24,
    ),
    ModelPreset(
        "llama-3.1-8b",
        "Llama-3.1-8B-Instruct + Llama-3.2-1B-Instruct (GPU, bf16; gated: needs HF_TOKEN with access)",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Llama-3.2-1B-Instruct",
        needs_cuda=True,
        dtype="bfloat16",
        gpu_gib=24,
    ),
    ModelPreset(
        "llama-3.1-8b-eagle3",
        "Llama-3.1-8B-Instruct + its EAGLE-3 head (GPU, bf16; gated: needs HF_TOKEN with access)",
        "meta-llama/Llama-3.1-8B-Instruct",
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",  # EAGLE's authors' head (Apache-2.0)
        needs_cuda=True,
        dtype="bfloat16",
        gpu_gib=24,
        head=True,
    ),
    ModelPreset(
        "qwen3-8b",
        "Qwen3-8B + Qwen3-0.6B (GPU, bf16)",
        "Qwen/Qwen3-8B",
        "Qwen/Qwen3-0.6B",
        needs_cuda=True,
        dtype="bfloat16",
        gpu_gib=24,
    ),
    ModelPreset(
        "qwen3-8b-eagle3",
        "Qwen3-8B + an EAGLE-3 head trained for it (GPU, bf16)",
        "Qwen/Qwen3-8B",
        "RedHatAI/Qwen3-8B-speculator.eagle3",  # Red Hat's head, speculators layout
        needs_cuda=True,
        dtype="bfloat16",
        gpu_gib=24,
        head=True,
    ),
    ModelPreset(
        "glm-4.7-flash-mtp",
        "GLM-4.7-Flash + its own MTP layer (GPU with 80 GB, bf16)",
        "zai-org/GLM-4.7-Flash",  # MIT; 30 B parameters (3 B active), latent attention in all 47 layers
        EMPTY_SLOT,
        needs_cuda=True,
        dtype="bfloat16",
        gpu_gib=80,
        mtp=True,
    ),
    ModelPreset(
        "qwen2.5-14b",
        "Qwen2.5-14B-Instruct + Qwen2.5-0.5B-Instruct (GPU with 40 GB or more, bf16)",
        "Qwen/Qwen2.5-14B-Instruct",
        "Qwen/Qwen2.5-0.5B-Instruct",
        needs_cuda=True,
        dtype="bfloat16",
        gpu_gib=40,
    ),
)


def available_presets(cuda: bool) -> list[ModelPreset]:
    """The presets this machine can run: the larger pairs only with a CUDA GPU."""
    return [p for p in PRESETS if cuda or not p.needs_cuda]


def startup_preset(cuda: bool, models_configured: bool) -> str:
    """The preset selected and loaded at start: the GPU pair ``STARTUP_GPU_PRESET`` on a CUDA
    machine whose TALON_TARGET/TALON_DRAFT were left at their defaults, else the default pair."""
    return STARTUP_GPU_PRESET if cuda and not models_configured else DEFAULT_PRESET


def preload_repos() -> list[str]:
    """Hub repos the Space downloads at build time: those of the presets marked ``preload``."""
    return sorted({repo for p in PRESETS if p.preload for repo in p.repos})
