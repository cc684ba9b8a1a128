"""Random-weight check models that tell a bug from noise, and the gate that proves they do.

A check of losslessness compares two ways of computing the same thing: Talon's tree forwards
against ``generate()``'s. On a random model they only agree if the model is *well conditioned*:
its logits must not move when the same tokens are fed in another split (a cache prefix and a
block), or the two ways part on noise and a correct engine fails. The old init (q and k x6, the
final norm x4) is chaotic at the presets' depth: split against full differs by several logits
at 28 layers.

The ``conditioned`` init here is stable at any depth and still decisive:

* **residual branches scaled down with depth** (``o_proj`` and ``down_proj`` by 1/sqrt(2 L)),
  the MLP's by its width too (``REFERENCE_MLP``), and a model narrower than ``REFERENCE_HIDDEN``
  scaled up to it (its branches and attention logits), embeddings of unit scale, so the residual
  stream is the token's embedding plus a context term of the same size at any shape, and no
  layer amplifies rounding;
* **a planted bigram chain**: the LM head scores token ``j`` by how much the hidden state points
  along the embedding of pi^-1(j), for a permutation pi of short cycles shared by target and
  draft, plus a random part of the same order. So greedy text follows pi where the context
  agrees and leaves it where it does not (the random part scaled so its largest value over the
  vocabulary is what it is over ``REFERENCE_VOCAB`` ids): a draft of the same chain is accepted in part,
  retrieval finds repeats, and a wrong mask or position id (a different context) changes the
  output.

``conditioning`` measures, on the model under test, split against full in float32 (and bf16
against float32 where the check runs in bf16), and says **invalid**, with the numbers, past
``SPLIT_BOUND`` / ``BF16_BOUND``: a check on such a model is neither a pass nor a fail.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig, PreTrainedModel, Qwen2Config, Qwen3Config

from talon.models.rng import generator_for

INITS = ("conditioned", "sharp")  # "sharp": the old init, kept to show the gate trips on it
CHAIN_SEED = 7  # one bigram chain for every model of a pair: the draft knows the target's
CHAIN_CYCLE = 12  # tokens per cycle of the chain: greedy text repeats, so retrieval has hits
BIGRAM_WEIGHT = 6.0  # logits of the chain's next token, at full alignment
RANDOM_WEIGHT = 1.0  # std of the head's random part, in logits: the context's say
QK_SHARPEN = 2.0  # q and k scale: how peaked (so how position-sensitive) attention is
SPLIT_BOUND = 1e-3  # float32: most any last logit may move between a full and a split forward
BF16_BOUND = 0.25  # bf16 against float32, in logits: below the judge's near-tie scale at these logits
SPLIT_TAIL = 4  # the split feeds the last SPLIT_TAIL tokens as one block, as a tree is fed
# The shape at which the balance of chain, context and noise above was struck (the full-depth
# test's narrowed models: a draft's trees accepted at MAT 2.7-5.3 and a planted bug caught). A
# wider MLP writes more into the residual stream and a larger vocabulary has a larger random
# maximum, which at the presets' real shapes drowned the chain (every model draft rejected):
# both are scaled back to this reference, so the balance holds at every shape.
REFERENCE_MLP = 256
REFERENCE_VOCAB = 2048
# A narrower model's attention logits and branch outputs are smaller (their std grows with the
# width): scaled back to this width's, or a tiny model's output ignores its context and a planted
# position or mask bug goes unnoticed (seen at the --tiny shapes: caught by none of the pairs).
REFERENCE_HIDDEN = 3584


def bigram_chain(vocab: int, seed: int = CHAIN_SEED, cycle: int = CHAIN_CYCLE) -> torch.Tensor:
    """(vocab,) long: pi, a permutation of ``range(vocab)`` made of cycles of ``cycle`` ids (the
    last one shorter), the same for every vocabulary on its common ids' cycles."""
    order = torch.randperm(vocab, generator=generator_for("cpu", seed))  # (V,) on the host: the same on every device
    nxt = torch.empty(vocab, dtype=torch.long)
    for start in range(0, vocab, cycle):
        ring = order[start:start + cycle]
        nxt[ring] = ring.roll(-1)
    return nxt


def chain_prompt(vocab: int, length: int, seed: int) -> list[int]:
    """A prompt that ends on a walk of the bigram chain it walked once before (from the same
    token), so retrieval finds its suffix and proposes the walk's continuation: random ids, the
    walk, random ids, the walk again, cut to ``length`` from the front."""
    g = generator_for("cpu", seed)  # host ids, the same on every device
    chain = bigram_chain(vocab)
    walk = [int(torch.randint(vocab, (1,), generator=g))]
    for _ in range(2 * CHAIN_CYCLE - 1):
        walk.append(int(chain[walk[-1]]))
    noise = torch.randint(vocab, (max(length - 2 * len(walk), 2),), generator=g).tolist()
    half = len(noise) // 2
    return (noise[:half] + walk + noise[half:] + walk[:CHAIN_CYCLE])[-length:]


def config_for(shape, family: str, untie: bool = False):  # noqa: ANN001 - a talon.models.memory.ModelShape
    """The model's config; ``untie`` gives a tied shape its own head, so it can carry the chain."""
    config_cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config}.get(family, LlamaConfig)
    kwargs = shape.config_kwargs() | ({"tie_word_embeddings": False} if untie else {})
    return config_cls(**kwargs, max_position_embeddings=8192, eos_token_id=None, bos_token_id=None,
                      pad_token_id=None)


@torch.no_grad()
def sharpen_qk(model: PreTrainedModel, attention: torch.nn.Module, factor: float) -> None:
    """Scale an attention's q and k by ``factor``. Where a per-head norm follows the projections
    (Qwen3's ``q_norm`` / ``k_norm``) scaling them would be undone, so the norms' weights are set
    to the scale the projections have in a model without them (init std x sqrt(hidden)), times
    ``factor``: the same attention logits either way."""
    if hasattr(attention, "q_norm"):
        scale = factor * model.config.initializer_range * math.sqrt(model.config.hidden_size)
        attention.q_norm.weight.fill_(scale)
        attention.k_norm.weight.fill_(scale)
        return
    attention.q_proj.weight.mul_(factor)
    attention.k_proj.weight.mul_(factor)


@torch.no_grad()
def condition(model: PreTrainedModel, init: str, chain_vocab: int, seed: int) -> None:
    """Rescale a freshly initialised model in place (see the module's docstring)."""
    layers = model.model.layers
    if init == "sharp":
        model.model.norm.weight.mul_(4.0)
        for layer in layers:
            sharpen_qk(model, layer.self_attn, 6.0)
        return
    if init != "conditioned":
        raise ValueError(f"init must be one of {INITS}, not {init!r}")
    narrow = max(1.0, REFERENCE_HIDDEN / model.config.hidden_size)
    qk = QK_SHARPEN * math.sqrt(narrow)  # q and k both: the logits by ``narrow``
    branch = narrow / math.sqrt(2 * len(layers))
    # (its output's std ~ sqrt(width))
    mlp = branch * math.sqrt(min(1.0, REFERENCE_MLP / model.config.intermediate_size))
    for layer in layers:
        sharpen_qk(model, layer.self_attn, qk)
        layer.self_attn.o_proj.weight.mul_(branch)
        layer.mlp.down_proj.weight.mul_(mlp)
    if model.config.tie_word_embeddings:  # one matrix cannot both name a token and predict its successor:
        return  # a tied model gets the conditioning only (the memory check's draft, at its real shape)
    embed = model.get_input_embeddings().weight  # (V, H)
    g = torch.Generator(device=embed.device).manual_seed(seed + 1000)  # drawn where the weights live
    vocab, hidden = embed.shape
    unit = torch.randn(vocab, hidden, generator=g, device=embed.device)  # (V, H): each token's own direction
    # the largest of V normal draws grows as sqrt(2 ln V): held at its REFERENCE_VOCAB value
    spread = RANDOM_WEIGHT * math.sqrt(min(1.0, math.log(REFERENCE_VOCAB) / math.log(vocab)))
    head = torch.randn(vocab, hidden, generator=g, device=embed.device) * (spread / math.sqrt(hidden))
    chain = bigram_chain(chain_vocab).to(embed.device)  # (Vc,)
    prev = torch.empty_like(chain)
    prev[chain] = torch.arange(chain_vocab, device=embed.device)  # pi^-1
    head[:chain_vocab] += unit[prev] * (BIGRAM_WEIGHT / hidden)  # logit ~ BIGRAM_WEIGHT * cos(h, e_prev)
    embed.copy_(unit.to(embed.dtype))
    model.get_output_embeddings().weight.copy_(head.to(embed.dtype))


def build_model(shape, family: str, seed: int, dtype: torch.dtype, device: torch.device,  # noqa: ANN001
                init: str = "conditioned", chain_vocab: int | None = None, untie: bool = False) -> PreTrainedModel:
    """A random decoder of ``shape`` in ``dtype`` on ``device``, rescaled by ``init``.
    ``chain_vocab``: the ids the bigram chain covers (the pair's smaller vocabulary)."""
    torch.manual_seed(seed)
    with torch.device(device):  # built where it runs: a 14B model initialised on the host takes minutes
        model = AutoModelForCausalLM.from_config(config_for(shape, family, untie), attn_implementation="sdpa",
                                                 dtype=torch.float32 if device.type == "cpu" else dtype)
    condition(model, init, min(chain_vocab or shape.vocab, shape.vocab), seed)
    model = model.to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


# ------------------------------------------------------------------------------------ the gate


@dataclass(frozen=True)
class Conditioning:
    """What the gate measured on one model: the largest move of the last ``SPLIT_TAIL`` logits
    between a full and a split forward (float32), bf16 against float32 where measured, and the
    median gap between the best and second logit (how decisive the model is)."""

    layers: int
    split_vs_full: float
    bf16_vs_fp32: float | None
    median_gap: float
    valid: bool
    why: str

    def as_detail(self) -> dict:
        out = {"layers": self.layers, "split_vs_full": float(f"{self.split_vs_full:.3g}"),
               "median_top_gap": round(self.median_gap, 3), "bounds": {"split": SPLIT_BOUND, "bf16": BF16_BOUND}}
        if self.bf16_vs_fp32 is not None:
            out["bf16_vs_fp32"] = round(self.bf16_vs_fp32, 4)
        return out


@torch.inference_mode()
def last_logits(model: PreTrainedModel, ids: torch.Tensor, split: bool) -> torch.Tensor:
    """(SPLIT_TAIL, V) float32: the last logits of ``ids`` (1, P), in one forward or as a cache of
    all but the tail, then the tail as one block."""
    if not split:
        return model(ids).logits[0, -SPLIT_TAIL:].float()
    cache = DynamicCache(config=model.config)
    model(ids[:, :-SPLIT_TAIL], past_key_values=cache, use_cache=True)
    return model(ids[:, -SPLIT_TAIL:], past_key_values=cache, use_cache=True).logits[0].float()


@torch.inference_mode()
def conditioning(model: PreTrainedModel, ids: list[int], bf16: bool = False) -> Conditioning:
    """The gate, on ``model`` itself. With ``bf16`` the model (bf16) is also upcast in place to
    float32 and back (exact: every bf16 value is a float32 one), so no second copy is held."""
    x = torch.tensor([ids], device=model.device)  # (1, P)
    low = last_logits(model, x, split=False) if bf16 else None
    if bf16:
        model.float()
    try:
        full, split = last_logits(model, x, split=False), last_logits(model, x, split=True)
    finally:
        if bf16:
            model.to(torch.bfloat16)
    drift = float((full - split).abs().max())
    top2 = full.topk(2, dim=-1).values  # (SPLIT_TAIL, 2)
    gap = float((top2[:, 0] - top2[:, 1]).median())
    bf16_drift = float((low - full).abs().max()) if low is not None else None
    problems = []
    if not drift <= SPLIT_BOUND:
        problems.append(f"split against full moves the logits by {drift:.3g} (bound {SPLIT_BOUND:g})")
    if bf16_drift is not None and not bf16_drift <= BF16_BOUND:
        problems.append(f"bf16 against float32 moves them by {bf16_drift:.3g} (bound {BF16_BOUND:g})")
    why = "; ".join(problems) or "within bounds"
    return Conditioning(model.config.num_hidden_layers, drift, bf16_drift, gap, not problems, why)


# ------------------------------------------------------------------------------------ planted bugs


def positions_shifted(tree, prefix_len: int) -> torch.Tensor:  # noqa: ANN001 - a talon.tree.DraftTree
    """Every node below the root one position too far (the root's right): a tree position bug."""
    return prefix_len + torch.tensor(tree.depths, dtype=torch.long) + (torch.tensor(tree.depths) > 0).long()


def siblings_visible(tree) -> torch.Tensor:  # noqa: ANN001
    """(T, T): causal over node order, not the tree, so a node sees its elder siblings: a mask bug."""
    n = len(tree.tokens)
    return torch.ones(n, n, dtype=torch.bool).tril()


PLANTS = {"position": ("tree_positions", positions_shifted), "mask": ("tree_mask", siblings_visible)}


@contextlib.contextmanager
def planted(bug: str | None) -> Iterator[None]:
    """For the duration, the verification's tree positions or tree mask wrong (``PLANTS``), on
    every step (the dynamic cache's verifier and the static pool's read them by name): a lossless
    check that still passes has no teeth. ``None``: nothing planted."""
    if bug is None:
        yield
        return
    import talon.core.verify
    import talon.graphs.pool

    name, wrong = PLANTS[bug]
    modules = (talon.core.verify, talon.graphs.pool)
    saved = [getattr(m, name) for m in modules]
    for m in modules:
        setattr(m, name, wrong)
    try:
        yield
    finally:
        for m, real in zip(modules, saved):
            setattr(m, name, real)
