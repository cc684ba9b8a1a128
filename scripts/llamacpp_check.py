"""llama-server's own counters and speed on the embedded pair, for the llama.cpp replay to be checked
against (``talon.atlas.llamacpp``).

    bash scripts/llamacpp_check.sh      # builds llama.cpp, then runs this twice (float32, Q4_K_M)

``measure``: for each setting (plain decoding, then every ``SETTINGS`` entry), starts
``llama-server`` on 127.0.0.1 with the pair (``--gguf f32``: float32 GGUFs written by Talon's own
converter from the shipped files, the weights Talon's float32 checkpoints hold; ``q4km``: the
shipped files), sends each atlas's own prompt token ids, greedy, ``n_predict`` tokens, and writes
one JSON row per request: the tokens, the server's ``timings`` (``draft_n``, ``draft_n_accepted``,
``predicted_per_second``...) and the wall time. A setting whose drafter keeps state across
requests (ngram-mod's table) gets a fresh server per request, as the replay assumes. Then
``llama-bench`` measures the target's and the draft's batch costs (``pp1`` ... ``pp32``, ``tg``)
into ``bench-*.json``.

``compare``: replays every setting on the atlases and writes the per-request and per-setting
comparison (drafts, accepted tokens, where the texts parted, tokens/s predicted from the bench
against measured, and the ranking) as markdown and JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from talon.atlas.data import Atlas, load_atlases
from talon.atlas.llamacpp import llamacpp_policy, replay_llamacpp
from talon.atlas.llamacpp_costs import LlamaCppCosts, costs_from_llama_bench
from talon.atlas.serving import LLAMACPP_VERSION
from talon.atlas.serving_costs import decode_seconds
from talon.bench.llamacpp import complete, wait_ready
from talon.models import cpu_model

# name -> llama.cpp knobs (talon.atlas.llamacpp.llamacpp_policy); "plain" runs no speculation
SETTINGS: dict[str, dict[str, Any]] = {
    "draft-n4": {"type": "draft-simple", "n_max": 4, "n_min": 0, "p_min": 0.0},
    "draft-n8-p0.5-min2": {"type": "draft-simple", "n_max": 8, "n_min": 2, "p_min": 0.5},
    "draft-n8-p0.75": {"type": "draft-simple", "n_max": 8, "n_min": 0, "p_min": 0.75},
    "draft-n16-p0.9": {"type": "draft-simple", "n_max": 16, "n_min": 0, "p_min": 0.9},
    "ngram-mod": {"type": "ngram-mod", "n_match": 24, "ngram_n_min": 48, "ngram_n_max": 64},
    "ngram-mod-m12": {"type": "ngram-mod", "n_match": 12, "ngram_n_min": 4, "ngram_n_max": 16},
    "ngram-simple": {"type": "ngram-simple", "size_n": 12, "size_m": 48},
}
BENCH_SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 512)


def server_command(server: str, target: Path, draft: Path, port: int, threads: int, name: str) -> list[str]:
    cmd = [server, "-m", str(target), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-tb", str(threads), "-c", "4096", "-np", "1", "--no-webui", "-fa", "on"]
    if name == "plain":
        return cmd
    policy = llamacpp_policy(SETTINGS[name])
    if policy.uses_draft_model:
        cmd += ["-md", str(draft), "-td", str(threads), "-tbd", str(threads)]
    return cmd + policy.flags()


class Server:
    def __init__(self, cmd: list[str], port: int, log: Path) -> None:
        self.cmd, self.port, self.log = cmd, port, log

    def __enter__(self) -> "Server":
        self.fh = self.log.open("a")
        self.proc = subprocess.Popen(self.cmd, stdout=self.fh, stderr=subprocess.STDOUT)
        wait_ready(self.port, self.proc)
        complete(self.port, [151644, 872, 198, 40], 3)  # warm up: too short to feed any n-gram table
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.fh.close()


def write_prompts(a: argparse.Namespace) -> int:
    """The requests: ``--limit`` Spec-Bench prompts per suite from ``--start``, or the prompts of
    ``--prompt-json`` (a list of {"suite": name, "prompt": text}), as the chat-templated token ids
    Talon's benchmark feeds its target."""
    from transformers import AutoTokenizer

    from talon.engine.prompt import encode_prompt
    from talon.models.embedded import embedded_pair_paths
    from talon.specbench import SPECBENCH_SUITES, default_data_dir, load_prompts

    tokenizer = AutoTokenizer.from_pretrained(embedded_pair_paths()[0])
    if a.prompt_json is not None:
        given = json.loads(a.prompt_json.read_text(encoding="utf-8"))
        prompts = [(row["suite"], 0, row["prompt"]) for row in given]
    else:
        prompts = [(pr.suite, pr.index, pr.text) for pr in load_prompts(default_data_dir(), SPECBENCH_SUITES,
                                                                        a.limit, a.start)]
    a.out.mkdir(parents=True, exist_ok=True)
    rows = [{"suite": suite, "index": index, "prompt": text,
             "ids": encode_prompt(tokenizer, text, True, len(tokenizer))} for suite, index, text in prompts]
    (a.out / "prompts.json").write_text(json.dumps(rows, indent=1))
    print(a.out / "prompts.json", [len(r["ids"]) for r in rows])
    return 0


def record(a: argparse.Namespace) -> int:
    """A float32 atlas of every request on Talon's own engine (the embedded pair), with the draft's
    chain ``--chain-depth`` deep and 10 wide at every position, so p_min replays. The draft's weights
    are float32 and its logits cover the whole vocabulary, as llama.cpp's."""
    from talon.atlas.data import AtlasSpec
    from talon.atlas.record import record_atlas
    from talon.engine.build import build_engine
    from talon.run_config import RetrievalConfig, RunConfig
    from talon.settings import PairKey, Settings

    # the draft as llama.cpp runs it: float32 weights (not the CPU's int8 default), the whole vocabulary
    engine = build_engine(PairKey.from_settings(Settings.from_env(), dtype="float32", device="cpu",
                                                draft_quant="none", target_weights="dense", prepack=False))
    cfg = RunConfig().with_knobs({"max_new_tokens": a.n_predict, "chat_template": False, "draft_vocab": 0})
    # only the draft's own chains: llama.cpp drafts nothing else (a lean superset records in minutes)
    spec = AtlasSpec(n_nodes=1, root_k=1, top_k=1, max_depth=1, beam=1, chain_depth=a.chain_depth,
                     retrieval=RetrievalConfig(min_match=1, max_continuation=1, max_branches=1))
    a.atlases.mkdir(parents=True, exist_ok=True)
    for r in json.loads((a.out / "prompts.json").read_text()):
        atlas = record_atlas(engine, r["ids"], cfg, spec, suite=r["suite"])
        atlas.prompt = r["prompt"]
        (a.atlases / f"{r['suite']}-{r['index']}.json").write_text(json.dumps(atlas.to_dict()))
        print(f"{r['suite']}: {len(atlas.output)} tokens, {len(atlas.children)} nodes, "
              f"{atlas.record['atlas_s']:.0f} s", file=sys.stderr, flush=True)
    return 0


@dataclass
class Request:
    suite: str
    prompt: str
    prompt_ids: list[int]


def pair_files(gguf: str) -> tuple[Path, Path]:
    """The embedded pair's GGUF files: the shipped Q4_K_M ones (``q4km``) or float32 ones written
    from them by Talon's converter (``f32``), in the cache."""
    from talon.models.cache import resolve_cache_dir
    from talon.models.convert import write_float32_gguf
    from talon.models.embedded import EMBEDDED_MODELS, embedded_gguf
    from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET

    cache = resolve_cache_dir(None)
    files = [embedded_gguf(EMBEDDED_MODELS[name], cache) for name in (EMBEDDED_TARGET, EMBEDDED_DRAFT)]
    if gguf == "f32":
        files = [write_float32_gguf(f, f.with_name(f"{f.stem}-f32.gguf")) for f in files]
    return files[0], files[1]


def measure(a: argparse.Namespace) -> int:
    if a.target is None or a.draft is None:
        a.target, a.draft = pair_files(a.gguf)
    atlases = [Request(r["suite"], r["prompt"], r["ids"]) for r in json.loads((a.out / "prompts.json").read_text())]
    names = ["plain", *SETTINGS] if a.settings == "all" else a.settings.split(",")
    host = {"cpu": cpu_model(), "threads": a.threads, "gguf": a.gguf, "target": a.target.name, "draft": a.draft.name,
            "llama.cpp": a.version}
    a.out.mkdir(parents=True, exist_ok=True)
    rows_path = a.out / f"responses-{a.gguf}.jsonl"
    with rows_path.open("a") as rows:
        for name in names:
            cmd = server_command(a.server, a.target, a.draft, a.port, a.threads, name)
            fresh = name != "plain" and SETTINGS[name]["type"] == "ngram-mod"
            groups = [[atlas] for atlas in atlases] if fresh else [atlases]
            for group in groups:
                with Server(cmd, a.port, a.out / f"server-{a.gguf}-{name}.log"):
                    for atlas in group:
                        out, wall = complete(a.port, atlas.prompt_ids, a.n_predict)
                        row = {"setting": name, "knobs": SETTINGS.get(name, {}), "suite": atlas.suite,
                               "prompt": atlas.prompt[:80], "prompt_tokens": len(atlas.prompt_ids),
                               "n_predict": a.n_predict, "tokens": out.get("tokens") or [],
                               "timings": out.get("timings", {}), "seconds": wall, "host": host,
                               "flags": cmd[1:]}
                        rows.write(json.dumps(row) + "\n")
                        rows.flush()
                        t = row["timings"]
                        print(f"{a.gguf} {name:>20} {atlas.suite:>9}: {len(row['tokens'])} tokens, "
                              f"{t.get('predicted_per_second', 0):.1f} tok/s, drafted {t.get('draft_n')}, "
                              f"accepted {t.get('draft_n_accepted')}", file=sys.stderr, flush=True)
    if a.bench:
        depth = sorted(len(x.prompt_ids) for x in atlases)[len(atlases) // 2]
        for role, model in (("target", a.target), ("draft", a.draft)):
            cmd = [a.bench, "-m", str(model), "-t", str(a.threads), "-fa", "1", "-d", str(depth),
                   "-p", ",".join(map(str, BENCH_SIZES)), "-n", "32", "-r", "3", "-o", "json"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            (a.out / f"bench-{a.gguf}-{role}.json").write_text(out)
            print(f"llama-bench {role}: {len(json.loads(out))} rows at depth {depth}", file=sys.stderr)
    print(rows_path)
    return 0


def compare(a: argparse.Namespace) -> int:
    atlases = {x.suite: x for x in load_atlases([a.atlases])}
    rows = [json.loads(line) for line in (a.out / f"responses-{a.gguf}.jsonl").read_text().splitlines() if line]
    files = {role: a.out / f"bench-{a.gguf}-{role}.json" for role in ("target", "draft")}
    costs = None  # without llama-bench's rows: the counters only
    if all(f.exists() for f in files.values()):
        bench = {role: json.loads(f.read_text()) for role, f in files.items()}
        costs = costs_from_llama_bench(bench["target"], bench["draft"], hardware=cpu_model(), dtype=a.gguf)
        costs = dataclasses.replace(costs, step_s=server_step_s(rows, costs))
    report = compare_rows(atlases, rows, costs)
    (a.out / f"compare-{a.gguf}.json").write_text(json.dumps(report, indent=1))
    (a.out / f"compare-{a.gguf}.md").write_text(markdown(report, a.gguf))
    print(markdown(report, a.gguf))
    return 0


def server_step_s(rows: list[dict], costs: LlamaCppCosts) -> float:
    """The server's own time per step beyond llama-bench's decode, fitted on the plain requests
    only (their decode time per token less the bench's one-token batch); never negative."""
    plain = [r["timings"] for r in rows if r["setting"] == "plain" and r["timings"].get("predicted_n", 0) > 1]
    per_token = sum(t["predicted_ms"] for t in plain) / 1e3 / sum(t["predicted_n"] - 1 for t in plain)
    return max(per_token - costs.target_s(1), 0.0)


def parted_at(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_rows(atlases: dict[str, Atlas], rows: list[dict], costs: LlamaCppCosts | None) -> dict[str, Any]:
    """Per request and per setting: predicted against measured (see the module docstring)."""
    requests, settings = [], {}
    for row in rows:
        atlas = atlases[row["suite"]]
        t = row["timings"]
        text = atlas.output[: len(row["tokens"])]
        part = parted_at(row["tokens"], text)
        entry: dict[str, Any] = {
            "setting": row["setting"], "suite": row["suite"], "tokens": len(row["tokens"]), "parted_at": part,
            "measured_tps": t.get("predicted_per_second"), "measured_draft_n": t.get("draft_n") or 0,
            "measured_accepted": t.get("draft_n_accepted") or 0}
        run = replay_llamacpp(atlas, llamacpp_policy(row["knobs"] or {"type": "none"}), row["n_predict"])
        decode = decode_seconds(run, costs) if costs is not None else 0.0
        entry.update(predicted_draft_n=run.num_draft_tokens, predicted_accepted=run.num_accepted_tokens,
                     exact=run.exact, near_ties=len(run.near_ties), first_near_tie=(run.near_ties or [""])[0],
                     missing=next((s.missing for s in run.steps if s.missing), ""))
        n = (t.get("predicted_n") or len(row["tokens"])) - 1  # predicted_per_second: tokens after the first
        entry["predicted_tps"] = n / decode if decode > 0 else 0.0
        entry["counters_equal"] = (entry["predicted_draft_n"] == entry["measured_draft_n"]
                                   and entry["predicted_accepted"] == entry["measured_accepted"])
        requests.append(entry)
        s = settings.setdefault(row["setting"], {"setting": row["setting"], "requests": 0, "text_equal": 0,
                                                 "counters_equal_on_equal_text": 0, "counters_equal": 0,
                                                 "tokens": 0, "measured_s": 0.0, "predicted_s": 0.0,
                                                 "equal_tokens": 0, "equal_measured_s": 0.0, "equal_predicted_s": 0.0})
        s["requests"] += 1
        s["text_equal"] += part is None
        s["counters_equal"] += entry["counters_equal"]
        s["counters_equal_on_equal_text"] += entry["counters_equal"] and part is None
        s["tokens"] += n
        s["measured_s"] += t.get("predicted_ms", 0.0) / 1e3
        s["predicted_s"] += decode
        if part is None:  # the atlas holds this request's text: its acceptance is the replay's
            s["equal_tokens"] += n
            s["equal_measured_s"] += t.get("predicted_ms", 0.0) / 1e3
            s["equal_predicted_s"] += decode
    for s in settings.values():
        s["measured_tps"] = s["tokens"] / s["measured_s"] if s["measured_s"] else 0.0
        s["predicted_tps"] = s["tokens"] / s["predicted_s"] if s["predicted_s"] else 0.0
        s["error"] = s["predicted_tps"] / s["measured_tps"] - 1 if s["measured_tps"] and costs is not None else None
        s["equal_error"] = (s["equal_measured_s"] / s["equal_predicted_s"] - 1
                            if s["equal_predicted_s"] and costs is not None else None)
    if costs is None:
        return {"requests": requests, "settings": list(settings.values()), "costs": None, "step_s": None}
    order = list(settings)
    measured_rank = sorted(order, key=lambda k: -settings[k]["measured_tps"])
    predicted_rank = sorted(order, key=lambda k: -settings[k]["predicted_tps"])
    best_p, best_m = predicted_rank[0], measured_rank[0]
    return {"requests": requests, "settings": list(settings.values()), "costs": costs.to_dict(),
            "step_s": costs.step_s,
            "measured_rank": measured_rank, "predicted_rank": predicted_rank,
            "best_predicted": best_p, "best_measured": best_m,
            "best_gap": 1 - settings[best_p]["measured_tps"] / settings[best_m]["measured_tps"]}


def markdown(report: dict[str, Any], gguf: str) -> str:
    timed = report["costs"] is not None
    lines = [f"### {gguf}: per setting", "",
             "| setting | requests | text = atlas | counters equal (on equal text) | measured tok/s | "
             "predicted tok/s | error | error on equal text |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in report["settings"]:
        err = "" if s.get("error") is None else f"{s['error']:+.1%}"
        equal = "" if s.get("equal_error") is None else f"{s['equal_error']:+.1%}"
        predicted = f"{s['predicted_tps']:.2f}" if timed else "–"
        lines.append(f"| {s['setting']} | {s['requests']} | {s['text_equal']} | {s['counters_equal']} "
                     f"({s['counters_equal_on_equal_text']}/{s['text_equal']}) | {s['measured_tps']:.2f} | "
                     f"{predicted} | {err} | {equal} |")
    lines.append("")
    if not timed:
        lines.append("No llama-bench rows for this run: counters only.")
    else:
        lines += [f"Predicted from llama-bench's batch costs plus {report['step_s'] * 1e3:.1f} ms a step of the "
                  "server's own, fitted on the plain requests alone.",
                  f"Ranked by measured tok/s: {', '.join(report['measured_rank'])}.",
                  f"Ranked by predicted tok/s: {', '.join(report['predicted_rank'])}.",
                  f"Best predicted {report['best_predicted']}, best measured {report['best_measured']} "
                  f"(the predicted best measures {report['best_gap']:.1%} below the measured best)."]
    lines += ["", f"### {gguf}: per request", "",
              "| setting | suite | tokens | texts part at | draft_n measured / predicted | "
              "accepted measured / predicted | near-ties | tok/s measured / predicted |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in report["requests"]:
        part = "—" if r["parted_at"] is None else str(r["parted_at"])
        tps = f"{r['measured_tps']:.2f} / {r['predicted_tps']:.2f}" if timed else f"{r['measured_tps']:.2f} / –"
        lines.append(f"| {r['setting']} | {r['suite']} | {r['tokens']} | {part} | {r['measured_draft_n']} / "
                     f"{r['predicted_draft_n']} | {r['measured_accepted']} / {r['predicted_accepted']} | "
                     f"{r['near_ties']} | {tps} |")
    return "\n".join(lines) + "\n"


def chain_entries(atlas: Atlas) -> Atlas:
    """``atlas`` with only what llama.cpp's replays read: the text's entries and the draft's own
    chains (``spec.chain_depth`` deep) from every position."""
    keep = {}
    for p in range(len(atlas.output)):
        path: tuple[int, ...] = ()
        for _ in range(max(atlas.spec.chain_depth, 1)):
            key = atlas.canonical(p, path)
            kids = atlas.children.get(key)
            if kids is None:
                break
            keep[key] = kids
            path += (kids[0][0],)
    tokens = set(atlas.prompt_ids) | set(atlas.output) | {t for kids in keep.values() for t, _ in kids}
    return dataclasses.replace(atlas, children=keep, token_texts={t: s for t, s in atlas.token_texts.items()
                                                                   if t in tokens})


def fixture(a: argparse.Namespace) -> int:
    """The test fixture (``--dest``, default ``data/llamacpp_check``): the atlases cut to the chains,
    gzipped; every response with its counters, tokens and timings; llama-bench's rows; what produced them."""
    dest = a.dest or Path(__file__).resolve().parents[1] / "data" / "llamacpp_check"
    (dest / "atlases").mkdir(parents=True, exist_ok=True)
    for atlas in load_atlases([a.atlases]):
        with gzip.open(dest / "atlases" / f"{atlas.suite}.json.gz", "wt", encoding="utf-8") as fh:
            json.dump(chain_entries(atlas).to_dict(), fh)
    host = {}
    for gguf in a.ggufs.split(","):
        rows = [json.loads(line) for line in (a.out / f"responses-{gguf}.jsonl").read_text().splitlines() if line]
        keep = ("setting", "knobs", "suite", "prompt_tokens", "n_predict", "tokens", "timings", "seconds", "flags")
        with gzip.open(dest / f"responses-{gguf}.jsonl.gz", "wt", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps({k: row[k] for k in keep}) + "\n")
        host[gguf] = rows[0]["host"]
        for role in ("target", "draft"):
            bench = a.out / f"bench-{gguf}-{role}.json"
            if bench.exists():
                (dest / bench.name).write_text(bench.read_text())
    (dest / "README.json").write_text(json.dumps({
        "what": "llama-server's responses on the embedded pair and Talon's float32 atlases of the same requests "
                "(scripts/llamacpp_check.sh); tests/test_llamacpp.py replays them",
        "llama.cpp": next(iter(host.values()))["llama.cpp"], "hosts": host}, indent=1) + "\n")
    print(dest)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("prompts", "record", "measure", "compare", "fixture"))
    p.add_argument("--atlases", type=Path, help="a folder of atlases, one per suite")
    p.add_argument("--limit", type=int, default=1, help="prompts per suite")
    p.add_argument("--prompt-json", type=Path, help='prompts: a JSON list of {"suite": ..., "prompt": ...}')
    p.add_argument("--dest", type=Path, help="fixture: where it goes (default data/llamacpp_check)")
    p.add_argument("--ggufs", default="f32,q4km", help="fixture: the GGUF kinds measured")
    p.add_argument("--start", type=int, default=0, help="first prompt index per suite")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gguf", choices=("f32", "q4km"), default="q4km")
    p.add_argument("--target", type=Path)
    p.add_argument("--draft", type=Path)
    p.add_argument("--server")
    p.add_argument("--bench")
    p.add_argument("--version", default=LLAMACPP_VERSION)
    p.add_argument("--port", type=int, default=8767)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-predict", type=int, default=64)
    p.add_argument("--chain-depth", type=int, default=16)
    p.add_argument("--settings", default="all", help=f"plain and/or of {','.join(SETTINGS)}, or all")
    a = p.parse_args()
    return {"prompts": write_prompts, "record": record, "measure": measure, "compare": compare,
            "fixture": fixture}[a.what](a)


if __name__ == "__main__":
    sys.exit(main())
