"""What would move the GPU prediction: a committed curve replayed on the lesson atlases with its
draft forward changed, one change a row (a prediction from measured costs, like the README's).

    python -m experiments.gpu_whatif data/gpu_costs/h100-80gb-hbm3-compiled-qwen2.5-7b.cost.json

Rows: the curve as committed; its draft forwards without the loop's readout (the part beyond
the bare replay, which device-side drafting could remove), with some of it back; and the bare
replay scaled down (a cheaper draft forward). The readout is the first draft cost minus the
bare replay's, given with ``--bare-ms`` (the curve's provenance names both).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

from talon.cli.main import main as talon_main

REPO = Path(__file__).resolve().parents[1]

DRAFTERS = ("none", "retrieval", "model", "hybrid")


def predict(curve: dict, atlases: Path) -> dict[str, float]:
    """tok/s per drafter: ``python -m talon atlas sweep`` over ``curve``."""
    path = Path("/tmp") / f"talon-whatif-{id(curve)}.cost.json"
    path.write_text(json.dumps(curve))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = talon_main(["atlas", "sweep", str(atlases), "--costs", str(path), "--grid",
                           "drafter=" + ",".join(DRAFTERS), "--json", "--workers", "1"])
    path.unlink()
    if code:
        raise SystemExit(code)
    return {r["values"]["drafter"]: r["tokens_per_s"] for r in json.loads(out.getvalue())["rows"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("curve", type=Path, help="a talon-cost/1 file (data/gpu_costs/...)")
    p.add_argument("--bare-ms", type=float, required=True, help="the bare replay of a 1-node draft forward, ms")
    p.add_argument("--atlases", type=Path, default=REPO / "data" / "lessons")
    args = p.parse_args(argv)
    base = json.loads(args.curve.read_text())
    readout = base["draft_s"][0] - args.bare_ms / 1e3
    bare = [s - readout for s in base["draft_s"]]
    rows = [("as committed", base["draft_s"])]
    rows += [(f"readout {ms:.1f} ms (bare replay + {ms:.1f})", [s + ms / 1e3 for s in bare]) for ms in (0.6, 0.3, 0.0)]
    rows += [(f"bare replay x{f:g}, no readout", [s * f for s in bare]) for f in (0.5, 0.3)]
    print(f"{args.curve.name}: a 1-node draft forward {1e3 * base['draft_s'][0]:.2f} ms as committed, "
          f"readout {1e3 * readout:.2f} ms, verification {1e3 * base['verify_s'][0]:.2f} ms")
    print("| draft forward | 1-node ms | share of a verification | " + " | ".join(DRAFTERS) + " | hybrid / none |")
    print("| --- | ---: | ---: | " + " | ".join("---:" for _ in DRAFTERS) + " | ---: |")
    for label, draft in rows:
        tok_s = predict({**base, "draft_s": draft}, args.atlases)
        print(f"| {label} | {1e3 * draft[0]:.2f} | {draft[0] / base['verify_s'][0]:.0%} | "
              + " | ".join(f"{tok_s[d]:.1f}" for d in DRAFTERS) + f" | {tok_s['hybrid'] / tok_s['none']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
