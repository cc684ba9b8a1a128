"""EAGLE-3 parity fixtures: heads built, saved and run by a reference implementation.

Run in a side environment that has the ``speculators`` library (its ``Eagle3DraftModel``, the
EAGLE-3 head vLLM serves), never in Talon's: ``bash scripts/eagle3_parity.sh``. It builds two
random heads at tiny shapes, saves each with ``save_pretrained`` (the ``speculators`` layout, as
that library writes it), and records for fixed random features and tokens the logits of four draft
levels (``ttt_steps`` 0 to 3: level k row t feeds level k - 1's output at t with token t + k + 1,
at position t + k, seeing level 0 up to t and its own chain), which is every committed step's
drafting too: a step whose root is token m drafts row m - 1.

* ``head``: ids ``[2, 3, 3]``, RoPE base 10000, the residual before the norm;
* ``variant``: ``norm_before_residual`` true, a flat ``rope_theta`` of 1e6 with ``llama3``
  scaling, a head 64 wide on a 96-wide target (``target_hidden_size``; speculators 0.9 sizes ``fc``
  by the head's width, so the script gives it vLLM's 3 x 96 input), no ids (the default).

``tests/test_eagle3_parity.py`` loads them with Talon's loader, in this layout and rewritten in
the EAGLE / SpecForge one, and compares logits, top-k and drafted trees over several steps.

    python scripts/eagle3_parity.py OUT_DIR
"""

from __future__ import annotations

import json
import platform
import sys
from importlib.metadata import version
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig

HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, VOCAB, DRAFT_VOCAB, TOKENS, LEVELS = 64, 4, 2, 128, 258, 96, 16, 4
VARIANT_TARGET = 96  # the variant head's target width (features 3 x 96)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}  # at head_dim 16, every frequency but the fastest is scaled


def build(out: Path, variant: bool) -> dict:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    layer = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                        head_dim=HIDDEN // HEADS, intermediate_size=INTERMEDIATE, vocab_size=VOCAB,
                        num_hidden_layers=1, rms_norm_eps=1e-6, max_position_embeddings=512,
                        attn_implementation="eager")  # dense float masks: any length (flex needs 128s)
    layer.rope_parameters = dict(LLAMA3) if variant else {"rope_type": "default", "rope_theta": 10000.0}
    target = VARIANT_TARGET if variant else HIDDEN
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=DRAFT_VOCAB, norm_before_residual=variant,
        eagle_aux_hidden_state_layer_ids=None if variant else [2, 3, 3],
        target_hidden_size=target if variant else None,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path="tiny-target", architectures=["LlamaForCausalLM"])),
    )
    torch.manual_seed(0)
    model = Eagle3DraftModel(config).eval()
    if variant:  # speculators 0.9 sizes fc by the head's own width; vLLM by target_hidden_size, as here
        model.fc = torch.nn.Linear(3 * target, HIDDEN, bias=False)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.6 / param.shape[1] ** 0.5)
            elif "norm" in name:
                param.uniform_(0.5, 1.5)  # norms away from 1, so a norm applied twice or not at all shows
        draft = torch.sort(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:DRAFT_VOCAB]).values
        for name, buf in model.named_buffers():
            if name.endswith("d2t"):
                buf.copy_(draft - torch.arange(DRAFT_VOCAB))
            elif name.endswith("t2d"):
                buf.zero_()
                buf[draft] = True
    name = "variant" if variant else "head"
    model.save_pretrained(out / name)
    gen = torch.Generator().manual_seed(2)
    features = torch.randn(1, TOKENS, 3 * target, generator=gen)
    tokens = torch.randint(0, VOCAB, (1, TOKENS + LEVELS), generator=gen)
    logits: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out_: logits.append(out_.detach().clone()))
    with torch.no_grad():  # speculators pairs feature t with input_ids[t]: it takes the tokens shifted by one
        model(hidden_states=features, input_ids=tokens[:, 1:TOKENS + 1], document_ids=torch.zeros(1, TOKENS,
              dtype=torch.long), position_ids=torch.arange(TOKENS)[None], ttt_steps=LEVELS)
    hook.remove()
    return {
        "command": "bash scripts/eagle3_parity.sh",
        "reference": f"speculators {version('speculators')} Eagle3DraftModel, transformers {transformers.__version__}, "
                     f"torch {torch.__version__}, Python {platform.python_version()}",
        "head": name,
        "shape": {"hidden": HIDDEN, "target_hidden": target, "heads": HEADS, "kv_heads": KV_HEADS,
                  "intermediate": INTERMEDIATE, "vocab": VOCAB, "draft_vocab": DRAFT_VOCAB,
                  "aux_layers": None if variant else [2, 3, 3], "norm_before_residual": variant,
                  "rope": layer.rope_parameters},
        "features": features[0].tolist(),
        "tokens": tokens[0].tolist(),
        # levels[k][t]: feature t's chain at depth k + 1 (tokens t + 1 ... t + k + 1), at position t + k;
        # rows t >= TOKENS - k fed padding and are not compared
        "levels": [level[0].tolist() for level in logits],
    }


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for variant in (False, True):
        record = build(out, variant)
        (out / f"{record['head']}.json").write_text(json.dumps(record), encoding="utf-8")
        print(json.dumps({k: v for k, v in record.items() if k in ("command", "reference", "head", "shape")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
