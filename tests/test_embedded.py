"""The real embedded pair (Qwen2.5-Coder 1.5B target, 0.5B draft), float32: speculative greedy
output is token-for-token the target's own greedy generation, from the API and the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch

import talon.models.convert as tm_convert
from talon.cost.cache import cache_path, save_costs
from talon.cost.probe import cost_key
from talon.engine.engine import Engine, generate
from talon.lessons.asynchrony import gpu_costs
from talon.models import Int8Linear, LoadedModel
from talon.models.loading import load_pair
from talon.run_config import RunConfig, TreeConfig
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET, Settings
from tests.tiny import cached_greedy, first_prompt, target_greedy

pytestmark = pytest.mark.embedded


# A CLI child loads the float32 pair this module holds, from the same checkpoint file: unpacked, it
# shares those mapped pages instead of building a 5 GB packed copy (so the suite runs in 8 GiB).
SHARED_PAGES = {**os.environ, "TALON_PREPACK": "0"}


@pytest.fixture(scope="module")
def embedded_pair() -> Iterator[tuple[LoadedModel, LoadedModel]]:
    """The embedded target in float32 and its draft in int8 (the CPU's default draft), on the CPU,
    loaded once for this module and released after it: the float32 target alone holds 6.2 GB."""
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, dtype="float32", device="cpu", draft_quant="int8",
                              prepack=False)
    assert draft is not None
    yield target, draft
    cached_greedy.cache_clear()  # its keys hold the models: the pair is freed with the module


@pytest.fixture(scope="module")
def embedded_engine(embedded_pair) -> Engine:
    """The module's engine, its cost curves read from the suite's cost cache (TALON_COST_CACHE),
    where a CLI child reads its own: a GPU's measured curves (``gpu_costs``), written there under
    this pair's key as a probe would write its own. The child loads the same pair the same way
    (float32 target unpacked, int8 draft), so it finds them and plans on them. A probe of this
    pair takes a minute at one thread on a 2-core host and is a measurement, not what these tests
    check: the probe's rules are tested on tiny models (tests/test_cost.py)."""
    target, draft = embedded_pair
    cache = Settings.from_env().cost_cache_dir
    engine = Engine(target, draft, cost_cache=cache)
    key = cost_key(target.model, draft.model, (target.name, draft.name), RunConfig().draft_vocab, engine.forward_path)
    costs = gpu_costs()
    costs.key = key
    costs.provenance = dataclasses.replace(costs.provenance, measured_at=datetime.now(UTC).isoformat())
    save_costs(costs, cache_path(cache, key))
    return engine


# The prompts' first 600 characters: a float32 prefill costs 33 ms a token on a 2-core host, each run
# and its reference prefill, and the summary prompt's first 600 (140 tokens) carry retrieval as well
# as its 1,500 did (MAT 3.4 against 2.2 with retrieval alone, 4.8 both ways with the hybrid).
PROMPT_CHARS = 600


@pytest.fixture(scope="module")
def gpu_planned_engine(embedded_pair) -> Engine:
    """The module's pair planning on a GPU's measured step costs (``cost_model="fixed"``). On this
    host's own float32 curves a 2-token block costs about twice one token, so the cost-aware
    planner may rightly decline to speculate at all (every step then verifies the root alone,
    and nothing is drafted to be checked); on a GPU's curves extra nodes are nearly free, so it
    drafts, and the cost-aware path's output is still the target's."""
    return Engine(*embedded_pair, costs=gpu_costs())


@pytest.mark.parametrize(
    "suite,drafter,mode,cost_aware",
    [
        ("humaneval", "hybrid", "adaptive", True),
        ("sum", "hybrid", "adaptive", True),
        # the tree modes and the retriever, drafting whatever the costs
        ("mt_bench", "model", "static", False),
        ("humaneval", "model", "chain", False),
        ("sum", "retrieval", "adaptive", False),
    ],
)
def test_greedy_equals_target_generate(embedded_engine: Engine, gpu_planned_engine: Engine, suite: str,
                                       drafter: str, mode: str, cost_aware: bool) -> None:
    cfg = RunConfig(drafter=drafter, tree=TreeConfig(mode=mode, cost_aware=cost_aware), max_new_tokens=24,
                    cost_model="fixed")
    engine = gpu_planned_engine if cost_aware else embedded_engine
    summary, steps = generate(engine, first_prompt(suite, 1)[:PROMPT_CHARS], cfg)
    want = target_greedy(embedded_engine.target.model, summary.prompt_token_ids, 24)
    assert summary.token_ids == want
    assert summary.steps == len(steps) < 24  # speculation paid: fewer target forwards than tokens
    # the int8 draft's proposals were read (only the draft is quantized, and the accepted output is
    # still the target's); the cost-aware hybrid may rightly draft from retrieval alone on these prompts
    if drafter != "retrieval" and not cost_aware:
        assert summary.draft_forwards > 0


def test_cli_json_reproduces_target_greedy(embedded_engine: Engine, embedded_pair, tmp_path: Path) -> None:
    assert embedded_engine.cost_snapshot(RunConfig().draft_vocab).provenance.source == "cache"  # no probe
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(first_prompt("humaneval", 1)[:PROMPT_CHARS], encoding="utf-8")  # the first test's reference
    out = subprocess.run(
        [sys.executable, "-m", "talon", "generate", "--prompt-file", str(prompt), "--dtype", "float32",
         "--max-new-tokens", "24", "--draft-quant", "int8", "--json"],  # the module's pair: its cached curves
        capture_output=True, text=True, timeout=900, check=True, env=SHARED_PAGES,
    )
    result = json.loads(out.stdout)  # exactly one JSON object on stdout
    assert "cost model: cache" in out.stderr and "probed" not in out.stderr  # it planned on the module's curves
    assert result["dtype"] == "float32" and result["draft"]
    target, _ = embedded_pair  # the same checkpoint, float32, already loaded
    assert Path(result["target"]).resolve() == Path(target.name).resolve()
    assert result["token_ids"] == target_greedy(target.model, result["prompt_token_ids"], 24)
    assert result["steps"] <= len(result["token_ids"])
    for key in ("text", "mean_accepted_tokens", "tokens_per_second", "seconds", "accepted_by_source"):
        assert key in result


ATLAS_CONFIGS = [
    RunConfig(tree=TreeConfig(cost_aware=False), max_new_tokens=20),
    RunConfig(drafter="model", tree=TreeConfig(mode="chain", cost_aware=False), max_new_tokens=20),
    RunConfig(tree=TreeConfig(mu=0.3, root_k=6, top_k=3, budget=8, min_conf=0.05, cost_aware=False), max_new_tokens=20),
    RunConfig(tree=TreeConfig(cost_aware=True), max_new_tokens=20, cost_model="fixed"),
]


def test_atlas_replays_equal_real_runs(embedded_engine: Engine) -> None:
    """Record on the module's engine (float32 target, int8 draft; ``atlas record``'s flags are
    tested on a tiny pair in ``tests/test_front_ends.py``), then every configuration replayed from
    the atlas gives its real run's text, and its trees equal the real run's step for step, or the
    difference is named: a near-tie of the draft's q, or the int8 draft's q depending on its batch
    (one activation scale per forward: the atlas's prefill quantizes a row with the whole
    prompt's scale, a run with its own), which makes an int8 draft's atlas approximate. Exact
    trees are proven on float32 pairs (``tests/test_atlas.py``). The cost-aware row plans on the
    engine's snapshot, which the atlas stores."""
    from talon.atlas.data import AtlasSpec
    from talon.atlas.loop import compare_runs
    from talon.atlas.record import record_atlas
    from talon.atlas.replay import replay

    costs = embedded_engine.cost_snapshot(RunConfig().draft_vocab).to_dict()
    prompt = first_prompt("humaneval")
    atlas = record_atlas(embedded_engine, prompt, RunConfig(max_new_tokens=20, tree=TreeConfig(cost_aware=False)),
                         AtlasSpec())
    atlas.costs = costs
    assert atlas.models["draft_quant"] == "int8" and atlas.models["dtype"] == "float32" and atlas.batch_dependent
    for cfg in ATLAS_CONFIGS:
        summary, steps = generate(embedded_engine, prompt, cfg)
        result = replay(atlas, cfg)
        assert result.summary.token_ids == summary.token_ids == atlas.output
        agreement = compare_runs(steps, result.steps, coverage=result.coverage, quantized=atlas.batch_dependent)
        if result.exact:  # inside the atlas: equal, a named near-tie of the draft's q, or the int8 draft's batch
            assert agreement.equal or agreement.near_tie or agreement.quantized, agreement.reason
        else:
            assert agreement.equal or agreement.outside, agreement.reason
        if agreement.equal and result.exact:
            assert [len(s.new_tokens) for s in steps] == [len(s.new_tokens) for s in result.steps]
            assert result.mat == pytest.approx(summary.mean_accepted_tokens)


def test_embedded_pair(embedded_pair: tuple[LoadedModel, LoadedModel]) -> None:
    target, draft = embedded_pair
    assert getattr(draft.model, "talon_quant", None) == "int8" and not hasattr(target.model, "talon_quant")
    assert sum(isinstance(m, Int8Linear) for m in draft.model.modules()) == 7 * draft.model.config.num_hidden_layers
    for lm in (target, draft):
        assert (lm.dtype, lm.device) == (torch.float32, torch.device("cpu"))
        assert not lm.model.training
        assert (Path(lm.name) / tm_convert.MARKER_FILE).is_file()
        assert lm.tokenizer.chat_template and "<|im_start|>" in lm.tokenizer.chat_template
        assert lm.tokenizer.eos_token == "<|im_end|>"
        im_end = lm.tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert im_end in list(lm.model.generation_config.eos_token_id)
    assert target.model.config.num_hidden_layers == 28 and draft.model.config.num_hidden_layers == 24

    messages = [{"role": "user", "content": "Write a Python function add(a, b) that returns a + b."}]
    inputs = target.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.inference_mode():
        out = target.model.generate(**inputs, max_new_tokens=20, do_sample=False)
    text = target.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "def add(a, b)" in text, text
