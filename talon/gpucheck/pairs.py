"""The GPU check's pairs: random-weight draft/target models at the shapes of each GPU preset,
built on demand and dropped when a check does not need them, and the records every check returns
(``talon/gpucheck/check.py`` runs them; see its docstring)."""

from __future__ import annotations

import copy
import dataclasses
import gc
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from talon.engine.engine import Engine
from talon.gpucheck.check_model import Conditioning, build_model, chain_prompt, conditioning
from talon.gpucheck.head import frequent_tokens, head_config, random_head, train_head
from talon.gpucheck.mtp import MTP_TARGETS, check_config, check_target, random_mtp, train_mtp
from talon.models import LoadedModel
from talon.models.eagle3 import is_head
from talon.models.memory import KNOWN_SHAPES, ModelShape, estimate_pair, mla_moe_shape, scaled
from talon.models.rng import generator_for
from talon.server.presets import PRESETS

MODES = ("adaptive", "static", "chain")
TINY_FACTOR = 16
TINY_HEAD_DIM = 64  # the tiny shapes' heads (2 of them): narrower, attention cannot tell positions apart
TINY_VOCAB = 1024  # the tiny pairs keep the real pairs' vocabulary difference on top of this
TINY_HEAD_LAYERS = 6  # a tiny head preset's target: its feature layers 2, 3 and 3
HEAD_LEVELS = 3  # draft levels a check's head trains: accepted paths deep enough for a mask bug to show
F32, BF16 = torch.float32, torch.bfloat16
SAMPLING_SEEDS = 400  # per pair; the chi-square needs expected counts >= 5 in each bin
CHI2_Z = 3.09  # the normal quantile of p = 0.001: a correct sampler fails one pair in a thousand
NOISE_SCALES = (0.3, 1.0, 2.0)  # noisy copies of the draft-sized target, x each tensor's std
FIT_TOKENS = 1024  # context the fit test allows the short checks (prompt + new tokens + tree)
HUB_TARGET, HUB_DRAFT = "talon-check/target", "talon-check/draft"
TINY_LIMITS = (192, 32, 64)  # --tiny: (prompt tokens, max_new_tokens, tree budget) on the CPU


@dataclass
class Check:
    name: str
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False  # did not run (``detail["skipped"]`` says why); never a pass
    seconds: float = 0.0
    invalid: bool = False  # its model failed the conditioning gate (``detail["invalid"]``): neither pass nor fail


class Skipped(Exception):
    """Raised by a check that cannot run here; the message says why, with the numbers."""


class Invalid(Exception):
    """Raised when a check's model fails its conditioning gate: the check would prove nothing.
    ``detail`` holds the gate's numbers."""

    def __init__(self, why: str, detail: dict[str, Any]) -> None:
        super().__init__(why)
        self.detail = detail


CheckOutcome = tuple[bool, dict[str, Any]]  # what a check function returns: passed?, and what it saw


@dataclass(frozen=True)
class PairSpec:
    key: str
    target: ModelShape
    draft: ModelShape
    gpu_gib: float | None
    family: str  # "llama" | "qwen2" | "qwen3" (ModelShape.family); an MTP preset's: its model type
    head: bool = False  # the draft slot holds an EAGLE-3 head (``draft``: its layer's shape, vocab its draft vocab)
    mtp: dict[str, Any] | None = None  # an MTP preset's target config (``talon.gpucheck.mtp``); ``draft``: the target's

    @property
    def slot(self) -> str:
        """What drafts: a draft model ("model"), an EAGLE-3 head ("head"), the target's MTP layer ("mtp")."""
        return "mtp" if self.mtp is not None else "head" if self.head else "model"


# ------------------------------------------------------------------------------------ models


def pair_specs(tiny: bool, only: set[str]) -> list[PairSpec]:
    """One spec per GPU preset whose shapes are known (``only``: those keys): a target and a draft
    model, or (a head preset) a target and an EAGLE-3 head's layer, whose head the checks train
    (``PairModels``). ``tiny`` shrinks width, depth and the vocabulary but keeps the difference
    between a draft model pair's two vocabularies (a head's target keeps ``TINY_HEAD_LAYERS``, so
    its three feature layers are apart); a plain ``--tiny`` leaves the head presets out (the suite
    names one). An MTP preset's target is its own classes at ``talon.gpucheck.mtp.check_config``
    (``tiny`` too, and named as the head presets are), its MTP layer trained by the checks."""
    specs = []
    for p in PRESETS:
        wanted = not (tiny and (p.head or p.mtp)) or p.key in only
        if not p.needs_cuda or not wanted or (only and p.key not in only) or p.target not in KNOWN_SHAPES:
            continue
        if p.mtp:
            config = check_config(p.target or "", tiny, TINY_VOCAB if tiny else KNOWN_SHAPES[p.target or ""].vocab)
            shape = mla_moe_shape(config)
            specs.append(PairSpec(p.key, shape, shape, p.gpu_gib, MTP_TARGETS[p.target or ""][0], mtp=config))
            continue
        target, draft = KNOWN_SHAPES[p.target], KNOWN_SHAPES[p.draft or ""]
        if tiny and p.head:
            target = dataclasses.replace(scaled(target, TINY_FACTOR), vocab=TINY_VOCAB, layers=TINY_HEAD_LAYERS)
            target = dataclasses.replace(target, hidden=target.heads * TINY_HEAD_DIM)
            draft = dataclasses.replace(scaled(draft, TINY_FACTOR), vocab=TINY_VOCAB, hidden=target.hidden)
        elif tiny:
            extra = target.vocab - draft.vocab
            target, draft = scaled(target, TINY_FACTOR), scaled(draft, TINY_FACTOR)
            target = dataclasses.replace(target, vocab=TINY_VOCAB + extra, hidden=target.heads * TINY_HEAD_DIM)
            draft = dataclasses.replace(draft, vocab=TINY_VOCAB, hidden=draft.heads * TINY_HEAD_DIM)
        specs.append(PairSpec(p.key, target, draft, p.gpu_gib, target.family, p.head))
    return specs


def byte_tokenizer(size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges: ids 0-255 are the bytes, the rest up to ``size`` filler
    tokens (as a real vocabulary's unused rows); no EOS, so random models always run to
    max_new_tokens and every comparison covers the same length."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({f"<extra_{i}>": i for i in range(len(vocab), size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def random_model(shape: ModelShape, family: str, seed: int, dtype: torch.dtype, device: torch.device,
                 init: str = "conditioned", chain_vocab: int | None = None, untie: bool = True) -> LoadedModel:
    """A random-weight check model (``check_model``: conditioned, with the pair's bigram chain
    over ``chain_vocab`` ids), with a byte tokenizer of its vocabulary."""
    model = build_model(shape, family, seed, dtype, device, init, chain_vocab, untie)
    return LoadedModel(model, byte_tokenizer(max(shape.vocab, 2)), f"random-{family}-{seed}", dtype, device)


def noisy(lm: LoadedModel, scale: float, seed: int) -> LoadedModel:
    """A copy of ``lm`` with Gaussian noise (``scale`` x each tensor's std) on its weights."""
    twin = dataclasses.replace(copy.deepcopy(lm), name=f"{lm.name}-noise{scale:g}")
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in twin.model.parameters():
            p.add_(torch.randn_like(p) * scale * p.float().std().to(p.dtype))
    return twin


def prompt_ids(vocab: int, length: int, seed: int) -> list[int]:
    """A prompt that ends on a second walk of the models' bigram chain, so that retrieval has
    something to find and the target something to agree with."""
    return chain_prompt(vocab, length, seed)


def random_ids(vocab: int, length: int, seed: int) -> list[int]:
    """Random ids with a span repeated: here the target follows its context more than its chain,
    so the draft model's deep nodes are accepted where a wrong mask or position would change them."""
    g = generator_for("cpu", seed)  # host ids, the same on every device
    span = torch.randint(1, vocab, (max(length // 3, 4),), generator=g).tolist()
    return (span + torch.randint(1, vocab, (length,), generator=g).tolist() + span)[:length]


def echo_ids(target: LoadedModel, ids: list[int], n: int) -> list[int]:
    """``ids``, the target's own greedy continuation of them (``n`` tokens), then ``ids`` again:
    retrieval finds the suffix and drafts the continuation that followed it, which the target
    repeats, so its deep chains are accepted (a repeating prompt, as real text often is)."""
    return ids + reference(target, ids, n) + ids


def path_engine(target: LoadedModel, draft: LoadedModel, path: str) -> Engine:
    """The engine ``path`` names (``graphs+chain+fold``: the forward, then what is switched on)."""
    forward, *on = path.split("+")
    return Engine(target, draft, forward=forward, chain="chain" in on, fold="fold" in on)


def reference(target: LoadedModel, ids: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        x = torch.tensor([ids], device=target.device)  # (1, P)
        out = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                                    pad_token_id=0)
    return out[0, len(ids):].tolist()


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def device_capacity(device: torch.device) -> int:
    """Bytes the device holds: the GPU's total memory, or the host's for the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


Role = tuple[str, torch.dtype]  # (which model of the pair, its dtype)


class PairModels:
    """The random models of one pair, built on first use and kept only while the next check
    names them: ``keep`` drops every other one first, so no check runs beside (or measures)
    models an earlier check left behind.

    Roles: ``target`` and ``draft`` at the preset's shapes (the draft with a head of its own, to
    carry the bigram chain); ``small-target``, a target of the draft's shape, for the checks where
    the draft is the target or a noisy copy of it (so no check holds two float32 copies of a 7B+
    target); ``tied-draft``, the draft exactly as the preset ships it (tied embeddings, so no
    chain), for the memory check.

    Every model is gated when built (``check_model.conditioning``): ``gates`` keeps the verdict
    per role and dtype, and a check on a model that fails its gate is reported invalid."""

    def __init__(self, spec: PairSpec, device: torch.device, tokens: int = 64) -> None:
        self.spec, self.device, self.tokens = spec, device, tokens  # tokens: what the checks decode
        self.training: dict[str, Any] = {}  # a head pair's: how its head was trained
        self.held: dict[Role, LoadedModel] = {}
        self.gates: dict[Role, Conditioning] = {}
        # the conditioned init at every shape, the tiny ones too: its planted chain gets the draft's
        # trees accepted (the old, sharp init accepted none), and its gate proves it each run
        self.init = "conditioned"

    def shape(self, role: str) -> ModelShape:
        return self.spec.target if role == "target" else self.spec.draft

    def get(self, role: str, dtype: torch.dtype) -> LoadedModel:
        if (role, dtype) not in self.held:
            self.held[(role, dtype)] = self._build(role, dtype)
        return self.held[(role, dtype)]

    def gate(self, role: str, dtype: torch.dtype) -> Conditioning:
        """The conditioning gate of the model in ``role`` (built if need be), measured once. A
        trained head has none: its drafts' acceptance (the lossless checks' floor) is its test."""
        if (role, dtype) not in self.gates:
            lm = self.get(role, dtype)
            ids = prompt_ids(self.spec.draft.vocab, 48, 3)
            trained = ("a trained EAGLE-3 head" if is_head(lm.model)
                       else "a target with its MTP layer trained" if self.spec.mtp is not None else "")
            self.gates[(role, dtype)] = (Conditioning(1, 0.0, None, 0.0, True, trained) if trained
                                         else conditioning(lm.model, ids, bf16=dtype == BF16))
        return self.gates[(role, dtype)]

    def _build(self, role: str, dtype: torch.dtype) -> LoadedModel:
        if role == "draft" and self.spec.head:
            return self._trained_head(dtype)
        if self.spec.mtp is not None:
            if role != "target":
                raise ValueError(f"an MTP preset's check holds its target alone, not a {role!r} model")
            return self._mtp_target(dtype)
        seed = {"target": 1, "draft": 2, "small-target": 4, "tied-draft": 2}[role]
        return random_model(self.shape(role), self.spec.family, seed, dtype, self.device, self.init,
                            chain_vocab=self.spec.draft.vocab, untie=role != "tied-draft")

    def _trained_head(self, dtype: torch.dtype) -> LoadedModel:
        """The head preset's head on the float32 target, trained here (``talon.gpucheck.head``) on
        the target's greedy text of the prompts the lossless checks decode with a model source."""
        target = self.get("target", F32)
        vocab = self.spec.draft.vocab
        texts = [ids + reference(target, ids, self.tokens) for ids in (random_ids(vocab, 48, 3),
                                                                       prompt_ids(vocab, 48, 3))]
        cfg = head_config(self.spec.draft, target.model, vocab)
        rows = target.model.get_input_embeddings().weight.shape[0]
        head = random_head(cfg, target.model, frequent_tokens(texts, cfg.draft_vocab, rows, fill=True))
        head, self.training = train_head(head, target, texts, levels=HEAD_LEVELS)
        return LoadedModel(head.to(dtype=dtype), target.tokenizer, f"trained-head-{self.spec.key}", dtype,
                           self.device)

    def _mtp_target(self, dtype: torch.dtype) -> LoadedModel:
        """The MTP preset's target (its own classes, random weights) with its MTP layer trained
        here (``talon.gpucheck.mtp``) on its greedy text of the prompts the lossless checks decode,
        reused at every depth (the ``reuse`` rule's training), attached as its checkpoint's would be."""
        from talon.drafters.mtp import attach_mtp

        spec = self.spec
        model = check_target(spec.family, spec.mtp or {}, 1, F32, self.device)
        lm = LoadedModel(model, byte_tokenizer(spec.target.vocab), f"random-{spec.family}-{spec.key}", F32,
                         self.device)
        vocab = spec.draft.vocab
        texts = [ids + reference(lm, ids, self.tokens) for ids in (random_ids(vocab, 48, 3), prompt_ids(vocab, 48, 3))]
        layers = random_mtp(model, seed=3)
        self.training = train_mtp(layers, model, texts, levels=HEAD_LEVELS)
        if dtype != F32:
            model.to(dtype)
            layers.to(dtype)
        attach_mtp(model, layers)
        return dataclasses.replace(lm, dtype=dtype)

    def keep(self, roles: tuple[Role, ...]) -> None:
        for key in [k for k in self.held if k not in roles]:
            del self.held[key]
        free_memory(self.device)

    def take(self, role: str, dtype: torch.dtype) -> LoadedModel:
        """The model, now the caller's alone (to change it in place): the pair forgets it."""
        return self.held.pop((role, dtype))

    def bytes_needed(self, roles: tuple[Role, ...], tokens: int) -> int:
        dtypes = {F32: "float32", BF16: "bfloat16"}
        return sum(estimate_pair(self.shape(r), None, dtypes[d], tokens).total for r, d in roles)


@dataclass
class PairRun:
    """What every check of one pair gets: the spec, the device, the pair's models."""

    spec: PairSpec
    device: torch.device
    tiny: bool
    models: PairModels

    @property
    def tokens(self) -> int:
        return 24 if self.tiny else 64


# ------------------------------------------------------------------------------------ acceptance


# A configuration that accepts nothing never reads a tree position, a tree mask or a cache move
# past the root, so its "equal to generate()" proves nothing: each lossless configuration must
# accept drafts at depth, and fails below its floor (``none`` drafts nothing: it has none).
# Retrieval drafts copies of the text so far. A random-weight model sensitive enough to its
# context for a planted bug to show rarely repeats itself, even on a prompt that repeats its own
# continuation (``echo_ids``; the tiny shapes 1.0-1.3 in the suite; at the 7B preset's width 1.0
# on every path, docs/gpu_runs/2026-11-26-h100-check-graphs.jsonl), nor on the planted chain's
# walk (the tiny shapes 1.0-1.33), so retrieval alone is held to no floor: its grafts are read
# where they are accepted, in hybrid's trees, and its MAT is reported.
MAT_FLOOR = 1.5
FLOORS = {"none": 0.0, "retrieval": 0.0}


def floor_of(key: str) -> float:
    """The floor of a configuration key (``drafter/...`` or ``forward/drafter/...``)."""
    return next((FLOORS[p] for p in key.split("/") if p in FLOORS), MAT_FLOOR)


def below_floor(mats: dict[str, float]) -> dict[str, float]:
    """The configurations that accepted too little to prove anything."""
    return {k: v for k, v in mats.items() if v < floor_of(k)}


def unread(mats: dict[str, float]) -> list[str]:
    """The drafting configurations (not ``none``, plain decoding) that accepted no draft at all
    (MAT 1.0): their output equals ``generate()``, but no tree of theirs was read. Retrieval's
    floor lets them pass; the report names them so that no one counts them as a tree proven."""
    return [k for k, v in mats.items() if v <= 1.0 and "none" not in k.split("/")]


def check_prompts(ctx: "PairRun", target: LoadedModel) -> dict[str, list[int]]:
    """Where each drafter's drafts are accepted at depth: the draft model on random ids (its deep
    nodes accepted where a wrong mask or position would change them), retrieval on a prompt that
    repeats (``echo``), the chain's walk (``chain``: the draft model follows the planted chain)."""
    vocab = ctx.spec.draft.vocab
    return {"random": random_ids(vocab, 48, 3), "echo": echo_ids(target, random_ids(vocab, 24, 3), ctx.tokens),
            "chain": prompt_ids(vocab, 48, 3)}
