"""The Threshold explorer's measured part, below the atlas explorer (``explorer_tab``): short
real runs of the current prompt over mu x N, or a ``talon.bench --sweep`` results.json
(``parse_sweep``), drawn as heatmaps per suite and method."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr

from talon import figures as F
from talon.server.facade import Controls, RunRequest, decode_all, user_error
from talon.settings import Settings
from talon.trace import TraceFileError, is_number, read_json_upload
from talon.ui.files import upload_path
from talon.ui.panel import ControlPanel, run_on_click, waiting_plot
from talon.ui.session import bounded
from talon.ui.stream import run_variants
from talon.ui.words import EXPLAIN

MAX_SWEEP_CELLS = 30


def parse_sweep(data: Any) -> list[F.MeasuredCell]:
    """Rows of a ``talon.bench --sweep`` results.json: {"env": ..., "results": [...]}."""
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise TraceFileError('not a sweep results file: expected a JSON object with a "results" list')
    rows = []
    for i, row in enumerate(data["results"]):
        if not isinstance(row, dict) or not is_number(row.get("mu")) or not is_number(row.get("budget")):
            raise TraceFileError(f"results[{i}] needs numeric 'mu' and 'budget'")
        metrics = {
            k: row.get(k) if is_number(row.get(k)) else None for k in ("mat", "tokens_per_second", "speedup_vs_ar")
        }
        rows.append(
            F.MeasuredCell(
                str(row.get("suite", "")), str(row.get("method", "")), float(row["mu"]), int(row["budget"]), **metrics
            )
        )
    if not rows:
        raise TraceFileError("the results list is empty")
    return rows


@dataclass
class MeasureView:
    progress: gr.HTML
    mat: gr.Plot
    speed: gr.Plot
    suite: gr.Dropdown
    method: gr.Dropdown
    state: gr.State

    def outputs(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


def parse_values(name: str, text: str, convert: Callable[[str], float]) -> list[float]:
    try:
        values = sorted({convert(part) for part in text.replace(";", ",").split(",") if part.strip()})
    except ValueError:
        raise user_error(f"{name}: write numbers separated by commas, got {text!r}") from None
    if not values:
        raise gr.Error(f"{name}: give at least one value")
    return values


def select_rows(rows: Sequence[F.MeasuredCell], suite: str | None, method: str | None) -> list[F.MeasuredCell]:
    return [r for r in rows if (not suite or r.suite == suite) and (not method or r.method == method)]


def measure_updates(
    view: MeasureView, rows: list[F.MeasuredCell], suite: str | None, method: str | None, status: str
) -> dict[Any, Any]:
    suites = sorted({r.suite for r in rows})
    methods = sorted({r.method for r in rows})
    suite = suite if suite in suites else (suites[0] if suites else None)
    method = method if method in methods else (methods[0] if methods else None)
    chosen = select_rows(rows, suite, method)
    return {
        view.progress: f'<div class="talon-status">{F.esc(status)}</div>',
        view.mat: F.sweep_heatmap(chosen, "mat"),
        view.speed: F.sweep_heatmap(chosen, "tokens_per_second"),
        view.suite: gr.update(choices=suites, value=suite),
        view.method: gr.update(choices=methods, value=method),
        view.state: rows,
    }


def make_measure(view: MeasureView, settings: Settings) -> Callable[..., Iterator[dict[Any, Any]]]:
    def sweep(
        prompt: str,
        rows_state: Any,
        mus: str = "0.02, 0.1, 0.3",
        budgets: str = "8, 16, 32",
        sweep_tokens: float = 24,
        **controls: Any,
    ) -> Iterator[dict[Any, Any]]:
        """Short runs of the current prompt for every (mu, N) pair: MAT and tokens/s heatmaps."""
        mu_values = parse_values("μ values", mus, float)
        budget_values = [int(b) for b in parse_values("budgets", budgets, lambda s: float(int(s)))]
        if len(mu_values) * len(budget_values) > MAX_SWEEP_CELLS:
            raise gr.Error(
                f"at most {MAX_SWEEP_CELLS} (μ, N) cells per sweep; got {len(mu_values) * len(budget_values)}"
            )
        base = dataclasses.replace(Controls(**controls), tree_mode="adaptive", max_new_tokens=sweep_tokens)
        rows: list[F.MeasuredCell] = []
        cancel = threading.Event()
        cells = [(mu, budget) for mu in mu_values for budget in budget_values]
        requests = [RunRequest(prompt, dataclasses.replace(base, mu=mu, budget=n)) for mu, n in cells]
        runs = decode_all(settings, requests, cancel).runs  # every cell in one device call
        for index, _, finished in run_variants(runs):
            if not finished:
                continue
            (mu, budget), s = cells[index], runs[index].summary
            rows.append(F.MeasuredCell("this prompt", f"{runs[index].cfg.drafter} · adaptive", mu, budget,
                                   s.mean_accepted_tokens, s.tokens_per_second))
            yield measure_updates(view, rows, None, None, f"{len(rows)} of {len(cells)} runs done")
        yield measure_updates(view, rows, None, None, f"sweep done: {len(rows)} runs of {int(sweep_tokens)} tokens")

    return sweep


def make_load_results(view: MeasureView) -> Callable[[Any], dict[Any, Any]]:
    @bounded("loading the sweep")
    def load_sweep(results_file: Any) -> dict[Any, Any]:
        """Show a ``python -m talon.bench --sweep`` results.json as heatmaps."""
        if not results_file:
            raise gr.Error("no file: upload the results.json of a sweep")
        try:
            rows = parse_sweep(read_json_upload(upload_path(results_file)))
        except (TraceFileError, OSError) as error:
            raise user_error(f"cannot read these results: {error}") from error
        return measure_updates(view, rows, None, None, f"loaded {len(rows)} results")

    return load_sweep


def make_filter_results(view: MeasureView) -> Callable[[str, str, Any], dict[Any, Any]]:
    @bounded("drawing the sweep")
    def filter_sweep(suite: str, method: str, rows: Any) -> dict[Any, Any]:
        return measure_updates(view, list(rows or []), suite, method, "") if rows else {}

    return filter_sweep


def build_measure_panel(panel: ControlPanel, settings: Settings) -> MeasureView:
    """The measured part, built and wired (call inside the Threshold explorer tab)."""
    with gr.Accordion("Measure with real runs, or load benchmark results (python -m talon.bench --sweep)",
                      open=False, elem_id="talon-real-sweep"):
        gr.Markdown(EXPLAIN["real_sweep"], elem_classes=["talon-explain"])
        with gr.Row():
            mus = gr.Textbox(label="μ values", value="0.02, 0.1, 0.3")
            budgets = gr.Textbox(label="Budgets N", value="8, 16, 32")
            tokens = gr.Slider(4, 128, value=24, step=1, label="New tokens per run")
        with gr.Row():
            go_button = gr.Button("Sweep the current prompt with real runs", variant="secondary")
            results = gr.File(label="…or load results.json", file_types=[".json"])
        with gr.Row():
            suite = gr.Dropdown(label="Suite", choices=[], value=None, allow_custom_value=True)
            method = gr.Dropdown(label="Method", choices=[], value=None, allow_custom_value=True)
        progress = gr.HTML("")
        with gr.Row():
            mat = waiting_plot("MAT by μ and N, from a sweep or loaded results.")
            speed = waiting_plot("Tokens/s by μ and N, from a sweep or loaded results.")
    view = MeasureView(progress=progress, mat=mat, speed=speed, suite=suite, method=method, state=gr.State([]))
    extra = {"mus": mus, "budgets": budgets, "sweep_tokens": tokens, "rows_state": view.state}
    run_on_click(go_button, make_measure(view, settings), panel, extra, view.outputs(), "sweep", settings)
    results.upload(make_load_results(view), [results], view.outputs(), api_name="load_sweep")
    filter_results = make_filter_results(view)
    for box in (suite, method):
        box.input(filter_results, [suite, method, view.state], view.outputs(), api_visibility="private")
    return view
