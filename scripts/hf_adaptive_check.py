"""transformers' adaptive assisted generation, run for real on the embedded pair, against Talon's
replay of the same rules on atlases of the same prompts (``talon.atlas.adaptive_hf.HfAssisted``).

For every prompt it records a lean atlas (the draft's greedy chain from every position, on and off
the text, float32 draft), then runs ``target.generate(assistant_model=draft, do_sample=False)``
under each schedule — ``heuristic``, ``heuristic_transient`` and ``constant`` (the dynamic
confidence threshold alone) — with the prompts as one assistant's requests in order. A hook on
the candidate generator's ``update_candidate_strategy`` records each step's drafted and accepted
counts (it calls the original; nothing of its logic is changed). A request is *equal* when its
counts are the replay's step for step; only a request whose text equals the atlas's can be.

    .venv/bin/python -m scripts.hf_adaptive_check                      # 12 prompts, 2 a suite: the fixture
    .venv/bin/python -m scripts.hf_adaptive_check --prompt-file p.txt  # any prompt, no fixture written

The last line reads ``equal K of N requests``. The fixture (``data/hf_adaptive/``: the atlases
and ``counts.json``) is what ``tests/test_hf_adaptive.py`` replays.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SUITES = ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa")
FIXTURE = ROOT / "data" / "hf_adaptive"
SCHEDULES = ("heuristic", "heuristic_transient", "constant")


@contextlib.contextmanager
def counting(log: list[tuple[int, int]]) -> Iterator[None]:
    """Record (drafted, accepted) at every ``update_candidate_strategy`` call, then call it."""
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    original = AssistedCandidateGenerator.update_candidate_strategy

    def hooked(self, input_ids, scores, num_matches):  # noqa: ANN001, ANN202 - transformers' signature
        log.append((int(scores.shape[1]) - 1, int(num_matches)))
        return original(self, input_ids, scores, num_matches)

    AssistedCandidateGenerator.update_candidate_strategy = hooked
    try:
        yield
    finally:
        AssistedCandidateGenerator.update_candidate_strategy = original


def run_hf(target, draft, prompts: list[list[int]], schedule: str, max_new: int, eos: list[int]) -> list[dict]:  # noqa: ANN001
    """The prompts as one assistant's requests, in order, under ``schedule``."""
    import torch
    from transformers import GenerationConfig

    gc = draft.generation_config
    gc.num_assistant_tokens_schedule = schedule
    gc.num_assistant_tokens = 20  # transformers' default, set so that "heuristic" starts from it
    gc.assistant_confidence_threshold = 0.4  # its default
    out = []
    for ids in prompts:
        log: list[tuple[int, int]] = []
        config = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=eos[0])
        with counting(log), torch.inference_mode():
            seq = target.generate(torch.tensor([ids]), generation_config=config, assistant_model=draft)
        out.append({"output": seq[0, len(ids):].tolist(), "steps": log})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-file", type=Path, help="one prompt from this file (no fixture is written)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--chars", type=int, default=600, help="each bundled prompt's first CHARS characters")
    parser.add_argument("--out", type=Path, default=FIXTURE)
    parser.add_argument("--counts-from", type=Path, help="transformers' counters from an earlier run's counts.json "
                        "(the same prompts and length): record the atlases and compare, without running it again")
    args = parser.parse_args(argv)

    from talon.atlas.adaptive import replay_requests
    from talon.atlas.adaptive_hf import HfAssisted
    from talon.atlas.data import AtlasSpec
    from talon.atlas.record import record_atlas
    from talon.engine.engine import Engine
    from talon.models.loading import load_pair
    from talon.run_config import RetrievalConfig, RunConfig, TreeConfig
    from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET
    from talon.specbench import default_data_dir, load_prompts

    if args.prompt_file:
        texts = [("file", args.prompt_file.read_text(encoding="utf-8"))]
    else:
        texts = [(p.suite, p.text[:args.chars]) for p in load_prompts(default_data_dir(), SUITES, 2)]
    t0 = time.perf_counter()
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, dtype="float32", device="cpu", draft_quant="none",
                              prepack=False)
    engine = Engine(target, draft)
    n = args.max_new_tokens
    spec = AtlasSpec(n_nodes=1, root_k=2, top_k=2, max_depth=1, beam=1, chain_depth=min(n, 64), chain_k=2,
                     retrieval=RetrievalConfig(min_match=1, max_continuation=1, max_branches=1))
    # the full vocabulary: transformers' assistant takes its softmax over every token (Talon's default
    # draft_vocab would renormalize q over the first 32768 ids)
    cfg = RunConfig(drafter="model", tree=TreeConfig(mode="chain", cost_aware=False), max_new_tokens=n,
                    chat_template=False, draft_vocab=0)
    atlases = []
    for suite, text in texts:
        atlases.append(record_atlas(engine, text, cfg, spec, suite=suite))
        print(f"atlas {len(atlases)}/{len(texts)} ({suite}): {len(atlases[-1].output)} tokens, "
              f"{len(atlases[-1].children)} nodes", flush=True)
    if not args.prompt_file:
        args.out.mkdir(parents=True, exist_ok=True)
        for i, atlas in enumerate(atlases):
            with gzip.open(args.out / f"{i:02d}-{atlas.suite}.json.gz", "wt", encoding="utf-8") as fh:
                json.dump(atlas.to_dict(), fh)
    eos = atlases[0].eos
    prompts = [a.prompt_ids for a in atlases]
    earlier = json.loads(args.counts_from.read_text(encoding="utf-8"))["schedules"] if args.counts_from else {}
    counts: dict[str, list[dict]] = {}
    equal = total = 0
    for schedule in SCHEDULES:
        counts[schedule] = ([{"output": h["output"], "steps": h["steps"]} for h in earlier[schedule]]
                            if schedule in earlier else run_hf(target.model, draft.model, prompts, schedule, n, eos))
        runs = replay_requests(atlases, HfAssisted(schedule), n)
        same = 0
        for atlas, hf, run in zip(atlases, counts[schedule], runs):
            hf["text_equal"] = hf["output"] == atlas.output
            replayed = [(s.drafted, s.accepted) for s in run.steps]
            hf["equal"] = hf["text_equal"] and [tuple(s) for s in hf["steps"]] == replayed
            same += hf["equal"]
        texts_equal = sum(h["text_equal"] for h in counts[schedule])
        print(f"{schedule}: equal {same} of {len(runs)} requests ({texts_equal} texts equal the atlas's)", flush=True)
        equal, total = equal + same, total + len(runs)
    if not args.prompt_file:
        import torch
        import transformers
        (args.out / "counts.json").write_text(json.dumps({
            "format": "talon-hf-adaptive/1", "max_new_tokens": n, "chars": args.chars,
            "transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float32",
            "atlases": [f"{i:02d}-{a.suite}.json.gz" for i, a in enumerate(atlases)],
            "schedules": counts, "seconds": round(time.perf_counter() - t0, 1)}, indent=1) + "\n", encoding="utf-8")
    print(f"equal {equal} of {total} requests")
    return 0 if equal == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
