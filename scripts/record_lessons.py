"""Record the lesson atlases the app ships (``data/lessons/``): a few prompts of each Spec-Bench
suite on the embedded pair as the app runs it (dtype auto, the draft int8 on a CPU), with a
superset wide enough to replay EAGLE-3's default tree (top-10 children, a static beam of 10,
depth 8) exactly. Each file is a gzipped ``talon-atlas/1``.

    .venv/bin/python -m scripts.record_lessons --limit 2 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
import time
from pathlib import Path

from talon.atlas.data import AtlasSpec
from talon.atlas.record import record_atlas
from talon.engine.build import build_engine
from talon.lessons import lesson_configs
from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET
from talon.run_config import RunConfig
from talon.settings import PairKey, Settings
from talon.specbench import SPECBENCH_SUITES, default_data_dir, load_prompts

REPO = Path(__file__).resolve().parents[1]

# EAGLE-3's default tree (SafeAILab/EAGLE eagle/model/ea_model.py: top_k=10, depth=7 expansions
# after the root's layer, total_token=60) fits inside: K and k up to 10, depth up to 8. Whatever
# else a lesson replays (TALON's adaptive trees, the three drafters) is covered node by node.
LESSON_SPEC = AtlasSpec(n_nodes=64, root_k=10, top_k=10, max_depth=8, beam=10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suites", default=",".join(SPECBENCH_SUITES))
    p.add_argument("--limit", type=int, default=2)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=REPO / "data" / "lessons")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = Settings.from_env()
    engine = build_engine(PairKey.from_settings(settings, target=EMBEDDED_TARGET, draft=EMBEDDED_DRAFT,
                                                dtype="auto", draft_quant="auto"))
    cfg = RunConfig(max_new_tokens=args.max_new_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    for prompt in load_prompts(default_data_dir(), args.suites.split(","), args.limit, args.start):
        start = time.perf_counter()
        atlas = record_atlas(engine, prompt.text, cfg, LESSON_SPEC, suite=prompt.suite, cover=lesson_configs(cfg))
        path = args.out / f"{prompt.suite}-{prompt.index}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(atlas.to_dict(), separators=(",", ":")).encode(), 9, mtime=0))
        logging.info("%s: %d tokens, %d entries, %.0f kB, %.0f s", path.name, len(atlas.output),
                     len(atlas.children), path.stat().st_size / 1e3, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
