"""Talon's side of ``scripts/serve_check.sh``: does a real vLLM accept what Talon exports, and
give the same greedy text?

    prepare --out DIR        Talon's greedy outputs and serving metrics for a few prompts, and the
                             --speculative-config Talon exports for them (written to DIR)
    query --out DIR --name N --port P
                             send the prompts to a running vLLM (OpenAI API, temperature 0), read
                             its spec-decode counters from /metrics, store both under N
    report --out DIR         one table: per mapping, greedy text equal or not, vLLM's counters
                             beside Talon's serving metrics for the same prompts

Only the standard library talks to the server, so ``query`` runs in Talon's environment while
vLLM runs in its own.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT_SUITES = ("humaneval", "mt_bench", "gsm8k")
MAX_TOKENS = 48
SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def prepare(out: Path) -> None:
    from talon.specbench import default_data_dir, load_prompts
    from talon.decode import Engine, generate
    from talon.prompt import encode_prompt
    from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, load_pair
    from talon.run_config import RunConfig
    from talon.serving import serving_config
    from talon.settings import Settings

    settings = Settings.from_env()
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, dtype="float32", device="cpu")
    dirs = {name: str(settings.cache_dir / name.split(":", 1)[1]) for name in (EMBEDDED_TARGET, EMBEDDED_DRAFT)}
    engine = Engine(target, draft, cost_cache=settings.cost_cache_dir)
    vocab = target.model.get_input_embeddings().weight.shape[0]
    prompts = [p for suite in PROMPT_SUITES for p in load_prompts(default_data_dir(), [suite], 1)]
    default, retrieval = RunConfig(max_new_tokens=MAX_TOKENS, cost_model="fixed"), None
    retrieval = default.replace(drafter="retrieval")
    records = []
    for prompt in prompts:
        ids = encode_prompt(target.tokenizer, prompt.text, True, vocab)
        runs = {}
        for label, cfg in (("default", default), ("retrieval", retrieval)):
            summary, _ = generate(engine, ids, cfg)
            runs[label] = {"text": summary.text, "token_ids": summary.token_ids,
                           "serving_metrics": summary.serving_metrics}
        records.append({"suite": prompt.suite, "prompt_ids": ids, "talon": runs})
    sizes = (vocab, draft.model.get_input_embeddings().weight.shape[0])
    exported = serving_config(default, dirs[EMBEDDED_TARGET], dirs[EMBEDDED_DRAFT], sizes)
    ngram = serving_config(retrieval, dirs[EMBEDDED_TARGET], None, sizes)
    prompt_lookup = json.loads(re.search(r"is (\{.*\})$", next(n for n in ngram.notes if '"method": "ngram"' in n)).group(1))
    mappings = [
        {"name": "default (draft model)", "talon": "default", "config": exported.vllm_config, "refused": exported.refused},
        {"name": "retrieval (ngram)", "talon": "retrieval", "config": prompt_lookup, "refused": ngram.refused},
        {"name": "retrieval (suffix)", "talon": "retrieval", "config": ngram.vllm_config, "refused": ngram.refused},
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "talon.json").write_text(json.dumps({"target_dir": dirs[EMBEDDED_TARGET], "records": records,
                                                "mappings": mappings}, indent=1))
    for m in mappings:  # one line per mapping for the shell: name, then the JSON config
        print(f"{m['name']}\t{json.dumps(m['config'])}")


def _post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=900) as response:
        return json.loads(response.read())


def spec_counters(port: int) -> dict[str, float]:
    """vLLM's spec-decode counters (``vllm:spec_decode_<name>_total``) from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for name in SPEC_COUNTERS:
        values = [float(m.group(1)) for m in re.finditer(rf"^vllm:spec_decode_{name}_total\{{[^}}]*\}} (\S+)$", text, re.M)]
        found[name] = sum(values) if values else float("nan")
    return found


def query(out: Path, name: str, port: int) -> None:
    data = json.loads((out / "talon.json").read_text())
    model = data["target_dir"]
    before = spec_counters(port)
    texts = []
    for record in data["records"]:
        reply = _post(port, {"model": model, "prompt": record["prompt_ids"], "max_tokens": MAX_TOKENS,
                             "temperature": 0.0})
        texts.append(reply["choices"][0]["text"])
    after = spec_counters(port)
    counters = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    results = json.loads((out / "vllm.json").read_text()) if (out / "vllm.json").exists() else {}
    results[name] = {"texts": texts, "spec_decode": counters}
    (out / "vllm.json").write_text(json.dumps(results, indent=1))


def first_difference(a: str, b: str) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def report(out: Path) -> str:
    talon = json.loads((out / "talon.json").read_text())
    vllm = json.loads((out / "vllm.json").read_text()) if (out / "vllm.json").exists() else {}
    lines = ["| mapping | vLLM --speculative-config | served | greedy text equal | vLLM drafts / draft tokens / accepted | Talon drafts / draft tokens / accepted |",
             "| --- | --- | --- | --- | --- | --- |"]
    for m in talon["mappings"]:
        got = vllm.get(m["name"])
        ours = [r["talon"][m["talon"]] for r in talon["records"]]
        mine = [sum(o["serving_metrics"].get(k, 0) for o in ours) for k in SPEC_COUNTERS]
        if got is None:
            lines.append(f"| {m['name']} | `{json.dumps(m['config'])}` | no (see its log) | – | – | {' / '.join(map(str, mine))} |")
            continue
        equal = [first_difference(o["text"], t) is None for o, t in zip(ours, got["texts"])]
        theirs = " / ".join(f"{got['spec_decode'][k]:g}" for k in SPEC_COUNTERS)
        lines.append(f"| {m['name']} | `{json.dumps(m['config'])}` | yes | {sum(equal)} of {len(equal)} | {theirs} | "
                     f"{' / '.join(map(str, mine))} |")
    text = "\n".join(lines)
    (out / "report.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["prepare", "query", "report"])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--name", default="")
    p.add_argument("--port", type=int, default=8765)
    args = p.parse_args(argv)
    if args.action == "prepare":
        prepare(args.out)
    elif args.action == "query":
        query(args.out, args.name, args.port)
    else:
        print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
