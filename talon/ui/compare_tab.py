"""The Compare tab, built and wired, and its behaviour: run configuration A and a variant B on one prompt, one after the
other, and render both runs (texts, trees, a side-by-side chart and a summary table)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.run_config import TREE_MODES, RunConfig
from talon.server.facade import Controls, RunRequest, decode_all, drafter_choices, initial_preset
from talon.settings import Settings
from talon.ui.panel import ControlPanel, follow_preset, run_on_click, waiting_plot
from talon.ui.session import CompareSession
from talon.ui.stream import run_variants
from talon.ui.words import EXPLAIN


@dataclass
class CompareView:
    summary: gr.HTML
    text_a: gr.HTML
    text_b: gr.HTML
    tree_a: gr.Plot
    tree_b: gr.Plot
    chart: gr.Plot
    state: gr.State

    def outputs(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    def updates(self, cmp: CompareSession, status: str = "") -> dict[Any, Any]:
        out: dict[Any, Any] = {self.state: cmp, self.summary: compare_summary_html(cmp, status)}
        for (label, steps), text, tree in zip(cmp.runs, (self.text_a, self.text_b), (self.tree_a, self.tree_b)):
            out[text] = F.text_html(steps, highlight=len(steps) - 1)
            out[tree] = (
                F.tree_figure(steps[-1], F.token_vocab(steps[-50:]))
                if steps
                else F.empty_figure(f"{label}: no steps yet")
            )
        if cmp.runs:
            out[self.chart] = F.compare_figure(cmp.runs)
        return out


def compare_summary_html(cmp: CompareSession, status: str) -> str:
    rows = []
    for (label, steps), summary in zip(cmp.runs, cmp.summaries + [None] * len(cmp.runs)):
        tokens = sum(len(st.new_tokens) for st in steps)
        seconds = summary.seconds if summary else (F.step_end_times(steps)[-1] if steps else 0.0)
        mat = tokens / len(steps) if steps else 0.0
        tps = tokens / seconds if seconds > 0 else 0.0
        rows.append(
            f"<tr><td>{F.esc(label)}</td><td>{mat:.2f}</td><td>{tps:.1f}</td><td>{tokens}</td><td>{len(steps)}</td></tr>"
        )
    table = (
        "<table><tr><th>run</th><th>MAT</th><th>tokens/s</th><th>tokens</th><th>steps</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    note = f'<div class="talon-status">{F.esc(status)}</div>' if status else ""
    return f'<div class="talon-summary talon-compare">{table}{note}</div>'


def describe(cfg: RunConfig) -> str:
    t = cfg.tree
    gate = f", μ {t.mu:g}" if t.mode == "adaptive" else ""
    return f"{cfg.drafter} · {t.mode} · N {t.budget}{gate}"


def make_compare(view: CompareView, settings: Settings) -> Callable[..., Iterator[dict[Any, Any]]]:
    def compare(
        prompt: str,
        cmp: CompareSession,
        tree_mode_b: str = "static",
        drafter_b: str = "hybrid",
        mu_b: float = 0.1,
        **controls: Any,
    ) -> Iterator[dict[Any, Any]]:
        """Run the current configuration (A) and a variant (B) on the same prompt, one after the other."""
        a = Controls(**controls)
        b = dataclasses.replace(a, tree_mode=tree_mode_b, drafter=drafter_b, mu=mu_b)
        cancel = threading.Event()
        runs = decode_all(settings, [RunRequest(prompt, c) for c in (a, b)], cancel).runs  # one device call
        cmp.runs, cmp.summaries, cmp.cancel = [], [], cancel
        for index, steps, finished in run_variants(runs):
            label, run = "AB"[index], runs[index]
            if len(cmp.runs) == index:
                cmp.runs.append((f"{label}: {describe(run.cfg)}", steps))
            if finished:
                cmp.summaries.append(run.summary)
            else:
                yield view.updates(cmp, f"running {label}… step {len(steps)}")
        yield view.updates(cmp)

    return compare


def build_compare_tab(panel: ControlPanel, settings: Settings) -> CompareView:
    """The Compare tab, built and wired (call inside the tab)."""
    gr.Markdown(EXPLAIN["compare"], elem_classes=["talon-explain"])
    with gr.Row():
        tree_b = gr.Radio(label="B: tree", choices=list(TREE_MODES), value="static")
        kinds, kind = drafter_choices(settings, initial_preset(settings), Controls().drafter)
        drafter_b = gr.Radio(label="B: drafter", choices=list(kinds), value=kind)
        mu_b = gr.Slider(0.0, 1.0, value=Controls().mu, step=0.01, label="B: gate μ")
    go_button = gr.Button("Run A and B", variant="primary", elem_id="talon-compare-run")
    summary = gr.HTML(compare_summary_html(CompareSession(), "Press “Run A and B”."))
    chart = waiting_plot("MAT and tokens/s of A and B appear here after “Run A and B”.")
    with gr.Row():
        with gr.Column(min_width=320):
            text_a = gr.HTML(F.text_html([]), max_height=260)
            tree_a = waiting_plot("A's draft tree, step by step.")
        with gr.Column(min_width=320):
            text_b = gr.HTML(F.text_html([]), max_height=260)
            tree_b_plot = waiting_plot("B's draft tree, step by step.")
    view = CompareView(summary=summary, text_a=text_a, text_b=text_b, tree_a=tree_a, tree_b=tree_b_plot, chart=chart,
                       state=gr.State(CompareSession()))
    extra = {"tree_mode_b": tree_b, "drafter_b": drafter_b, "mu_b": mu_b, "cmp": view.state}
    run_on_click(go_button, make_compare(view, settings), panel, extra, view.outputs(), "compare", settings)
    follow_preset(panel.components["preset"], drafter_b, settings)
    return view
