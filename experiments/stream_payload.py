"""Bytes the Decode tab streams per update, with and without skipping unchanged outputs.

Runs the app's own generate handler (no browser) on the configured models (the embedded pair
by default) and reports, per streamed update, the serialised size of every output it computed
(what was sent before outputs were deduplicated) against what it sends now. Usage:

    .venv/bin/python -m experiments.stream_payload [--max-new-tokens 64] [--prompt-index 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import gradio as gr

from talon import figures as F
from talon.server.examples import load_examples
from talon.settings import Settings
from talon.ui.decode_tab import decode_panel, make_generate
from talon.ui.session import Session


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-index", type=int, default=0, help="which example prompt (default: the app's)")
    args = parser.parse_args()
    prompt = load_examples()[args.prompt_index].prompt
    with gr.Blocks():
        view, _, _ = decode_panel()
    session = Measured(view)
    updates = list(make_generate(view, Settings.from_env())(prompt, session, max_new_tokens=args.max_new_tokens))
    streamed = session.payload[1:]  # the first update (no step yet) is the same either way
    before = session.before[1:]
    sent = [s for _, s in streamed]
    print(f"{len(updates)} updates, {len(session.steps)} steps, {len(streamed)} streamed with a step")
    print(f"bytes per streamed update: before {statistics.mean(before):,.0f} (every output, text with hover "
          f"titles), after {statistics.mean(sent):,.0f} (changed outputs only, titles after the run), "
          f"{100 * (1 - sum(sent) / sum(before)):.0f}% less; total {sum(before):,} -> {sum(sent):,}")
    return 0


class Measured(Session):
    """A session that also prices each streamed update the way it was sent before: every output,
    the text with its per-token hover titles."""

    def __init__(self, view) -> None:
        super().__init__()
        self.view, self.before = view, []

    def unsent(self, updates):
        fresh = super().unsent(updates)
        computed = self.payload[-1][0]
        if self.view.text in updates and self.steps:
            titled = F.text_html(self.steps, highlight=len(self.steps) - 1)
            computed += len(titled) - len(updates[self.view.text])
        self.before.append(computed)
        return fresh


if __name__ == "__main__":
    sys.exit(main())
