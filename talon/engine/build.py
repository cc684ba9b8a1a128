"""The one way every front end gets its engine: the app, the command line, the benchmark, atlas
recording and ``talon costs`` each describe the pair they want as a ``PairKey`` (from the
``Settings``, with their own flags on top) and call ``build_engine``. So the forward, the chained
tree, the grouped-query fold and the prepacked layout a command runs are the ones the server
runs, and ``talon costs --probe`` measures the curves that server reads.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from talon.engine.engine import Engine
from talon.models import load_pair, zerogpu
from talon.run_config import ConfigError
from talon.settings import Settings

logger = logging.getLogger(__name__)


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


def build_engine(key: PairKey, precompile: bool = True) -> Engine:
    """Load ``key``'s pair and make its engine on the configured forward. ``precompile``: on the
    compiled forward, compile the draft's buckets now rather than in a user's first runs."""
    if key.forward == "compiled" and zerogpu.active():
        raise ConfigError("TALON_FORWARD=compiled: ZeroGPU does not support torch.compile; use auto (CUDA graphs)")
    draft = None if key.draft.strip().lower() == "none" else key.draft
    target_lm, draft_lm = load_pair(key.target, draft, key.dtype, key.device, key.allow_remote_code,
                                    key.cache_dir, key.draft_quant, key.target_weights, key.prepack)
    cost_cache = Path(key.cost_cache) if key.cost_cache else None
    engine = Engine(target_lm, draft_lm, forward=key.forward, cost_cache=cost_cache,
                    chain=key.chain, fold=key.fold)
    if key.forward == "compiled" and precompile:  # (resolve_forward refused it off CUDA)
        logger.info("compiled the draft model's steps in %.0f s", engine.forwards.precompile())
    logger.info("engine: %s on %s, forward %s", key.describe(), engine.target.device, engine.forward_path)
    return engine
