"""The one way every front end gets its engine: the app, the command line, the benchmark, atlas
recording and ``talon costs`` each describe the pair they want as a ``PairKey`` (from the
``Settings``, with their own flags on top) and call ``build_engine``. So the forward, the chained
tree, the grouped-query fold and the prepacked layout a command runs are the ones the server
runs, and ``talon costs --probe`` measures the curves that server reads.
"""

from __future__ import annotations

import logging
from pathlib import Path

from talon.engine.engine import Engine
from talon.models import load_pair, zerogpu
from talon.run_config import ConfigError
from talon.settings import PairKey

logger = logging.getLogger(__name__)


def build_engine(key: PairKey, precompile: bool = True) -> Engine:
    """Load ``key``'s pair and make its engine on the configured forward. ``precompile``: on the
    compiled forward, compile the draft's buckets now rather than in a user's first runs."""
    if key.forward == "compiled" and zerogpu.active():
        raise ConfigError("TALON_FORWARD=compiled: ZeroGPU does not support torch.compile; use auto (CUDA graphs)")
    draft = None if key.draft.strip().lower() == "none" else key.draft
    target_lm, draft_lm = load_pair(key.target, draft, key.dtype, key.device, key.allow_remote_code,
                                    key.cache_dir, key.draft_quant, key.target_weights, key.prepack, key.aux_layers)
    cost_cache = Path(key.cost_cache) if key.cost_cache else None
    engine = Engine(target_lm, draft_lm, forward=key.forward, cost_cache=cost_cache,
                    chain=key.chain, fold=key.fold)
    if key.forward == "compiled" and precompile:  # (resolve_forward refused it off CUDA)
        logger.info("compiled the draft model's steps in %.0f s", engine.forwards.precompile())
    logger.info("engine: %s on %s, forward %s", key.describe(), engine.target.device, engine.forward_path)
    return engine
