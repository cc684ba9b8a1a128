"""EAGLE-3 heads for the GPU check, and the recipe the tests train theirs by: a head at a head
preset's shapes on the check's random target, trained where it runs, within a time budget, on the
target's own greedy text (EAGLE's trainer and SpecForge do the same at scale; here the first draft
level only), so that its drafts are accepted and a lossless check reads tree positions, masks and
cache moves; and its forward timed at the preset's width."""

from __future__ import annotations

import copy
import gc
import math
import time
from collections import Counter
from typing import Any

import torch
from transformers import DynamicCache

from talon.core.forward import additive_mask
from talon.drafters.pairs import pair_timer
from talon.models import LoadedModel
from talon.models.eagle3 import Eagle3Head
from talon.models.head_config import HeadConfig
from talon.models.memory import ModelShape

TRAIN_S = 30.0  # the most a head trains on a device
TRAIN_STEPS = 250  # and at most this many steps (the tests' recipe, seconds on a CPU at tiny shapes)
TIMED_NODES = (1, 8, 64)  # the head's forward timed at these tree widths
LR, LR_WIDTH = 1e-2, 128  # Adam's rate at the tests' width; wider heads take it x LR_WIDTH / width


def learning_rate(width: int) -> float:
    """Adam's step for a head ``width`` wide: ``LR`` up to ``LR_WIDTH``, then shrinking as 1 /
    width (a wider layer's output moves width times more for the same step in every weight).
    Measured on the CPU at the 8B head preset's vocabulary, 150 steps, 3 levels, width 512: rate
    1e-2 left the loss at 16.6, 2.5e-3 (this rule) 0.40, 1e-3 0.009, 3e-4 0.066; at width 1024
    this rule's 1.25e-3 reached 0.002; the 8B preset
    at width 4096 trained at 1e-2 on an H200 stayed at 24.3 (near chance) and its drafts were
    hardly accepted (MAT 1.03-1.21)."""
    return LR * min(1.0, LR_WIDTH / width)


def head_config(shape: ModelShape, target: torch.nn.Module, draft_vocab: int) -> HeadConfig:
    """A one-layer head of ``shape``'s attention and MLP on ``target`` (its width, its vocabulary,
    its default feature layers), drafting over ``draft_vocab`` ids."""
    cfg = target.config
    vocab = target.get_input_embeddings().weight.shape[0]
    return HeadConfig(hidden=cfg.hidden_size, target_hidden=cfg.hidden_size, heads=shape.heads, kv_heads=shape.kv_heads,
                      head_dim=cfg.hidden_size // shape.heads, intermediate=shape.intermediate, vocab=vocab,
                      draft_vocab=min(draft_vocab, vocab), rms_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                      aux_layers=None, aux_rule="none written: 2, N//2, N-3", norm_before_residual=False,
                      layout="eagle")


def random_head(cfg: HeadConfig, target: torch.nn.Module, draft_tokens: list[int], seed: int = 5) -> Eagle3Head:
    """A random head on ``target``'s embedding, drafting over ``draft_tokens`` (ascending target
    ids), on the target's device, in float32."""
    torch.manual_seed(seed)
    head = Eagle3Head(cfg, target.get_input_embeddings())
    with torch.no_grad():
        for param in head.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.5 / param.shape[1] ** 0.5)
        head.d2t.copy_(torch.tensor(draft_tokens) - torch.arange(len(draft_tokens)))  # target id = i + d2t[i]
    head.talon_name = f"trained-head-{seed}"  # type: ignore[assignment]
    return head.to(device=next(target.parameters()).device, dtype=torch.float32)


def frequent_tokens(texts: list[list[int]], count: int, vocab: int, fill: bool = False) -> list[int]:
    """The ``count`` ids the texts use most, ascending: a draft vocabulary (``fill``: topped up to
    ``count`` with the lowest other ids, a preset head's full width)."""
    counts = Counter(t for ids in texts for t in ids)
    used = sorted(counts, key=lambda t: -counts[t])[:count]  # ties: first seen first
    if fill:
        taken = set(used)
        used += [t for t in range(vocab) if t not in taken][:count - len(used)]
    return sorted(used)


def features_of(target: LoadedModel, ids: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """(n, 3H) float32: the target's hidden states entering ``layers`` at every position of ``ids``."""
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids], device=target.device), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], dim=-1).float()


def train_head(head: Eagle3Head, target: LoadedModel, texts: list[list[int]], steps: int = TRAIN_STEPS,
               seconds: float = TRAIN_S, levels: int = 1) -> tuple[Eagle3Head, dict]:
    """Fit ``head`` on ``texts`` (the target's own greedy text) as EAGLE-3 trains it, with Adam for
    ``steps`` steps or ``seconds``, whichever ends first: level 0 predicts token t + 2 from
    (feature t, token t + 1); level k (``levels`` in all, EAGLE-3's training-time test) feeds
    level k - 1's output at t with token t + k + 1, at position t + k, seeing level 0 up to t and
    its own chain, and predicts token t + k + 2. Returns the head (eval) and what training did."""
    layers = head.cfg.layers_for(int(target.model.config.num_hidden_layers))
    draft_id = {int(t): i for i, t in enumerate((torch.arange(head.cfg.draft_vocab, device=head.device)
                                                 + head.d2t).tolist())}
    batches = [_batch(head, features_of(target, ids, layers), ids, levels, draft_id) for ids in texts]
    lr = learning_rate(head.cfg.hidden)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    head.train()
    start, done, loss = time.perf_counter(), 0, torch.zeros(())
    while done < steps and time.perf_counter() - start < seconds:
        loss = sum(_loss(head, *batch) for batch in batches)
        opt.zero_grad()
        loss.backward()
        opt.step()
        done += 1
    return head.eval(), {"steps": done, "seconds": round(time.perf_counter() - start, 1), "levels": levels, "lr": lr,
                         "loss": round(float(loss.detach()), 4), "texts": len(texts), "feature_layers": list(layers)}


def _batch(head: Eagle3Head, features: torch.Tensor, ids: list[int], levels: int,
           draft_id: dict[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """One text's training rows: features (n, 3H), each level's input tokens and targets (levels,
    n; -100 past the text) and each level's additive mask."""
    n, device = len(ids) - 2, head.device
    def token(i: int, missing: int) -> int:
        return ids[i] if i < len(ids) else missing

    tokens = torch.tensor([[token(t + k + 1, 0) for t in range(n)] for k in range(levels)],
                          device=device)  # (levels, n): level k's input, token t + k + 1
    wanted = torch.tensor([[draft_id.get(token(t + k + 2, -1), -100) for t in range(n)] for k in range(levels)],
                          device=device)  # (levels, n): what level k predicts, token t + k + 2 (-100: none)
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (n, n)
    masks = [additive_mask(torch.cat([causal] + [torch.eye(n, dtype=torch.bool, device=device)] * k, dim=1),
                           torch.float32) for k in range(levels)]  # level k: (n, (k + 1) n)
    return features[:n].clone(), tokens, wanted, masks


def _loss(head: Eagle3Head, features: torch.Tensor, tokens: torch.Tensor, wanted: torch.Tensor,
          masks: list[torch.Tensor]) -> torch.Tensor:
    """The summed cross-entropy of every level, fed as the drafter feeds a chain."""
    cache, out, loss = DynamicCache(), features, torch.zeros((), device=head.device)
    n = features.shape[0]
    for k, mask in enumerate(masks):
        out, logits = head(out, tokens[k], torch.arange(k, k + n, device=head.device), cache, mask)
        loss = loss + torch.nn.functional.cross_entropy(logits, wanted[k], ignore_index=-100)
    return loss


def time_head(head: Eagle3Head, prefix: int = 256, sizes: tuple[int, ...] = TIMED_NODES, reps: int = 10) -> dict:
    """Milliseconds of one head forward of ``size`` tree nodes over ``prefix`` committed pairs
    (best of ``reps``, the layer's top-k copied back as a draft forward reads it)."""
    timer = pair_timer(head, prefix, head.cfg.vocab, max(sizes))
    for size in sizes:  # warm-up: kernels chosen, allocator primed
        timer(size)
    return {str(size): round(1000 * min(timer(size) for _ in range(reps)), 3) for size in sizes}


def head_forward(ctx: Any) -> tuple[bool, dict]:
    """The trained head's forward in bf16 on this device (``ctx``: a head preset's
    ``talon.gpucheck.pairs.PairRun``), at ``TIMED_NODES`` tree widths over 256 committed pairs
    (milliseconds, best of 10): what a head's draft layer costs beside the target's verification.
    A measurement: it passes when every width ran."""
    head = ctx.models.get("draft", torch.float32).model
    embed = head.__dict__.pop("embed")  # the target's: shared, not copied
    try:
        twin = copy.deepcopy(head).to(torch.bfloat16)  # the float32 head stays as trained
    finally:
        head.__dict__["embed"] = embed
    twin.__dict__["embed"] = embed
    ms = time_head(twin, prefix=64 if ctx.tiny else 256)
    del twin
    gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return all(math.isfinite(v) and v > 0 for v in ms.values()), {"ms": ms, "head_training": ctx.models.training,
                                                                   "width": ctx.spec.draft.hidden}
