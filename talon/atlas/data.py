"""The draft atlas: the draft model's proposals over one prompt's greedy text, recorded once.

With greedy decoding the output is the target's greedy text whatever the configuration, so a
tree rooted after ``p`` generated tokens accepts the longest root path that matches the text
from ``p``. Retrieval proposals depend only on the text. The draft model's children of a node
depend only on the token sequence up to that node. So an atlas holds the prompt, the target's
greedy output and the draft's top-k children (token, q) of every node of a generous superset
tree at every position, and any tree inside it can be built and scored with no model at all.

A node is named by a **canonical key** ``(p, path)``: ``p`` generated tokens are committed (the
root is the last of them) and ``path`` the drafted tokens below the root, with the longest
prefix that agrees with the greedy text moved into ``p``. So the root's children at ``p + 1``
and the children of the greedy child at ``p`` are one entry: positions share their work.

An atlas recorded with an EAGLE-3 head in the draft slot (``models["draft_kind"] == "head"``)
keys every node by its own ``(p, path)``: a head's node below the root reads the head's own
output where the root's child at ``p + 1`` reads the target's feature, so they differ.

This module owns the ``talon-atlas/1`` file format: ``Atlas.to_dict`` writes it and
``parse_atlas`` reads it back, validated field by field like a trace (never eval'd).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from talon.atlas.budget import checkpoint
from talon.core.contracts import Children
from talon.cost.model import CostModel
from talon.run_config import ConfigError, RetrievalConfig
from talon.trace import MAX_TREE_NODES, MAX_UPLOAD_BYTES, TraceFileError, is_number, read_json_upload

ATLAS_FORMAT = "talon-atlas/1"
MAX_ATLAS_ENTRIES = 400_000
MAX_ATLAS_TOKENS = 100_000
DRAFT_KINDS = ("draft", "head", "mtp")  # what drafted an atlas's model nodes: a draft model, an EAGLE-3 head, MTP
# why an int8 draft's atlas is approximate, in words (``Atlas.batch_dependent``)
QUANTIZED_DRAFT = ("the draft is int8 with one activation scale per forward (fbgemm's dynamic quantization), so "
                   "its q depends on which rows share the forward: the prompt's prefill in the atlas, one row at "
                   "a time in a run; record with --draft-quant none for an exact atlas")
FEATURE_DRAFT_KINDS = ("head", "mtp")  # those that read the target's features: no node shares a key

Key = tuple[int, tuple[int, ...]]  # (generated tokens committed, drafted path below the root)



def canonical_key(output: list[int], p: int, path: tuple[int, ...], shared: bool = True) -> Key:
    """Move the prefix of ``path`` that agrees with the greedy ``output`` from ``p`` into ``p``
    (``shared``: a node's children depend on its tokens only, as a draft model's do)."""
    if not shared:
        return p, path
    m = 0
    while m < len(path) and p + m < len(output) and path[m] == output[p + m]:
        m += 1
    return p + m, path[m:]


@dataclass(frozen=True)
class AtlasSpec:
    """How generous the recorded superset is, at every position of the text.

    n_nodes: model nodes per position, admitted best first by path confidence (the root's
        children, then anyone's, over the retrieval graft).
    root_k: children recorded for the root (K up to this replays exactly).
    top_k: children recorded for every other node (k up to this).
    max_depth: deepest node recorded (its children are not needed: depth up to this).
    beam: the static tree's beam: the ``beam`` most confident nodes of every layer expand, to
        ``max_depth``, however unlikely (static trees with k up to this replay exactly).
    retrieval: the retrieval proposal grafted first (as generous as the sweeps need: short
        matches, long continuations, many branches), whose nodes' children are recorded too.
    chunk: positions grown together (one batched draft forward per layer of the chunk).
    chain_depth: the draft's own greedy chain from every position, this deep, on or off the text,
        with ``chain_k`` children at each of its nodes (0: none beyond the superset). llama.cpp's
        ``draft-simple`` stops its chain on the top token's probability over the top 10: replaying
        ``--spec-draft-p-min`` needs ``chain_depth`` >= ``n_max`` and ``chain_k`` >= 10.
    """

    n_nodes: int = 64
    root_k: int = 8
    top_k: int = 4
    max_depth: int = 12
    beam: int = 2
    retrieval: RetrievalConfig = field(
        default_factory=lambda: RetrievalConfig(min_match=1, max_continuation=16, max_branches=4))
    chunk: int = 32
    chain_depth: int = 0
    chain_k: int = 10

    def __post_init__(self) -> None:
        for name, value, lo, hi in (("n_nodes", self.n_nodes, 1, MAX_TREE_NODES), ("root_k", self.root_k, 1, 64),
                                    ("top_k", self.top_k, 1, 16), ("max_depth", self.max_depth, 1, 64),
                                    ("beam", self.beam, 1, 16), ("chunk", self.chunk, 1, 4096),
                                    ("chain_depth", self.chain_depth, 0, 64), ("chain_k", self.chain_k, 1, 64)):
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ConfigError(f"atlas {name} must be an integer in [{lo}, {hi}], got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "AtlasSpec":
        data = dict(data)
        data["retrieval"] = RetrievalConfig(**data.get("retrieval", {}))
        return AtlasSpec(**data)


@dataclass
class Atlas:
    """One prompt, the target's greedy text and the draft's recorded proposals around it."""

    prompt_ids: list[int]
    output: list[int]  # the target's greedy tokens
    children: dict[Key, Children]
    spec: AtlasSpec = field(default_factory=AtlasSpec)
    prompt: str = ""
    stop_reason: str = ""  # why the recorded generation ended: max_new_tokens, eos, stop_string
    eos: list[int] = field(default_factory=list)
    token_texts: dict[int, str] = field(default_factory=dict)
    # target, draft, draft_kind, dtype, device, draft_vocab, draft_quant
    models: dict[str, Any] = field(default_factory=dict)
    costs: dict[str, Any] = field(default_factory=dict)  # talon-cost/1: the snapshot replays plan and time on
    record: dict[str, Any] = field(default_factory=dict)  # what recording cost and held
    suite: str = ""  # the benchmark suite the prompt came from, if any

    @property
    def draft_kind(self) -> str:
        """What drafted: "draft" (a draft model), "head" (an EAGLE-3 head) or "mtp" (the target's MTP layer)."""
        return str(self.models.get("draft_kind", "draft"))

    @property
    def reads_features(self) -> bool:
        """Its drafter read the target's features (a head, an MTP layer): every node has its own entry."""
        return self.draft_kind in FEATURE_DRAFT_KINDS

    @property
    def batch_dependent(self) -> bool:
        """Its draft's q depends on its batch (``QUANTIZED_DRAFT``): replayed trees approximate real ones."""
        return self.models.get("draft_quant") == "int8"

    def canonical(self, p: int, path: tuple[int, ...]) -> Key:
        """The node's key: the prefix of ``path`` that agrees with the greedy text moved into
        ``p``, except in a head's atlas, where every node has its own entry."""
        return canonical_key(self.output, p, path, shared=not self.reads_features)

    def off_text(self, p: int, path: tuple[int, ...]) -> bool:
        """Whether the node's path leaves the greedy text."""
        return bool(canonical_key(self.output, p, path)[1])

    def lookup(self, p: int, path: tuple[int, ...], k: int) -> Children | None:
        """The draft's top ``k`` children of the node ``path`` below the root after ``p``
        generated tokens, or None when the atlas did not record that many."""
        kids = self.children.get(self.canonical(p, path))
        if kids is None or len(kids) < k:
            return None
        return kids[:k]

    def cost_model(self) -> CostModel:
        return CostModel.from_dict(self.costs)

    def text(self, token: int) -> str:
        return self.token_texts.get(token, f"⟨{token}⟩")

    def detokenize(self, ids: list[int]) -> str:
        """The text of ``ids`` from the recorded token texts, end-of-sequence ids left out."""
        return "".join(self.text(t) for t in ids if t not in self.eos)

    def to_dict(self) -> dict[str, Any]:
        entries = [
            [p, list(path), [t for t, _ in kids], [float(f"{q:.9g}") for _, q in kids]]
            for (p, path), kids in sorted(self.children.items())
        ]
        return {
            "format": ATLAS_FORMAT,
            "prompt": self.prompt,
            "suite": self.suite,
            "prompt_ids": self.prompt_ids,
            "output": self.output,
            "stop_reason": self.stop_reason,
            "eos": self.eos,
            "spec": self.spec.to_dict(),
            "models": self.models,
            "costs": self.costs,
            "record": self.record,
            "token_texts": {str(t): s for t, s in sorted(self.token_texts.items())},
            "children": entries,
        }


def _ints(value: Any, name: str, limit: int = MAX_ATLAS_TOKENS) -> list[int]:
    if not isinstance(value, list) or len(value) > limit or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise TraceFileError(f"'{name}' must be a list of at most {limit} non-negative token ids")
    return list(value)


def _entry(row: Any, i: int, output_len: int) -> tuple[Key, Children]:
    where = f"children[{i}]"
    checkpoint()
    if not isinstance(row, list) or len(row) != 4:
        raise TraceFileError(f"{where} must be [p, path, tokens, q]")
    p, path, tokens, q = row
    if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p <= output_len:
        raise TraceFileError(f"{where}: p must be an integer in [0, {output_len}]")
    path = _ints(path, f"{where} path", 64)
    tokens = _ints(tokens, f"{where} tokens", 64)
    if not isinstance(q, list) or len(q) != len(tokens) or not all(is_number(v) and 0 <= v <= 1 for v in q):
        raise TraceFileError(f"{where}: q must be one probability in [0, 1] per token")
    # q was a float32 softmax: read it back as that float32, exactly as the draft produced it
    return (p, tuple(path)), [(t, float(np.float32(v))) for t, v in zip(tokens, q)]


def parse_atlas(data: Any) -> Atlas:
    """An Atlas from a parsed JSON object; TraceFileError says what is wrong."""
    if not isinstance(data, dict) or data.get("format") != ATLAS_FORMAT:
        raise TraceFileError(f'not a draft atlas: expected a JSON object with "format": "{ATLAS_FORMAT}"')
    prompt_ids = _ints(data.get("prompt_ids"), "prompt_ids")
    output = _ints(data.get("output"), "output")
    if not prompt_ids or not output:
        raise TraceFileError("an atlas needs a non-empty prompt and output")
    rows = data.get("children")
    if not isinstance(rows, list) or not rows or len(rows) > MAX_ATLAS_ENTRIES:
        raise TraceFileError(f"'children' must be a non-empty list of at most {MAX_ATLAS_ENTRIES} entries")
    children = dict(_entry(row, i, len(output)) for i, row in enumerate(rows))
    texts = data.get("token_texts", {})
    if not isinstance(texts, dict) or not all(isinstance(v, str) for v in texts.values()):
        raise TraceFileError("'token_texts' must map token ids to strings")
    try:
        token_texts = {int(k): v for k, v in texts.items()}
        spec = AtlasSpec.from_dict(data.get("spec") or {})
        costs = data.get("costs") or {}
        if costs:
            CostModel.from_dict(costs)
    except (ValueError, TypeError, KeyError) as error:
        raise TraceFileError(f"the atlas's spec, costs or token texts are malformed: {error}") from None
    meta = {k: data.get(k) for k in ("models", "record")}
    if not all(isinstance(v, dict) or v is None for v in meta.values()):
        raise TraceFileError("'models' and 'record' must be JSON objects")
    if (meta["models"] or {}).get("draft_kind", "draft") not in DRAFT_KINDS:
        raise TraceFileError("'models.draft_kind' must be \"draft\" (a draft model), \"head\" (an EAGLE-3 head) or "
                             "\"mtp\" (the target's MTP layer)")
    for name in ("prompt", "suite", "stop_reason"):
        if not isinstance(data.get(name, ""), str):
            raise TraceFileError(f"'{name}' must be a string")
    return Atlas(
        prompt_ids=prompt_ids, output=output, children=children, spec=spec,
        prompt=data.get("prompt", ""), stop_reason=data.get("stop_reason", ""),
        eos=_ints(data.get("eos", []), "eos", 64), token_texts=token_texts,
        models=meta["models"] or {}, costs=costs, record=meta["record"] or {}, suite=data.get("suite", ""),
    )


def load_atlases(paths: list[Path]) -> list[Atlas]:
    """Atlas files (``.json``, or gzipped ``.json.gz``), folders expanded to theirs (TraceFileError
    names a bad file)."""
    files = [f for p in paths for f in (sorted([*p.glob("*.json"), *p.glob("*.json.gz")]) if p.is_dir() else [p])]
    if not files:
        raise TraceFileError("no atlas files found")
    atlases = []
    for f in files:
        try:
            atlases.append(parse_atlas(_read_gzipped(f) if f.suffix == ".gz" else read_json_upload(f)))
        except TraceFileError as error:
            raise TraceFileError(f"{f}: {error}") from None
    return atlases


def _read_gzipped(path: Path) -> Any:
    """A gzipped JSON file, decompressed no further than the upload limit."""
    try:
        with gzip.open(path, "rb") as fh:
            raw = fh.read(MAX_UPLOAD_BYTES + 1)
    except (OSError, EOFError) as error:
        raise TraceFileError(f"not a readable gzip file ({error})") from None
    if len(raw) > MAX_UPLOAD_BYTES:
        raise TraceFileError(f"it decompresses past the {MAX_UPLOAD_BYTES // 2**20} MB limit")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TraceFileError(f"the file is not valid JSON text ({error})") from None
