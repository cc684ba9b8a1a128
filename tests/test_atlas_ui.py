"""The Threshold explorer's atlas, in process on tiny random models: recording through the Record
button's handler (the real cached loader on saved checkpoints), every heatmap cell is the replay
of its configuration, the best marked is ``best_row``, the Pareto front is ``pareto``, the knobs
re-score, Apply sets the controls that run that configuration, atlas files round-trip and a bad
upload is a clear error, and the greedy-only note."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gradio as gr
import pytest

from talon import figures as F
from talon.atlas.data import Atlas
from talon.atlas.explorer import (
    AtlasSession,
    Knobs,
    around,
    explore,
    mu_budget_grid,
    root_top_grid,
)
from talon.atlas.replay import replay
from talon.atlas.sweep import best_row, pareto
from talon.figures.atlas import knob_text
from talon.run_config import ConfigError
from talon.server.controls import Controls
from talon.server.examples import load_examples
from talon.settings import Settings
from talon.ui.explorer_tab import (
    ExplorerView,
    explorer_panel,
    greedy_note,
    make_apply,
    make_record,
    make_rescore,
    make_show_replayed_step,
    make_to_best,
    make_upload,
)
from talon.ui.files import read_atlas, write_atlas
from talon.ui.panel import build_controls
from tests.tiny import save_tiny_pair

UI_PROMPT = "one two three, one two three, one two three, one"
# every step drafts a full tree (no cost stop), so the knobs change what is drafted
PLAIN = dict(cost_aware=False, min_conf=0.0, max_new_tokens=40)


@pytest.fixture(scope="module")
def ui() -> tuple[ExplorerView, dict[str, Any]]:
    """The explorer's components and the left panel's controls, built as the app builds them."""
    with gr.Blocks():
        panel = build_controls(Settings(), load_examples())
        view = explorer_panel()
    return view, panel.components


@pytest.fixture(scope="module")
def ui_recorded(ui: tuple[ExplorerView, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[AtlasSession, list[dict[Any, Any]]]:
    """An atlas recorded by the Record button's handler on tiny checkpoints, and its updates."""
    root = tmp_path_factory.mktemp("atlas-models")
    target, draft = save_tiny_pair(root)
    settings = Settings(target=str(target), draft=str(draft), device="cpu", dtype="float32",
                        cache_dir=root / "cache")
    session = AtlasSession()
    updates = list(make_record(ui[0], settings)(UI_PROMPT, session, min_match=2, **PLAIN))
    return session, updates


def test_before_an_atlas_every_plot_says_what_will_draw_it(ui) -> None:
    """No blank boxes on a first visit: each plot of the explorer opens on a figure that says what
    it will show and what it waits for."""
    view = ui[0]
    plots = [view.mu_mat, view.mu_speed, view.k_mat, view.k_speed, view.pareto, view.lengths, view.tree, view.gates]
    for plot in plots:
        assert plot.value is not None, plot.elem_id
        words = json.dumps(plot.value)
        assert "atlas first" in words or "appear here" in words, (plot.elem_id, words[:200])


def test_record_streams_progress_then_loads_the_atlas_and_sets_the_knobs(ui, ui_recorded) -> None:
    view, _ = ui
    session, updates = ui_recorded
    assert session.atlas is not None and len(session.atlas.output) == PLAIN["max_new_tokens"]
    bars = [u[view.status] for u in updates[:-1]]
    assert len(bars) >= 3 and all('class="talon-progress"' in b for b in bars), "progress streams"
    final = updates[-1]
    assert "Atlas of" in final[view.status] and str(len(session.atlas.output)) in final[view.status]
    assert final[view.download] and as_json(read_atlas(final[view.download])) == as_json(session.atlas)
    # the knobs are the left panel's controls that made it
    assert final[view.knobs["min_conf"]] == 0.0 and final[view.knobs["cost_aware"]] is False
    assert final[view.knobs["budget"]] == Controls().budget
    assert "MAT" in final[view.score] and final[view.tree].layout.title.text.startswith("Draft tree, step 0")


def as_json(atlas: Atlas) -> Any:
    """The atlas as its file holds it."""
    return json.loads(json.dumps(atlas.to_dict()))


def _t(value: Any) -> str:
    """A knob's value as the heatmaps' category axes write it."""
    return knob_text(value)


def test_every_heatmap_cell_is_the_replay_of_its_configuration(ui, ui_recorded) -> None:
    view, _ = ui
    session, _ = ui_recorded
    atlas = session.atlas
    knobs = Knobs(mu=0.1, budget=12, root_k=3, top_k=2, min_conf=0.0, cost_aware=False)
    updates = make_rescore(view)(session, 0, **knobs.values())
    for plot, grid, x_key, y_key, metric in (
        (view.mu_mat, mu_budget_grid(knobs), "budget", "mu", "mat"),
        (view.mu_speed, mu_budget_grid(knobs), "budget", "mu", "tokens_per_s"),
        (view.k_mat, root_top_grid(knobs), "top_k", "root_k", "mat"),
        (view.k_speed, root_top_grid(knobs), "top_k", "root_k", "tokens_per_s"),
    ):
        heat = updates[plot].data[0]
        assert len(heat.x) * len(heat.y) == len(grid)
        for cell in grid:
            result = replay(atlas, cell.config(atlas))  # a fresh replay of that configuration
            expected = result.mat if metric == "mat" else result.summary.tokens_per_second
            z = heat.z[list(heat.y).index(_t(getattr(cell, y_key)))][list(heat.x).index(_t(getattr(cell, x_key)))]
            assert z == pytest.approx(expected, rel=1e-9), (metric, cell)
    # the knobs' own cell is outlined, in both grids
    assert "sliders" in [t.name for t in updates[view.mu_mat].data]
    assert "sliders" in [t.name for t in updates[view.k_mat].data]


def test_the_grid_moves_with_the_knobs_and_the_knobs_change_the_score(ui, ui_recorded) -> None:
    view, _ = ui
    session, _ = ui_recorded
    assert around((1, 2, 4, 8, 16), 5, 3) == [4, 5, 8] and around((1, 2, 4), 1, 3) == [1, 2, 4]
    rescore = make_rescore(view)
    wide = Knobs(budget=32, root_k=4, top_k=2, mu=0.0, max_depth=8, min_conf=0.0, cost_aware=False)
    chain = dataclasses.replace(wide, tree="chain", budget=2)
    a, b = rescore(session, 0, **wide.values()), rescore(session, 0, **chain.values())
    assert a[view.score] != b[view.score]
    for knobs, html in ((wide, a[view.score]), (chain, b[view.score])):
        result = replay(session.atlas, knobs.config(session.atlas))
        assert f"{result.mat:.2f}" in html and f"{result.summary.tokens_per_second:.1f}" in html
        assert f"{result.summary.steps}</div>" in html
    assert list(a[view.mu_mat].data[0].x) != list(b[view.mu_mat].data[0].x), "the mu x N grid is centred on N"


def test_best_marked_is_best_row_and_the_pareto_front_is_pareto(ui, ui_recorded) -> None:
    view, _ = ui
    session, _ = ui_recorded
    knobs = Knobs(budget=8, root_k=2, top_k=2, mu=0.1, min_conf=0.0, cost_aware=False)
    found = explore(session, knobs)
    rows = found.rows
    assert len(rows) == len({tuple(r.values.items()) for r in rows}) >= 30
    best = best_row(rows)
    assert found.best.values == best.values
    updates = make_rescore(view)(session, 0, **knobs.values())
    assert F.best_words(best, found.current) in updates[view.score].replace("&#39;", "'")
    # the star sits on the best cell of every heatmap that holds it
    starred = 0
    for plot, x_key, y_key in ((view.mu_mat, "budget", "mu"), (view.k_speed, "top_k", "root_k")):
        stars = [t for t in updates[plot].data if t.name == "best ★"]
        heat = updates[plot].data[0]
        in_grid = _t(best.values[x_key]) in heat.x and _t(best.values[y_key]) in heat.y and all(
            best.values[k] == knobs.values()[k] for k in best.values if k not in (x_key, y_key))
        assert bool(stars) == in_grid
        if stars:
            starred += 1
            assert (stars[0].x[0], stars[0].y[0]) == (_t(best.values[x_key]), _t(best.values[y_key]))
    fig = updates[view.pareto]
    traces = {t.name: t for t in fig.data}
    front = pareto(rows)
    assert sorted(zip(traces["Pareto front"].x, traces["Pareto front"].y)) == sorted(
        (1000 * r.step_s, r.mat) for r in front)
    assert (traces["best ★ (tokens/s)"].x[0], traces["best ★ (tokens/s)"].y[0]) == (1000 * best.step_s, best.mat)
    assert len(traces["replayed configurations"].x) == len(rows)
    # moving the knobs to the best scores the best
    moved = make_to_best(view)(session, **knobs.values())
    assert {name: moved[view.knobs[name]] for name in view.knobs} == best.values


def test_apply_gives_the_controls_that_run_that_configuration(ui, ui_recorded) -> None:
    view, components = ui
    session, _ = ui_recorded
    knobs = Knobs(drafter="model", tree="static", budget=24, root_k=5, top_k=3, mu=0.2, max_depth=6,
                  min_conf=0.05, retrieval_min_match=2, graft_threshold=4, cost_aware=False)
    prompt = gr.Textbox()
    applied = make_apply(view, components, best=False, prompt=prompt)(session, **knobs.values())
    by_name = {name: applied[c] for name, c in components.items() if c in applied}
    cfg = Controls(**by_name).to_config(1024)
    replayed = knobs.config(session.atlas)
    assert cfg.tree == replayed.tree and cfg.drafter == replayed.drafter
    assert cfg.retrieval.graft_threshold == replayed.retrieval.graft_threshold
    # Run then decodes what was replayed: the atlas's prompt, its length, greedy
    assert applied[prompt] == session.atlas.prompt
    assert cfg.max_new_tokens == len(session.atlas.output) and cfg.sampling.greedy
    assert "Applied the knobs" in applied[view.status]
    # the best: the controls of best_row's configuration
    best = make_apply(view, components, best=True)(session, **knobs.values())
    found = explore(session, knobs)
    best_cfg = Controls(**{n: best[c] for n, c in components.items() if c in best}).to_config(1024)
    assert best_cfg.tree == found.best.config.tree
    # a min_match the left panel cannot express is said plainly
    odd = make_apply(view, components, best=False)(session, **{**knobs.values(), "retrieval_min_match": 5})
    assert "--retrieval-min-match 5" in odd[view.status]


def test_asking_for_more_than_the_atlas_holds_says_so(ui, ui_recorded) -> None:
    view, _ = ui
    session, _ = ui_recorded
    spec = session.atlas.spec
    knobs = Knobs(root_k=spec.root_k + 4, top_k=2, budget=64, mu=0.0, min_conf=0.0, cost_aware=False)
    html = make_rescore(view)(session, 0, **knobs.values())[view.score]
    assert "asks for more than the atlas recorded" in html and "the atlas holds" in html
    assert "coverage 100 %" not in html


def test_step_view_shows_a_replayed_tree(ui, ui_recorded) -> None:
    view, _ = ui
    session, _ = ui_recorded
    make_rescore(view)(session, 0, **Knobs(min_conf=0.0, cost_aware=False).values())
    steps = session.result.steps
    shown = make_show_replayed_step(view)(2, session)
    assert shown[view.tree].layout.title.text.startswith("Draft tree, step 2")
    points = sum(len(t.x) for t in shown[view.tree].data if t.type == "scatter" and t.mode and "markers" in t.mode)
    assert points >= len(steps[2].tokens)
    assert make_show_replayed_step(view)(10**6, session)[view.step]["value"] == len(steps) - 1


def test_atlas_files_round_trip_and_bad_uploads_are_clear_errors(ui, ui_recorded, tmp_path: Path) -> None:
    view, _ = ui
    session, _ = ui_recorded
    path = write_atlas(session.atlas)
    fresh = AtlasSession()
    loaded = make_upload(view)(path, fresh, **Knobs().values())
    assert isinstance(fresh.atlas, Atlas) and as_json(fresh.atlas) == as_json(session.atlas)
    assert "Atlas of" in loaded[view.status] and "MAT" in loaded[view.score]
    bad = tmp_path / "bad.json"
    for content, message in (
        ("{not json", "cannot load this atlas"),
        (json.dumps({"format": "talon-trace/1"}), "not a draft atlas"),
        (json.dumps({**session.atlas.to_dict(), "children": [[0, [], [1], [2.0]]]}), "probability"),
    ):
        bad.write_text(content)
        with pytest.raises(gr.Error, match=message):
            make_upload(view)(str(bad), fresh, **Knobs().values())
        assert as_json(fresh.atlas) == as_json(session.atlas), "a bad upload keeps the atlas on screen"
    with pytest.raises(gr.Error, match="no file"):
        make_upload(view)(None, fresh, **Knobs().values())


def test_temperature_above_zero_says_replay_is_greedy_only(ui, ui_recorded) -> None:
    assert greedy_note(0.0) == "" and greedy_note(0) == ""
    note = greedy_note(0.7)
    assert "greedy only" in note and "0.7" in note
    # the knobs still replay (greedy): a bad knob is a clear error, not a crash
    view, _ = ui
    session, _ = ui_recorded
    with pytest.raises(gr.Error, match="budget must be an integer"):
        make_rescore(view)(session, 0, **{**Knobs().values(), "budget": 2.5})
    with pytest.raises(gr.Error, match="budget must be an integer in"):
        make_to_best(view)(session, **{**Knobs().values(), "budget": 10_000})
    with pytest.raises(gr.Error, match="tree mode must be one of"):
        make_rescore(view)(session, 0, **{**Knobs().values(), "tree": "<b>bushy</b>"})


def test_without_an_atlas_the_explorer_says_what_to_do(ui) -> None:
    view, components = ui
    updates = make_rescore(view)(AtlasSession(), 0, **Knobs().values())
    assert "No atlas yet" in updates[view.score]
    with pytest.raises(gr.Error, match="no atlas yet"):
        make_apply(view, components, best=True)(AtlasSession(), **Knobs().values())
    for ask in (lambda session: explore(session, Knobs()), lambda session: session.score(Knobs())):
        with pytest.raises(ConfigError, match="no atlas yet"):  # the model itself, not only its view
            ask(AtlasSession())


def test_the_explorer_s_model_imports_no_gradio() -> None:
    """The model under the Threshold explorer tab is testable and usable without the UI."""
    probe = "import sys, talon.atlas.explorer; print(sorted(m for m in sys.modules if m.split('.')[0] == 'gradio'))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
