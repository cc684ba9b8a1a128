"""Peers outside Python, measured by their own scripts and merged into the report: llama.cpp's
server on the same GGUF pair (``scripts/llamacpp_peer.sh`` writes one JSON row per configuration
and prompt).

The rows come from another process, so the comparison is of two runs on one host, not one run:
the section says so, and it says whether the rows cover exactly the report's prompts.

    python -m talon.bench.peers bench-out/results.json llamacpp-peer/llamacpp.jsonl
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from talon.bench.options import ALL_SUITES_ROW

PLAIN = "plain"  # the configuration every other one's speedup is measured against
NEEDED = ("engine", "config", "suite", "index", "new_tokens", "seconds")


class PeerRowsError(ValueError):
    """A peer rows file that cannot be read as rows."""


@dataclass(frozen=True)
class PeerCell:
    """One configuration of one peer over one suite (or all)."""

    serving: str  # the peer engine, as its rows name it ("llamacpp")
    config: str
    suite: str
    prompts: int
    tokens: int
    seconds: float
    drafted: int | None
    accepted: int | None
    equal_to_plain: int  # prompts whose tokens equal the peer's own plain run
    compared: int  # prompts that had a plain run to compare with

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def read_peer_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a peer file; a line that is not a row is a PeerRowsError naming it."""
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise PeerRowsError(f"{path}:{number}: not JSON ({err})") from None
        missing = [k for k in NEEDED if not isinstance(row, dict) or k not in row]
        if missing:
            raise PeerRowsError(f"{path}:{number}: a peer row needs {', '.join(missing)}")
        if not (isinstance(row["seconds"], (int, float)) and row["seconds"] > 0):
            raise PeerRowsError(f"{path}:{number}: seconds must be a positive number")
        rows.append(row)
    if not rows:
        raise PeerRowsError(f"{path}: no peer rows")
    return rows


def peer_cells(rows: Sequence[dict[str, Any]]) -> list[PeerCell]:
    """Cells per (engine, configuration) and suite, suites in row order, then over all suites."""
    cells = []
    for serving, config in dict.fromkeys((r["engine"], r["config"]) for r in rows):
        mine = [r for r in rows if r["engine"] == serving and r["config"] == config]
        for suite in [*dict.fromkeys(r["suite"] for r in mine), ALL_SUITES_ROW]:
            chosen = [r for r in mine if suite == ALL_SUITES_ROW or r["suite"] == suite]
            drafted = [r.get("draft_n") for r in chosen]
            has_drafts = all(isinstance(d, int) for d in drafted) and any(drafted)
            compared = [r for r in chosen if r.get("equal_to_plain") is not None]
            cells.append(PeerCell(
                serving, config, suite, len(chosen), sum(r["new_tokens"] for r in chosen),
                sum(r["seconds"] for r in chosen),
                sum(drafted) if has_drafts else None,
                sum(r.get("draft_n_accepted") or 0 for r in chosen) if has_drafts else None,
                sum(bool(r["equal_to_plain"]) for r in compared), len(compared),
            ))
    return cells


def peer_section(rows: Sequence[dict[str, Any]], talon: dict[str, Any]) -> str:
    """The markdown section: each peer configuration's tokens/s per suite, its speedup over its
    own plain decoding, drafts accepted, greedy tokens equal to its own plain run; then where
    ``talon`` (a results.json dict) stands against the best of them."""
    cells = peer_cells(rows)
    suites = list(dict.fromkeys(c.suite for c in cells))
    by_key = {(c.serving, c.config, c.suite): c for c in cells}
    host = rows[0].get("host", {})
    peer_prompts = {(r["suite"], r["index"]) for r in rows}
    ours = {(s["suite"], s["prompt_index"]) for s in talon.get("samples", [])}
    same = "the same prompts as the table above" if peer_prompts == ours else (
        f"**not** the same prompts as the table above ({len(peer_prompts)} against {len(ours)})")
    lines = [
        "## llama.cpp on the same GGUF pair\n",
        f"{host.get('llama.cpp', 'llama.cpp')}, {host.get('threads', '?')} threads, on {host.get('cpu', '?')}; "
        f"{host.get('target', '')} / draft {host.get('draft', '')}; greedy; {same}. Measured by "
        "`bash scripts/llamacpp_peer.sh` in its own process (two runs on one host, not one run). "
        "Each cell: tokens/s (wall time of the request, prefill included, as Talon's).\n",
        "| engine · configuration | " + " | ".join(suites) + " | vs own plain | accepted / drafted | "
        "tokens = own plain |",
        "| --- | " + " | ".join("---:" for _ in suites) + " | ---: | ---: | ---: |",
    ]
    for serving, config in dict.fromkeys((c.serving, c.config) for c in cells):
        total = by_key[(serving, config, ALL_SUITES_ROW)]
        plain = by_key.get((serving, PLAIN, ALL_SUITES_ROW))
        vs_plain = f"{total.tokens_per_second / plain.tokens_per_second:.2f}x" if plain else "–"
        accept = "–" if total.acceptance is None else f"{100 * total.acceptance:.0f}% of {total.drafted}"
        equal = f"{total.equal_to_plain}/{total.compared}" if config != PLAIN else "–"
        per_suite = [f"{by_key[(serving, config, s)].tokens_per_second:.1f}" if (serving, config, s) in by_key
                     else "–" for s in suites]
        lines.append(f"| {serving} · {config} | " + " | ".join(per_suite) + f" | {vs_plain} | {accept} | {equal} |")
    lines.append("")
    lines.append(standing(cells, talon))
    return "\n".join(lines) + "\n"


def standing(cells: Sequence[PeerCell], talon: dict[str, Any]) -> str:
    """One paragraph: Talon's fastest method against the peer's fastest configuration, in tokens/s
    and in speedup over each one's own plain decoding."""
    overall = [c for c in cells if c.suite == ALL_SUITES_ROW]
    results = [r for r in talon.get("results", []) if r["suite"] == ALL_SUITES_ROW and "mu" not in r]
    ar = next((r for r in results if r["method"] == "ar"), None)
    if not overall or ar is None:
        return ""
    best_peer = max(overall, key=lambda c: c.tokens_per_second)
    peer_plain = next((c for c in overall if c.serving == best_peer.serving and c.config == PLAIN), None)
    best_talon = max((r for r in results if r["method"].startswith("talon")), key=lambda r: r["tokens_per_second"],
                     default=None)
    if best_talon is None or peer_plain is None:
        return ""
    return (
        f"Talon's fastest method, `{best_talon['method']}`, runs at {best_talon['tokens_per_second']:.1f} tok/s, "
        f"**{best_talon['tokens_per_second'] / best_peer.tokens_per_second:.2f}x** {best_peer.serving}'s fastest "
        f"configuration (`{best_peer.config}`, {best_peer.tokens_per_second:.1f} tok/s). Over each one's own "
        f"plain decoding: Talon {best_talon['tokens_per_second'] / ar['tokens_per_second']:.2f}x "
        f"(ar {ar['tokens_per_second']:.1f} tok/s), {best_peer.serving} "
        f"{best_peer.tokens_per_second / peer_plain.tokens_per_second:.2f}x "
        f"(plain {peer_plain.tokens_per_second:.1f} tok/s)."
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        try:
            talon = json.loads(Path(args[0]).read_text(encoding="utf-8"))
        except ValueError as err:
            raise PeerRowsError(f"{args[0]}: not a results.json ({err})") from None
        print(peer_section(read_peer_rows(args[1]), talon))
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
