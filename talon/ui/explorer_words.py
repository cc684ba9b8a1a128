"""The Threshold explorer's words, as the panel shows them (HTML): the greedy-only note, the
progress bar, what the loaded atlas holds, what Apply did. Its model is ``talon.atlas.explorer``."""

from __future__ import annotations

from typing import Any

from talon import figures as F
from talon.atlas.data import Atlas
from talon.atlas.explorer import Knobs
from talon.knobs import default



def greedy_note(temperature: Any) -> str:
    """Said while the temperature control is above 0: the explorer replays greedy decoding only."""
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        return ""
    return (f'<div class="talon-greedy-note">Exact replay is greedy only: the explorer scores temperature 0. '
            f"With temperature {float(temperature):g} on the left, sampled runs accept differently (the atlas does "
            "not hold the target's probabilities), so sampling is out of its scope.</div>")


def progress_html(fraction: float, message: str) -> str:
    width = max(0.0, min(1.0, fraction)) * 100
    return (f'<div class="talon-progress"><div class="bar" style="width: {width:.0f}%"></div></div>'
            f'<div class="talon-status">{F.esc(message)}</div>')


def atlas_words(atlas: Atlas | None) -> str:
    """What the loaded atlas holds, in one line."""
    if atlas is None:
        return ('<div class="talon-status">No atlas yet. <b>Record</b> one for the prompt on the left (the models '
                "run once), or upload one; then every knob below re-scores instantly, with no model.</div>")
    record = atlas.record
    took = f", recorded in {record['run_s'] + record['atlas_s']:.1f} s" if {"run_s", "atlas_s"} <= set(record) else ""
    prompt = atlas.prompt if len(atlas.prompt) <= 80 else atlas.prompt[:79] + "…"
    return (f'<div class="talon-atlas-held">Atlas of “{F.esc(prompt)}”: {len(atlas.output)} tokens of the target\'s '
            f"greedy text, {len(atlas.children):,} draft nodes (up to N {atlas.spec.n_nodes}, K {atlas.spec.root_k}, "
            f"k {atlas.spec.top_k}, depth {atlas.spec.max_depth}){took}; "
            f"{F.esc(str(atlas.models.get('target', '')))} with {F.esc(str(atlas.models.get('draft', '')))}.</div>")


def apply_words(knobs: Knobs, what: str) -> str:
    words = f"Applied {what} to the controls on the left: {F.config_words(knobs.values())}."
    if knobs.retrieval_min_match != default("retrieval.min_match"):
        words += (f" Min match {knobs.retrieval_min_match} has no control there (runs use "
                  f"{default('retrieval.min_match')}); on the command line: --retrieval-min-match "
                  f"{knobs.retrieval_min_match}.")
    return words + (" The prompt box, the length and greedy sampling are the atlas's: press Run to decode it "
                    "for real.")
