"""Write the tiny MTP checkpoints the tests read (``data/mtp_parity/``): tiny targets with their
MTP layers, trained briefly on the target's own greedy text (``talon.gpucheck.mtp``), saved with
``save_pretrained`` and the MTP tensors in their family's naming.

* ``deepseek_v3``: DeepSeek-V3's classes (MLA attention, a routed MoE with a shared expert),
  ``model.layers.{N}.*`` naming, one MTP layer;
* ``deepseek_v3_chained``: the same classes with three MTP layers, trained chained (layer k drafts
  depth k + 1, as transformers runs them);
* ``glm4_moe_lite``: GLM-4.7-Flash's classes (MLA in every layer, a dense first layer then a
  routed MoE with a shared expert), ``model.layers.{N}.*`` naming, one MTP layer; its config
  declares the layer as GLM-4.7-Flash's does, ``num_nextn_predict_layers`` alone;
* ``mellum``: Mellum's classes, dense MLPs and grouped-query attention (its MTP layer on full
  attention: transformers builds a sliding MTP layer's rotary only beside sliding target layers),
  ``mtp.*`` naming.

Run: ``.venv/bin/python -m scripts.mtp_fixtures [--out data/mtp_parity]`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DeepseekV3Config, Glm4MoeLiteConfig, MellumConfig

from talon.gpucheck.mtp import random_mtp, train_mtp, write_mtp_checkpoint
from tests.tiny import byte_tokenizer

PROMPTS = ["def add(a, b):", "abc abc abc abd", "one two three, one", "for i in range(10):", "The quick brown fox"]
COMMON = dict(vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=512, eos_token_id=256, pad_token_id=257, bos_token_id=None,
              tie_word_embeddings=False, num_nextn_predict_layers=1)


def deepseek_v3(mtp_layers: int) -> DeepseekV3Config:
    """A tiny DeepSeek-V3: MLA attention, a routed MoE with a shared expert, ``mtp_layers`` MTP layers."""
    return DeepseekV3Config(**{**COMMON, "num_nextn_predict_layers": mtp_layers}, num_key_value_heads=4,
                            moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                            first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                            qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)


def glm4_moe_lite() -> Glm4MoeLiteConfig:
    """A tiny GLM-4.7-Flash: MLA in every layer, a dense first layer, then a routed MoE."""
    return Glm4MoeLiteConfig(**COMMON, num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=4,
                             num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=24,
                             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)


# fields transformers' MtpModel needs that GLM-4.7-Flash's config.json lacks (talon.models.mtp.declare_mtp_layers)
DERIVED = ("num_mtp_layers", "mtp_mlp_layer_types")

FAMILIES = {
    "deepseek_v3": (lambda: deepseek_v3(1), "layers"),
    "deepseek_v3_chained": (lambda: deepseek_v3(3), "layers"),  # three layers: chained, layer k drafts depth k + 1
    "glm4_moe_lite": (glm4_moe_lite, "layers"),
    "mellum": (lambda: MellumConfig(**COMMON, num_key_value_heads=2, head_dim=16,
                                    mlp_layer_types=["dense", "dense"], mtp_layer_types=["full_attention"],
                                    mtp_mlp_layer_types=["dense"]), "mtp"),
}


def tiny_target(config: object, seed: int) -> torch.nn.Module:
    """A random target from ``config``, its LM head sharpened so greedy text is decisive."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 256, 257
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/mtp_parity"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--only", choices=sorted(FAMILIES), help="write this family's checkpoint alone")
    args = parser.parse_args()
    tokenizer = byte_tokenizer()
    for family, (make_config, naming) in FAMILIES.items():
        if args.only and family != args.only:
            continue
        target = tiny_target(make_config(), seed=11)
        texts = []
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            with torch.inference_mode():
                texts.append(target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                             max_new_tokens=72)[0].tolist())
        layers = random_mtp(target, seed=3)
        chained = layers.layers > 1
        report = train_mtp(layers, target, texts, steps=args.steps, levels=max(2, layers.layers), chained=chained)
        out = args.out / family
        shutil.rmtree(out, ignore_errors=True)
        write_mtp_checkpoint(target, layers, out, naming, tokenizer)
        written, own = json.loads((out / "config.json").read_text(encoding="utf-8")), make_config().to_dict()
        written = {k: v for k, v in written.items() if k in own or k not in DERIVED}  # as the family ships it
        (out / "config.json").write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")
        (out / "training.json").write_text(json.dumps({**report, "naming": naming, "prompts": PROMPTS}, indent=1)
                                           + "\n", encoding="utf-8")
        print(family, naming, report)


if __name__ == "__main__":
    main()
