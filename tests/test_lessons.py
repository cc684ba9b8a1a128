"""The lessons (talon/lessons): every number is a replay of the configuration it names, the
funnel counts what the target accepted, the carrier of a step is its deepest accepted node's
source, gzipped atlases load (a broken one is refused), and the command prints the tables."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from talon.atlas.data import Atlas, AtlasSpec, load_atlases
from talon.atlas.record import record_atlas
from talon.atlas.replay import replay
from talon.cli.main import main
from talon.lessons import LESSONS_DIR, lesson_configs
from talon.lessons.adaptive import (
    DEPTHS,
    EAGLE3_SHAPE,
    adaptive_config,
    adaptive_lesson,
    sibling_ranks,
    static_config,
    summarize,
)
from talon.lessons.asynchrony import async_lesson, bound_of
from talon.lessons.hybrid import carried_shares, carrier, hybrid_lesson
from talon.run_config import RunConfig
from talon.trace import StepTrace, TraceFileError
from tests.tiny import atlas_engine

LESSON_PROMPTS = ["def add(a, b): return a + b\ndef sub(a, b): return a - b\ndef mul(a, b):",
           "one two three, one two three, one"]


@pytest.fixture(scope="module")
def lesson_atlases() -> list[Atlas]:
    engine = atlas_engine()
    spec = AtlasSpec(n_nodes=64, root_k=10, top_k=10, max_depth=8, beam=10)  # the lesson atlases' spec
    out = []
    for suite, prompt in zip(("humaneval", "sum"), LESSON_PROMPTS):
        base = RunConfig(max_new_tokens=32, draft_vocab=0)
        out.append(record_atlas(engine, prompt, base, spec, suite=suite, cover=lesson_configs(base)))
    return out


def test_adaptive_lesson_is_replays_of_the_named_trees(lesson_atlases: list[Atlas]) -> None:
    atlas = lesson_atlases[0]
    lesson = adaptive_lesson(atlas)
    for d in DEPTHS:
        assert lesson.static_mat[d] == pytest.approx(replay(atlas, static_config(atlas, d, 59)).mat)
    eagle3 = static_config(atlas, EAGLE3_SHAPE["max_depth"], EAGLE3_SHAPE["budget"])
    assert (eagle3.tree.root_k, eagle3.tree.top_k, eagle3.tree.max_depth, eagle3.tree.budget) == (10, 10, 8, 59)
    assert lesson.eagle3_mat == pytest.approx(replay(atlas, eagle3).mat)
    assert lesson.adaptive_mat == pytest.approx(replay(atlas, adaptive_config(atlas, 59)).mat)
    assert lesson.static_mat[lesson.best_depth] == max(lesson.static_mat.values())
    adaptive = replay(atlas, adaptive_config(atlas, 59))
    assert sum(lesson.funnel_rank.values()) == sum(len(s.accepted) - 1 for s in adaptive.steps)
    assert lesson.coverage == 1.0, "recording covered every node these trees ask for"
    both = summarize([adaptive_lesson(a) for a in lesson_atlases])
    one = both[0]
    assert one.suite == "humaneval" and both[-1].suite == "all" and both[-1].prompts == 2


def step(tokens: list[int], parents: list[int], q: list[float], accepted: list[int], sources: list[str]) -> StepTrace:
    n = len(tokens)
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    return StepTrace(step=0, tokens=tokens, texts=[""] * n, parents=parents, depths=depths, q_draft=q,
                     path_conf=q, sources=sources, gate_layer_max=[None] * n, gate_threshold=[None] * n,
                     gate_passed=[None] * n, target_top1=[0] * n, accepted=accepted, bonus_token=0,
                     bonus_text="", new_tokens=[tokens[i] for i in accepted[1:]] + [0])


def test_sibling_rank_and_carrier_by_hand() -> None:
    # root 0; children 1 (q .6), 2 (q .3); 2's children 3 (q .5), 4 (q .45). Accepted: 0 -> 2 -> 4.
    s = step([9, 1, 2, 3, 4], [-1, 0, 0, 2, 2], [1.0, 0.6, 0.3, 0.5, 0.45], [0, 2, 4],
             ["root", "model", "retrieval", "retrieval", "model"])

    class Result:
        steps = [s]

    ranks, depths = sibling_ranks(Result())  # type: ignore[arg-type]
    assert dict(ranks) == {2: 2} and dict(depths) == {1: 1, 2: 1}, "node 2 and node 4 are both second children"
    assert carrier(s) == "model", "the deepest accepted node carried the step"
    assert carrier(step([9, 1], [-1, 0], [1.0, 0.5], [0], ["root", "model"])) == "none"


def test_hybrid_lesson_is_replays_of_the_three_drafters(lesson_atlases: list[Atlas]) -> None:
    atlas = lesson_atlases[1]
    lesson = hybrid_lesson(atlas)
    base = RunConfig(max_new_tokens=len(atlas.output), cost_model="fixed", draft_vocab=0)
    for drafter in ("model", "retrieval", "hybrid"):
        assert lesson.mat[drafter] == pytest.approx(replay(atlas, base.replace(drafter=drafter)).mat)
    hybrid = replay(atlas, base)
    assert lesson.carried == [carrier(s) for s in hybrid.steps]
    assert sum(len(t) for t in lesson.step_tokens) == len(hybrid.summary.token_ids)
    assert sum(carried_shares(lesson).values()) == pytest.approx(1.0)
    assert lesson.mat["retrieval"] > 1.0, "the repeated phrase is what retrieval is for"


def test_gzipped_atlases_load_and_a_broken_one_is_refused(lesson_atlases: list[Atlas], tmp_path: Path) -> None:
    good = tmp_path / "a.json.gz"
    good.write_bytes(gzip.compress(json.dumps(lesson_atlases[0].to_dict()).encode()))
    assert load_atlases([tmp_path])[0].output == lesson_atlases[0].output
    (tmp_path / "b.json.gz").write_bytes(b"not gzip at all")
    with pytest.raises(TraceFileError, match="b.json.gz: not a readable gzip file"):
        load_atlases([tmp_path])


def test_lessons_command(lesson_atlases: list[Atlas], tmp_path: Path, capsys) -> None:
    for i, atlas in enumerate(lesson_atlases):
        (tmp_path / f"{i}.json").write_text(json.dumps(atlas.to_dict()))
    assert main(["lessons", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Why adaptive" in out and "adaptive / EAGLE-3's shape" in out and "Why hybrid" in out
    assert "| humaneval | 1 |" in out and "| all | 2 |" in out and "Why async" in out
    assert main(["lessons", str(tmp_path), "--lesson", "hybrid", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["hybrid"]
    assert [r["suite"] for r in rows] == ["humaneval", "sum"]
    assert main(["lessons", str(tmp_path / "missing")]) == 2


@pytest.mark.skipif(not LESSONS_DIR.is_dir(), reason="the lesson atlases are not bundled")
def test_the_bundled_lesson_atlases_cover_every_suite_and_replay_exactly() -> None:
    lesson_atlases = load_atlases([LESSONS_DIR])
    assert {a.suite for a in lesson_atlases} == {"mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa"}
    size = sum(p.stat().st_size for p in LESSONS_DIR.glob("*.json.gz"))
    assert size < 12e6, f"the lesson atlases grew to {size / 1e6:.1f} MB"
    assert all(adaptive_lesson(a).coverage == 1.0 for a in lesson_atlases), "recorded to cover every lesson tree"
    code = next(a for a in lesson_atlases if a.suite == "humaneval")
    lesson = adaptive_lesson(code)
    assert lesson.static_mat[7] != lesson.static_mat[8], "real drafts tell depths apart (tiny random ones do not)"
    eagle3 = static_config(code, EAGLE3_SHAPE["max_depth"], EAGLE3_SHAPE["budget"])
    assert lesson.eagle3_mat == pytest.approx(replay(code, eagle3).mat)
    assert lesson.adaptive_mat == pytest.approx(replay(code, adaptive_config(code, 59)).mat)


def test_async_bound_by_hand_and_from_replays(lesson_atlases: list[Atlas]) -> None:
    """Two steps: draft 1 / verify 3 / other 0.5, then draft 4 / verify 2 / other 0.5. Off:
    11 s; on, at best, each step costs max(draft, verify) + other: 3.5 + 4.5 = 8 s."""
    steps = [step([9, 1], [-1, 0], [1.0, 0.5], [0, 1], ["root", "model"]) for _ in range(2)]
    for s, (d, v) in zip(steps, ((1.0, 3.0), (4.0, 2.0))):
        s.draft_s, s.verify_s, s.other_s = d, v, 0.5
    b = bound_of("hand", steps, 4)
    assert (b.sync_s, b.async_s, b.overlap_s) == (11.0, 8.0, 3.0) and b.gain == pytest.approx(11 / 8)
    lesson = async_lesson(lesson_atlases[0])
    cfg = RunConfig(max_new_tokens=len(lesson_atlases[0].output), cost_model="fixed", draft_vocab=0)
    host = replay(lesson_atlases[0], cfg)
    assert lesson.host.sync_s == pytest.approx(sum(s.draft_s + s.verify_s + s.other_s for s in host.steps))
    assert lesson.gpu.verify_s < lesson.host.verify_s, "the H100's verification is cheaper"
    assert 1.0 <= lesson.gpu.gain <= 2.0


def test_the_visitors_own_atlas_joins_the_lessons(lesson_atlases: list[Atlas]) -> None:
    """The Threshold explorer's atlas is offered beside the bundled prompts; one recorded with the
    explorer's narrower superset is replayed as wide as it holds, and says its coverage."""
    from talon.atlas.data import AtlasSpec as Spec
    from talon.atlas.explorer import AtlasSession
    from talon.ui.lessons_tab import OWN, make_export, make_refresh, pick

    narrow = Atlas(**{**lesson_atlases[1].__dict__, "spec": Spec()})  # the explorer's default: K <= 8, k <= 4
    session = AtlasSession()
    session.load(narrow, None)
    choices, words, *_ = make_refresh()(OWN, 16, session)
    assert choices["choices"][-1][1] == OWN and "your atlas" in choices["choices"][-1][0]
    assert "K = 8, k = 4: as wide as this atlas holds" in re.sub(r"<[^>]+>", "", words)  # terms defined inline
    picked = pick(OWN, 16, session)
    assert picked is not None and picked.atlas is narrow and picked.index == len(picked.lessons) - 1
    assert Path(make_export()(None, OWN, 16, session)).read_text(encoding="utf-8").count("Why hybrid?") == 1


def test_the_async_lesson_reads_the_decode_tabs_measured_run() -> None:
    from talon.ui.lessons_tab import make_show
    from talon.ui.recording import load_recording
    from talon.ui.session import Session

    recording = load_recording()
    assert recording is not None
    session = Session()
    session.steps, session.summary = list(recording[1]), recording[0]
    words = make_show()(0, 59, None, session)[6]
    measured = sum(s.draft_s for s in recording[1]) / sum(s.draft_s + s.verify_s + s.other_s for s in recording[1])
    assert f"drafting took {100 * measured:.0f} % of the step time" in words
    assert "Decode tab" not in make_show()(0, 59, None, None)[6]
