"""Where a result came from: the machine, the versions, and which peer features were active."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import importlib.util
import os
import platform
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers

from talon.models import LoadedModel, cpu_model


@dataclass(frozen=True)
class BenchEnv:
    cpu: str
    cores: int | None
    torch_threads: int
    gpu: str | None
    dtype: str
    device: str
    target: str
    draft: str
    torch: str
    transformers: str
    python: str
    platform: str
    date: str
    command: str
    peer_features: dict[str, Any] = field(default_factory=dict)
    draft_quant: str = "none"  # int8: the draft's decoder Linear layers run in int8 (all draft users)
    target_weights: str = "dense"  # int8-weights / int4-weights(-q4k): a packed target (every method's)
    forward: str = ""  # how Talon's forwards ran (talon.engine.engine.Engine.forward_path: dynamic+fold, graphs, ...)

    @staticmethod
    def capture(target: LoadedModel, draft: LoadedModel | None, command: str, forward: str = "") -> BenchEnv:
        cuda = target.device.type == "cuda"
        return BenchEnv(
            cpu=cpu_model(),
            cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            torch_threads=torch.get_num_threads(),
            gpu=torch.cuda.get_device_name(target.device) if cuda else None,
            dtype=str(target.dtype).removeprefix("torch."),
            device=str(target.device),
            target=target.name,
            draft=draft.name if draft is not None else "none",
            torch=torch.__version__,
            transformers=transformers.__version__,
            python=platform.python_version(),
            platform=platform.platform(),
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            command=command,
            peer_features=peer_features(draft),
            draft_quant=getattr(draft.model, "talon_quant", "none") if draft is not None else "none",
            target_weights=getattr(target.model, "talon_quant", "dense"),
            forward=forward,
        )


def peer_features(draft: LoadedModel | None) -> dict[str, Any]:
    """Which of transformers' adaptive features the Hugging Face peers ran with.

    Assisted generation adapts its confidence threshold (a ROC fit over the run's draft
    probabilities) only when scikit-learn is importable; without it the threshold stays fixed and
    the peer is weaker than the one a user would get."""
    sklearn = importlib.util.find_spec("sklearn") is not None
    defaults = draft.model.generation_config if draft is not None else None
    return {
        "transformers": transformers.__version__,
        "scikit_learn": _version_of("scikit-learn") if sklearn else None,
        "assisted_adaptive_confidence_threshold": sklearn and transformers.utils.is_sklearn_available(),
        "assisted_default_schedule": getattr(defaults, "num_assistant_tokens_schedule", None),
        "assisted_default_num_tokens": getattr(defaults, "num_assistant_tokens", None),
        "assisted_default_confidence_threshold": getattr(defaults, "assistant_confidence_threshold", None),
    }


def _version_of(distribution: str) -> str | None:
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version(distribution)
    return None
