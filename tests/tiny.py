"""What the tests share, in one home (no test module imports another; fixtures: conftest.py).

* Tiny random causal LMs (built from a config) and a byte-level tokenizer, for fast math tests; a
  tiny target with an EAGLE-3 head trained on its own text, in seconds (``trained_pair``);
* a draft that agrees with its target often but not always (``noisy_copy``), the target's own
  greedy continuation (``reference``), prompts (``PROMPTS``), and a drafter of random trees that
  hold the reference with some probability (``OracleTreeDrafter``);
* the repository's root (``REPO``) and the CPU (``CPU``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from talon.core.contracts import Draft
from talon.cost.model import synthetic_costs
from talon.engine.engine import Engine
from talon.gpucheck.head import frequent_tokens
from talon.gpucheck.head import train_head as trained
from talon.gpucheck.launch import serve_app
from talon.graphs.static import StaticForward
from talon.models import LoadedModel, ModelLoadError
from talon.models.eagle3 import Eagle3Head
from talon.models.memory import GIB
from talon.settings import PairKey
from talon.tree import DraftTree

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
REPO = Path(__file__).resolve().parents[1]  # the repository's root
CPU = torch.device("cpu")


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


def mtp_target(target: LoadedModel, steps: int = 120) -> LoadedModel:
    """A copy of ``target`` that declares one MTP layer, the layer trained on the target's greedy
    text of ``HEAD_PROMPTS`` (``talon.gpucheck.mtp``) and attached (the same weights, so the same text)."""
    from talon.drafters.mtp import attach_mtp
    from talon.gpucheck.mtp import random_mtp, train_mtp

    model = copy.deepcopy(target.model)
    model.config.num_mtp_layers = 1
    layers = random_mtp(model, seed=7)
    train_mtp(layers, model, [greedy_text(target, p, 64) for p in HEAD_PROMPTS], steps=steps)
    attach_mtp(model, layers)
    return dataclasses.replace(target, model=model, name=f"{target.name}-mtp")


PROMPTS = ["def add(a, b):", "The quick brown fox", "1, 2, 3, 4, 5,", "hello hello hello"]


def reference(engine: Engine, prompt_ids: list[int], n: int) -> list[int]:
    model = engine.target.model
    out = model.generate(
        torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=n, eos_token_id=256, pad_token_id=257
    )
    return out[0, len(prompt_ids) :].tolist()


def noisy_copy(target, seed: int, scale: float):
    """A draft that agrees with the target often but not always."""
    draft = dataclasses.replace(copy.deepcopy(target), name=f"{target.name}-noisy-{seed}")
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in draft.model.parameters():
            p.add_(torch.randn_like(p) * scale * p.std())
    return draft


class OracleTreeDrafter:
    """Random trees that contain the reference continuation with some probability: exercises
    acceptance at every depth and branch position, through the real verifier and commit."""

    def __init__(self, continuation: list[int], seed: int, size: int) -> None:
        self.continuation = continuation
        self.rng = random.Random(seed)
        self.size = size
        self.pos = 0

    def reset(self, prompt_ids: list[int], lazy_model: bool = False, features: object = None) -> None:
        self.pos = 0

    def draft(self, root_token: int) -> Draft:
        tree = random_tree(self.rng, self.size)
        tree.tokens[0] = root_token
        node = 0
        for token in self.continuation[self.pos : self.pos + self.rng.randrange(0, 6)]:
            if self.rng.random() < 0.15:
                token = (token + 1) % (VOCAB - 2)  # a wrong draft: acceptance must stop here
            child = tree.child_with_token(node, token)
            node = child if child is not None else tree.add(node, token, 0.9, "retrieval")
        return Draft(tree=tree)

    def commit(self, tree: DraftTree, accepted: list[int], new_tokens: list[int], match_len: int = 0,
               features: object = None) -> None:
        self.pos += len(new_tokens)

    def close(self) -> None:
        pass


def random_tree(rng: random.Random, n: int, vocab: int = VOCAB - 2) -> DraftTree:
    tree = DraftTree.with_root(rng.randrange(vocab))
    for _ in range(n):
        parent = rng.randrange(len(tree))
        token = rng.randrange(vocab)
        if tree.child_with_token(parent, token) is None:
            tree.add(parent, token, rng.random(), "model")
    return tree


START_TIMEOUT_S = 150


RUN_TIMEOUT_S = 90


# the app launched on tiny models: # output order of /generate and /replay (DecodeView.outputs() without the State).
SUMMARY, TEXT, SLIDER, CAPTION, TREE, GATES, MASK, TIMELINE, PER_STEP, BY_DEPTH, SOURCES, SPEED, DOWNLOAD = range(13)
NODE_PICK, INSPECTOR, ACCEPTANCE, COST, PLAIN_TEXT = range(13, 18)


def save_tiny_pair(root: Path) -> tuple[Path, Path]:
    """A tiny random target and draft (model + tokenizer) saved as local checkpoints."""
    dirs = []
    for name, seed in (("target", 0), ("draft", 1)):
        lm = tiny_loaded("llama", seed)
        lm.model.save_pretrained(root / name)
        lm.tokenizer.save_pretrained(root / name)
        dirs.append(root / name)
    return dirs[0], dirs[1]


APP_LOGS: dict[str, Path] = {}  # a served app's URL -> its log (what a failing browser test shows)


def app_log_tail(url: str, lines: int = 40) -> str:
    """The last ``lines`` of the log of the app served at ``url`` (a page's URL)."""
    log = next((path for served, path in APP_LOGS.items() if url.startswith(served)), None)
    if log is None or not log.is_file():
        return f"(no log of the app at {url})"
    return "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def serve(root: Path, env: dict[str, str]) -> Iterator[str]:
    """``python app.py`` on 127.0.0.1 with ``env`` over the test defaults; yields its URL;
    always stops it."""
    # TALON_PREPACK pinned off: "auto" decides from a 1.4 s timing that flips with the host's load (0.26x
    # to 2.71x at one row in these runs), and a tiny app's runs should not change with it
    defaults = {"TALON_CACHE": str(root / "cache"), "TALON_DEVICE": "cpu", "TALON_DTYPE": "float32",
                "TALON_PREPACK": "0"}
    with serve_app({**os.environ, **defaults, **env}, root / "app.log", START_TIMEOUT_S) as url:
        APP_LOGS[url] = root / "app.log"
        yield url


@contextlib.contextmanager
def launch_app(root: Path) -> Iterator[str]:
    """Run ``python app.py`` on tiny models saved in ``root``; yields its URL."""
    target, draft = save_tiny_pair(root)
    with serve(root, {"TALON_TARGET": str(target), "TALON_DRAFT": str(draft)}) as url:
        yield url


def finish(job, timeout: float = RUN_TIMEOUT_S) -> tuple[list, tuple]:
    """All streamed outputs and the final one, failing (not hanging) past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel()
            pytest.fail(f"the job did not finish in {timeout} s")
        time.sleep(0.05)
    return job.outputs(), job.result()


def plot_json(value: dict) -> dict:
    assert value["type"] == "plotly"
    return json.loads(value["plot"])




def front_matter() -> dict:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert match, "README.md must start with Space front matter"
    return yaml.safe_load(match.group(1))


class FakeGPU:
    """A 24 GiB card: loads take bytes, releases give them back; every event is recorded."""

    def __init__(self, sizes: dict[str, int], failing: set[str] = frozenset()) -> None:
        self.sizes, self.failing, self.used, self.events = sizes, set(failing), 0, []
        self.held: list[str] = []

    def build(self, k: PairKey) -> str:
        self.events.append(f"load {k.target}")
        if k.target in self.failing:
            raise ModelLoadError(f"cannot load {k.target}")
        if self.used + self.sizes[k.target] > 24 * GIB:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.used += self.sizes[k.target]
        self.held.append(k.target)
        return f"engine {k.target}"

    def release(self) -> None:
        self.events.append("release")
        self.used = 0
        self.held.clear()

    def free(self, device: str) -> int:
        return 24 * GIB - self.used

    def guard(self, need: int):
        def check(free: int | None) -> None:
            self.events.append(f"guard saw {free / GIB:.0f} GiB")
            if free is not None and free < need:
                raise ModelLoadError(f"needs {need / GIB:.0f} GiB")
        return check


def plant_visible_pads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted bug: every real node of a step sees its bucket's pads."""
    real = StaticForward.pack

    def pads_seen(self, bucket, ids, positions, visible, length, base):  # noqa: ANN001, ANN202
        packed = real(self, bucket, ids, positions, visible, length, base)
        b, t = bucket.size, ids.shape[0]
        window = packed[8 * (2 + 2 * b + b * bucket.earlier):].reshape(b, b)
        window[:t, t:] = 1
        return packed

    monkeypatch.setattr(StaticForward, "pack", pads_seen)


def synthetic(peak: float, vocab: int = 50):
    """A drafter whose top-1 has probability ``peak`` and the rest share what is left."""
    calls: list[list[int]] = []

    def expand(tree: DraftTree, nodes: list[int], k: int):
        calls.append(list(nodes))
        rest = (1 - peak) / (vocab - 1)
        out = []
        for n in nodes:
            base = (tree.tokens[n] * 7 + 1) % vocab
            probs = [peak] + [rest] * (k - 1)
            out.append([((base + i) % vocab, p) for i, p in enumerate(probs)])
        return out

    expand.calls = calls
    return expand


SPECBENCH = Path(__file__).resolve().parents[1] / "data" / "specbench"


def first_prompt(suite: str, index: int = 0) -> str:
    path = SPECBENCH / f"{suite}.jsonl"
    line = path.read_text(encoding="utf-8").splitlines()[index]
    return json.loads(line)["turns"][0][:1500]


def target_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    return list(cached_greedy(model, tuple(prompt_ids), n))


@functools.cache
def cached_greedy(model, prompt_ids: tuple[int, ...], n: int) -> tuple[int, ...]:
    """``generate(do_sample=False)`` once per model, prompt and length: the tests that decode one
    prompt on one model share its reference."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=n)
    return tuple(out[0, len(prompt_ids) :].tolist())


ATLAS_PROMPTS = ["def add(a, b): return a + b\ndef sub(a, b):", "one two three, one two three, one"]


# A host where trees pay a little: verification grows with the tree, drafting is cheap.
ATLAS_COSTS = {"verify": {1: 0.1, 4: 0.11, 16: 0.14, 64: 0.3}, "draft": {1: 0.004, 16: 0.006, 64: 0.012}}


def atlas_engine() -> Engine:
    """The atlas tests' engine: tiny target 11, a noisy copy of it drafting, on ``ATLAS_COSTS``."""
    target = tiny_loaded("llama", 11)
    costs = synthetic_costs(ATLAS_COSTS["verify"], ATLAS_COSTS["draft"])
    return Engine(target, noisy_copy(target, 12, 0.3), costs=costs)


RSS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def rss_kib() -> tuple[int, ...]:
    """This process's resident memory now, its peak, and the resident now split into anonymous
    memory and file-backed pages (a memory-mapped checkpoint's, which the kernel can drop and
    read again under pressure), KiB (``/proc/self/status``)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return tuple(int(fields[name].split()[0]) for name in RSS_FIELDS)
