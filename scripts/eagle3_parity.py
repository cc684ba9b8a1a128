"""EAGLE-3 parity fixture: a head built, saved and run by a reference implementation.

Run in a side environment that has the ``speculators`` library (its ``Eagle3DraftModel``, the
EAGLE-3 head vLLM serves), never in Talon's: ``bash scripts/eagle3_parity.sh``. It builds a
random head at a tiny shape, saves it with ``save_pretrained`` (the ``speculators`` layout, as that
library writes it), and records for fixed random features and tokens the logits of its first two
draft levels (``ttt_steps`` 0 and 1: level 1 feeds level 0's output back at the next position).
``tests/test_eagle3_parity.py`` loads the saved head with Talon's loader, in this layout and
rewritten in the EAGLE / SpecForge layout, and compares its logits, top-k and a drafted tree.

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

HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, VOCAB, DRAFT_VOCAB, TOKENS = 64, 4, 2, 128, 258, 96, 12


def build(out: Path) -> dict:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    layer = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                        head_dim=HIDDEN // HEADS, intermediate_size=INTERMEDIATE, vocab_size=VOCAB,
                        num_hidden_layers=1, rms_norm_eps=1e-6, max_position_embeddings=512,
                        attn_implementation="eager")  # dense float masks: any length (flex needs 128s)
    layer.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=DRAFT_VOCAB, norm_before_residual=False,
        eagle_aux_hidden_state_layer_ids=[2, 3, 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path="tiny-target", architectures=["LlamaForCausalLM"])),
    )
    torch.manual_seed(0)
    model = Eagle3DraftModel(config).eval()
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
    model.save_pretrained(out / "head")
    gen = torch.Generator().manual_seed(2)
    features = torch.randn(1, TOKENS, 3 * HIDDEN, generator=gen)
    tokens = torch.randint(0, VOCAB, (1, TOKENS + 2), generator=gen)
    logits: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out_: logits.append(out_.detach().clone()))
    with torch.no_grad():  # speculators pairs feature t with input_ids[t]: it takes the tokens shifted by one
        model(hidden_states=features, input_ids=tokens[:, 1:TOKENS + 1], document_ids=torch.zeros(1, TOKENS,
              dtype=torch.long), position_ids=torch.arange(TOKENS)[None], ttt_steps=2)
    hook.remove()
    return {
        "command": "bash scripts/eagle3_parity.sh",
        "reference": f"speculators {version('speculators')} Eagle3DraftModel, transformers {transformers.__version__}, "
                     f"torch {torch.__version__}, Python {platform.python_version()}",
        "shape": {"hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "intermediate": INTERMEDIATE,
                  "vocab": VOCAB, "draft_vocab": DRAFT_VOCAB, "aux_layers": [2, 3, 3]},
        "features": features[0].tolist(),
        "tokens": tokens[0].tolist(),
        "level0_logits": logits[0][0].tolist(),  # row t: feature t with token t + 1, at position t
        "level1_logits": logits[1][0].tolist(),  # row t: level 0's output at t with token t + 2, at t + 1
    }


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    record = build(out)
    (out / "reference.json").write_text(json.dumps(record), encoding="utf-8")
    print(json.dumps({k: v for k, v in record.items() if k in ("command", "reference", "shape")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
