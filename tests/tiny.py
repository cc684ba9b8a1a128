"""Tiny random causal LMs (built from a config) and a byte-level tokenizer, for fast math tests; a
tiny target with an EAGLE-3 head trained on its own text, in seconds (``trained_pair``)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from talon.gpucheck.head import frequent_tokens
from talon.gpucheck.head import train_head as trained
from talon.models import LoadedModel
from talon.models.eagle3 import Eagle3Head

SPECIALS = ["<eos>", "<pad>"]


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens (GPT-2 byte-to-unicode alphabet) + <eos> + <pad>, no merges."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    return fast


VOCAB = 258


def tiny_model(
    kind: str = "llama", seed: int = 0, layers: int = 2, hidden: int = 64, vocab: int = VOCAB
) -> torch.nn.Module:
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=256 if vocab == VOCAB else None,
        pad_token_id=257 if vocab == VOCAB else None,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    config = LlamaConfig(**common) if kind == "llama" else Qwen2Config(**common)
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    # Sharpen the random logits so greedy paths are decisive and drafts get accepted.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.generation_config.eos_token_id = 256 if vocab == VOCAB else None
    model.generation_config.pad_token_id = 257 if vocab == VOCAB else None
    return model.eval()


MAT_FLOOR = 1.5  # a run that accepts nothing never reads a tree position, a tree mask or a cache move


def assert_decodes_own_generate(target: LoadedModel, draft: LoadedModel | None, drafter: str, tree: str,
                                prompt: str = "abc abc abc abc abd", tokens: int = 32,
                                min_mat: float = MAT_FLOOR) -> None:
    """Speculative decoding of ``target`` (``draft`` None: the drafter needs none) gives its own
    greedy ``generate`` token for token, with drafts accepted (mean accepted tokens at least
    ``min_mat``: pass a draft close to the target). The prompt is followed by the target's own
    greedy text (a random model's greedy text repeats, so retrieval finds its drafts in it)."""
    from talon.engine.engine import Engine, generate
    from talon.run_config import RunConfig, TreeConfig

    ids = target.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        ids = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16)
        want = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=tokens)[0, ids.shape[1]:].tolist()
    cfg = RunConfig(drafter=drafter, max_new_tokens=tokens, chat_template=False,
                    tree=TreeConfig(mode=tree, budget=12, cost_aware=False))
    summary, _ = generate(Engine(target, draft, costs=None), ids[0].tolist(), cfg)
    assert summary.token_ids == want[: len(summary.token_ids)]
    assert len(summary.token_ids) == tokens or summary.stop_reason == "eos"
    assert summary.mean_accepted_tokens >= min_mat, f"{drafter}/{tree}: MAT {summary.mean_accepted_tokens:.2f}"


def tiny_loaded(kind: str = "llama", seed: int = 0, **kw: int) -> LoadedModel:
    return LoadedModel(
        model=tiny_model(kind, seed, **kw),
        tokenizer=byte_tokenizer(),
        name=f"tiny-{kind}-{seed}",
        dtype=torch.float32,
        device=torch.device("cpu"),
    )


def tiny_head(target: torch.nn.Module, seed: int = 0, draft_tokens: list[int] | None = None) -> torch.nn.Module:
    """A random EAGLE-3 head on ``target`` (its width, its embedding, its default feature layers),
    drafting over ``draft_tokens`` (ascending target ids; None: the whole vocabulary)."""
    from talon.gpucheck.head import random_head
    from talon.models.head_config import HeadConfig

    cfg = target.config
    vocab = target.get_input_embeddings().weight.shape[0]
    tokens = list(range(vocab)) if draft_tokens is None else sorted(draft_tokens)
    head_cfg = HeadConfig(hidden=cfg.hidden_size, target_hidden=cfg.hidden_size, heads=4, kv_heads=2,
                          head_dim=cfg.hidden_size // 4, intermediate=2 * cfg.hidden_size, vocab=vocab,
                          draft_vocab=len(tokens), rms_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                          aux_layers=None, aux_rule="none written", norm_before_residual=False, layout="eagle")
    head = random_head(head_cfg, target, tokens, seed).eval()
    head.talon_name = f"tiny-head-{seed}"
    return head


# ------------------------------------------------------------------ a tiny target and a trained EAGLE-3 head

HEAD_LAYERS = 6  # the head reads the hidden states entering layers 2, 3 and 3
HEAD_PROMPTS = ["abc abc abc abc abd", "def add(a, b):", "one two three, one", "xyz xyz xy"]
DRAFT_TOKENS = 96  # the head drafts over the text's most frequent tokens: a real vocabulary map


def greedy_text(target: LoadedModel, prompt: str, tokens: int) -> list[int]:
    ids = target.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=tokens)
    return out[0].tolist()


def train_head(target: LoadedModel, texts: list[list[int]], steps: int = 250) -> Eagle3Head:
    """A head fitted to predict token t + 2 from (feature t, token t + 1), as EAGLE-3 trains its
    first draft level, over the texts' ``DRAFT_TOKENS`` most frequent tokens (the GPU check's
    recipe, ``talon.gpucheck.head.train_head``)."""
    vocab = frequent_tokens(texts, DRAFT_TOKENS, target.model.get_input_embeddings().weight.shape[0])
    head = tiny_head(target.model, seed=5, draft_tokens=vocab)
    return trained(head, target, texts, steps=steps, seconds=float("inf"))[0]


def trained_pair() -> tuple[LoadedModel, LoadedModel]:
    """A tiny target and a head trained on its greedy text (float32, CPU)."""
    target = LoadedModel(tiny_model("llama", 41, layers=HEAD_LAYERS), byte_tokenizer(), "tiny-target", torch.float32,
                         torch.device("cpu"))
    texts = [greedy_text(target, p, 64) for p in HEAD_PROMPTS]
    head = train_head(target, texts)
    return target, LoadedModel(head, target.tokenizer, "tiny-head", torch.float32, torch.device("cpu"))
