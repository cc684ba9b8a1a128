"""Recording a draft atlas: one real run for the target's greedy text, then the draft model's
children of every node of a generous superset tree at every position, batched.

The superset at position ``p`` (``p`` generated tokens committed) is the retrieval graft (as
generous as ``AtlasSpec.retrieval``) plus ``n_nodes`` model nodes admitted best first by path
confidence: the root offers its top ``root_k`` children, every other node its top ``top_k``,
down to ``max_depth``. Best-first needs a node's children before its grandchildren compete, so
the positions of a chunk grow together in rounds: each round admits what the known children
allow and asks one batched draft forward for the children of every admitted node not yet
known (keys shared between positions are asked once). The children of every node on the greedy
text come from a single forward over prompt + output.

The draft forward reads the cache of prompt + output (every position's committed context is a
prefix of it) plus the chunk's own node entries, through a 4D mask: a node sees the context up
to its root, its ancestors and itself, at position root + depth, exactly as in a decoding step.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from talon.atlas.data import Atlas, AtlasSpec, Key, canonical_key
from talon.atlas.replaying import replay
from talon.core.contracts import Children
from talon.core.forward import additive_mask, forward_features, forward_hidden
from talon.core.kv import gather_entries
from talon.drafters.model import ModelSource
from talon.drafters.mtp import mtp_layers_of
from talon.drafters.retrieval import Retriever
from talon.engine.engine import Engine, generate
from talon.engine.prompt import eos_ids
from talon.models.eagle3 import is_head
from talon.models.head import lm_logits
from talon.models.mtp import is_mtp
from talon.models.prepack import is_prepacked
from talon.run_config import ConfigError, RunConfig, SamplingConfig

logger = logging.getLogger(__name__)

Progress = Callable[[float, str], None]  # (fraction done, what is happening)
MAX_ROWS = 192  # tree nodes per batched draft forward


@dataclass
class _Superset:
    """One position's superset tree as far as the known children allow."""

    p: int
    admitted: list[tuple[tuple[int, ...], float]]  # (path, path confidence), model and retrieval nodes
    wanted: list[Key]  # canonical keys of admitted nodes whose children are not known yet


def record_atlas(
    engine: Engine,
    prompt: str | list[int],
    cfg: RunConfig,
    spec: AtlasSpec | None = None,
    progress: Progress | None = None,
    suite: str = "",
    cover: Sequence[RunConfig] = (),
) -> Atlas:
    """Record the atlas of ``prompt``: a greedy run with ``cfg`` (cost-aware planning off, so it
    is the reference run too), then the draft's proposals around its text; then, for every
    configuration of ``cover``, the nodes its replay asks for that the superset lacks, until each
    of them replays exactly (the lesson atlases cover the trees their lessons replay)."""
    spec = spec or AtlasSpec()
    mtp = cfg.needs_mtp
    if engine.draft is None and not mtp:
        raise ConfigError("recording an atlas needs the draft model: load a draft, or replay retrieval-only runs")
    report = progress or (lambda fraction, what: None)
    head = not mtp and is_head(engine.draft.model)
    kind = "mtp" if mtp else "head" if head else "draft"
    drafting = mtp_layers_of(engine.target.model, engine.target.name) if mtp else engine.draft.model
    if head and cfg.kind.model == "draft":  # the draft slot holds a head: it drafts the reference run
        cfg = cfg.replace(drafter="eagle3-hybrid" if cfg.uses_retrieval else "eagle3")
    run_cfg = cfg.replace(
        tree=dataclasses.replace(cfg.tree, cost_aware=False),
        sampling=SamplingConfig(), async_draft=False, cost_model="fixed",
    )
    report(0.0, "running the target for its greedy text")
    t0 = time.perf_counter()
    summary, steps = generate(engine, prompt, run_cfg)
    run_s = time.perf_counter() - t0
    prompt_ids, output = summary.prompt_token_ids, summary.token_ids
    report(0.25, f"{len(output)} tokens in {run_s:.1f} s; drafting the atlas")
    costs = engine.cost_snapshot(cfg.draft_vocab, drafting if mtp else None)  # what replays plan and time on
    t1 = time.perf_counter()
    if mtp or head:
        recorder: _Recorder = _PairRecorder(engine.target.model, drafting, prompt_ids, output, spec)
    else:
        target_vocab = engine.target.model.get_input_embeddings().weight.shape[0]
        recorder = _Recorder(ModelSource(engine.draft.model, cfg.draft_vocab, target_vocab), prompt_ids, output, spec)
    recorder.record(lambda f, what: report(0.25 + 0.75 * f, what))
    if cover:
        recorder.cover(Atlas(prompt_ids=prompt_ids, output=output, children=recorder.children, spec=spec,
                             eos=sorted(eos_ids(engine.target)),
                             models={"draft_vocab": cfg.draft_vocab, "draft_kind": kind},
                             costs=costs.to_dict()), cover)
    atlas_s = time.perf_counter() - t1
    tokens = set(prompt_ids) | set(output) | {t for kids in recorder.children.values() for t, _ in kids}
    atlas = Atlas(
        prompt_ids=prompt_ids,
        output=output,
        children=recorder.children,
        spec=spec,
        prompt=summary.prompt,
        stop_reason=summary.stop_reason,
        eos=sorted(eos_ids(engine.target)),
        token_texts={t: engine.token_text(t) for t in sorted(tokens)},
        models={"target": engine.target.name, "draft_kind": kind,
                "draft": getattr(drafting, "talon_name", "mtp") if mtp else engine.draft.name,
                "dtype": str(engine.target.dtype).removeprefix("torch."),
                "draft_dtype": str(drafting.dtype).removeprefix("torch."),
                "device": str(engine.target.device), "draft_vocab": cfg.draft_vocab,
                # the draft's quantization (a prepacked draft is its float32 weights, laid out for oneDNN)
                "draft_quant": ("none" if is_prepacked(drafting) else getattr(drafting, "talon_quant", "none")),
                "chat_template": cfg.chat_template},
        costs=costs.to_dict(),
        record={"run_s": round(run_s, 3), "atlas_s": round(atlas_s, 3), "ratio": round((run_s + atlas_s) / run_s, 3),
                "run_config": run_cfg.to_dict(), "run_mat": summary.mean_accepted_tokens,
                "run_accept_lens": [len(s.accepted) for s in steps],
                "entries": len(recorder.children), "rows": recorder.rows, "forwards": recorder.forwards},
        suite=suite,
    )
    report(1.0, f"atlas recorded: {len(atlas.children)} nodes in {atlas_s:.1f} s (the run took {run_s:.1f} s)")
    return atlas


class _Recorder:
    """Grows every position's superset and asks the draft model for missing children."""

    def __init__(self, source: ModelSource | None, prompt_ids: list[int], output: list[int], spec: AtlasSpec) -> None:
        self.source = source
        self.prompt_ids, self.output, self.spec = prompt_ids, output, spec
        self.seq = prompt_ids + output  # (S,) the committed context of every position is a prefix
        self.prefix = len(self.seq)  # the cache entries of the committed text, kept between chunks
        self.root_index = len(prompt_ids) - 1  # seq index of the root at p = 0
        self.children: dict[Key, Children] = {}
        self.cache = DynamicCache(config=source.model.config) if source is not None else DynamicCache()
        self.slots: dict[Key, int] = {}  # keys fed into the cache in this chunk -> cache index
        self.wide: set[Key] = set()  # nodes of the draft's own chains (``AtlasSpec.chain_depth``)
        self.rows = 0
        self.forwards = 0

    # --- keys ------------------------------------------------------------------------------

    def canonical(self, p: int, path: tuple[int, ...]) -> Key:
        return canonical_key(self.output, p, path)

    def _k(self, key: Key) -> int:
        """Children kept for ``key``: a root's K, another node's k, a chain node's ``chain_k``."""
        if self.spec.chain_depth and (not key[1] or key in self.wide):
            return max(self.spec.root_k, self.spec.top_k, self.spec.chain_k)
        return max(self.spec.root_k, self.spec.top_k) if not key[1] else self.spec.top_k

    def _widest(self) -> int:  # children drafted per node
        return max(self.spec.root_k, self.spec.top_k, self.spec.chain_k if self.spec.chain_depth else 0)

    # --- the draft model -------------------------------------------------------------------

    def _topk(self, hidden: torch.Tensor, keys: list[Key]) -> None:
        """Record the top children of each of ``keys`` from its last hidden state ``(T, H)``."""
        probs = torch.softmax(lm_logits(self.source.model, hidden, self.source.vocab_size), dim=-1)  # (T, V)
        q, tokens = probs.topk(self._widest(), dim=-1)  # (T, k)
        for key, toks, qs in zip(keys, tokens.tolist(), q.tolist()):
            self.children[key] = list(zip(toks, qs))[: self._k(key)]

    @torch.inference_mode()
    def _prefill(self) -> None:
        """One causal forward over prompt + output: the children of every greedy-text node."""
        ids = self.source.embeddable_ids(self.seq)
        hidden = forward_hidden(self.source.model, self.cache, ids, torch.arange(len(ids)), None)  # (S, H)
        self.forwards += 1
        first = self.root_index
        for start in range(first, len(self.seq), 256):
            stop = min(start + 256, len(self.seq))
            self._topk(hidden[start:stop], [(p - first, ()) for p in range(start, stop)])

    @torch.inference_mode()
    def _feed(self, keys: list[Key]) -> None:
        """Children of ``keys`` (off-text nodes), with their ancestors fed first where this chunk's
        cache lacks them; batched, each node seeing its root's context, its ancestors, itself."""
        order: list[Key] = []
        seen = set(self.slots)
        for p, path in keys:
            for i in range(1, len(path) + 1):
                key = (p, path[:i])
                if key not in seen:
                    seen.add(key)
                    order.append(key)
        order.sort(key=lambda key: len(key[1]))  # ancestors first
        for batch in self._batches(order):
            out = self._forward(batch)
            fresh = [(i, key) for i, key in enumerate(batch) if key not in self.children]
            if fresh:
                self._topk(out[[i for i, _ in fresh]], [key for _, key in fresh])

    def _batches(self, order: list[Key]) -> Iterator[list[Key]]:
        """The fed nodes, ancestors first, at most ``MAX_ROWS`` a forward (a node may share one
        with its parent: the mask orders them)."""
        for start in range(0, len(order), MAX_ROWS):
            yield order[start:start + MAX_ROWS]

    def _forward(self, batch: list[Key]) -> torch.Tensor:
        old = self.cache.get_seq_length()
        visible = torch.zeros(len(batch), old + len(batch), dtype=torch.bool)  # (T, S + T)
        positions = []
        for row, (p, path) in enumerate(batch):
            root = self.root_index + p
            visible[row, : root + 1] = True
            for i in range(1, len(path)):
                visible[row, self.slots[(p, path[:i])]] = True
            visible[row, old + row] = True
            self.slots[(p, path)] = old + row
            positions.append(root + len(path))
        ids = self.source.embeddable_ids([path[-1] for _, path in batch])
        self.forwards += 1
        self.rows += len(batch)
        return forward_hidden(self.source.model, self.cache, ids, torch.tensor(positions), visible)

    def forget(self) -> None:
        """The chunk's node entries were dropped: forget what they held (a head's outputs)."""

    # --- the superset ----------------------------------------------------------------------

    def _grow(self, p: int, graft: list[tuple[tuple[int, ...], float]]) -> _Superset:
        """Position ``p``'s superset as far as the known children allow: the graft, then model
        nodes best first, then the static beam; admitted nodes whose children are unknown are
        wanted."""
        spec = self.spec
        admitted: list[tuple[tuple[int, ...], float]] = []
        wanted: list[Key] = []
        in_tree = {(): 1.0}
        in_tree.update(graft)
        heap: list[tuple[float, int, tuple[int, ...]]] = []
        tick = 0

        def offer(path: tuple[int, ...], conf: float) -> None:
            nonlocal tick
            if len(path) >= spec.max_depth:
                return
            key = self.canonical(p, path)
            kids = self.children.get(key)
            if kids is None:
                wanted.append(key)
                return
            for token, q in kids[: spec.root_k if not path else spec.top_k]:
                child = path + (token,)
                if child not in in_tree:
                    heapq.heappush(heap, (-conf * q, tick, child))
                    tick += 1

        offer((), 1.0)
        for path, conf in graft:
            admitted.append((path, conf))
            offer(path, conf)
        model_nodes = 0
        while heap and model_nodes < spec.n_nodes:
            neg_conf, _, path = heapq.heappop(heap)
            if path in in_tree:
                continue
            in_tree[path] = -neg_conf
            admitted.append((path, -neg_conf))
            model_nodes += 1
            offer(path, -neg_conf)
        self._beam(p, in_tree, admitted, wanted)
        return _Superset(p, admitted, list(dict.fromkeys(wanted)))

    def _beam(self, p: int, in_tree: dict[tuple[int, ...], float], admitted: list, wanted: list[Key]) -> None:
        """Add the static tree's beam: the ``beam`` most confident nodes of every layer expand,
        to ``max_depth``, however low their confidence (the static baseline drafts them)."""
        spec = self.spec
        layer = [((), 1.0)]
        for depth in range(spec.max_depth):
            nxt = []
            for path, conf in layer:
                kids = self.children.get(self.canonical(p, path))
                if kids is None:
                    wanted.append(self.canonical(p, path))
                    continue
                for token, q in kids[: spec.root_k if not path else spec.beam]:
                    nxt.append((path + (token,), conf * q))
            layer = sorted(nxt, key=lambda node: -node[1])
            for path, conf in layer:
                if path not in in_tree:
                    in_tree[path] = conf
                    admitted.append((path, conf))
            layer = layer[: spec.beam] if depth + 1 < spec.max_depth else []

    def _grafts(self) -> list[list[tuple[tuple[int, ...], float]]]:
        """The generous retrieval graft at every position: (path, path confidence) per node."""
        retriever, grafts = Retriever(self.spec.retrieval), []
        retriever.reset(self.prompt_ids)
        for p in range(len(self.output)):
            proposal = retriever.propose(self.spec.n_nodes)
            confs: list[float] = []
            nodes = []
            for i, (parent, q) in enumerate(zip(proposal.parents, proposal.q)):
                confs.append((1.0 if parent < 0 else confs[parent]) * q)
                nodes.append((tuple(proposal.path(i)), confs[-1]))
            grafts.append(nodes)
            retriever.extend(self.output[p:p + 1])
        return grafts

    def _chains(self, chunk: range) -> None:
        """The draft's own greedy chain from every position of ``chunk``, ``chain_depth`` deep, ``chain_k``
        children a node: a layer of the chunk's chains a forward (a narrower node is drafted again)."""
        while depth := self.spec.chain_depth:
            wanted: list[Key] = []
            for p in chunk:
                path: tuple[int, ...] = ()
                for _ in range(depth):
                    key = self.canonical(p, path)
                    kids = self.children.get(key)
                    if kids is None or len(kids) < self._k(key) or (path and key not in self.wide):
                        wanted.append(key)
                        break
                    path += (kids[0][0],)
            if not (wanted := list(dict.fromkeys(wanted))):
                return
            for key in wanted:
                self.wide.add(key)
                if key in self.children and len(self.children[key]) < self._k(key):
                    del self.children[key]  # drafted again, wider: fed anew
                    self.slots.pop(key, None)
            self._feed(wanted)

    def cover(self, atlas: Atlas, configs: Sequence[RunConfig], rounds: int = 12) -> None:
        """Feed the nodes the replays of ``configs`` ask for and ``atlas`` (sharing this recorder's
        children) lacks, round after round, until none is missing (each round reaches a layer deeper)."""
        for _ in range(rounds):
            missing: set[Key] = set()
            for cfg in configs:
                missing |= replay(atlas, cfg).coverage.missing
            missing -= self.children.keys()
            if not missing:
                return
            self._feed(sorted(missing, key=lambda key: (len(key[1]), key)))
            gather_entries(self.cache, list(range(self.prefix)))  # drop the fed node entries again
            self.slots = {}
            self.forget()
        logger.warning("the atlas still misses nodes after %d cover rounds", rounds)

    def record(self, progress: Progress) -> None:
        self._prefill()
        grafts = self._grafts()
        prefix = self.prefix
        positions = len(self.output)
        for start in range(0, positions, self.spec.chunk):
            chunk = range(start, min(start + self.spec.chunk, positions))
            while True:
                wanted = list(dict.fromkeys(
                    key for p in chunk for key in self._grow(p, grafts[p]).wanted if key not in self.children))
                if not wanted:
                    break
                self._feed(wanted)
            self._chains(chunk)
            gather_entries(self.cache, list(range(prefix)))  # drop the chunk's node entries
            self.slots = {}
            self.forget()
            done = chunk.stop / positions
            progress(done, f"positions {chunk.stop} of {positions}: {len(self.children)} nodes, "
                           f"{self.rows} drafted in {self.forwards} forwards")


class _PairRecorder(_Recorder):
    """The recorder for a module drafting on the target's features (``talon.drafters.pairs``: an
    EAGLE-3 head in the draft slot, the target's MTP layer): its cache holds the committed (feature
    j, token j + 1) pairs of the text, from the target's one forward over it, at position
    j + ``position_lead``; a node below a root feeds its parent's output with its own token. A
    node's children depend on where its root is, so every node is keyed by its own ``(p, path)``,
    and each layer of nodes is one forward (a node needs its parent's output)."""

    def __init__(self, target: torch.nn.Module, module: torch.nn.Module, prompt_ids: list[int], output: list[int],
                 spec: AtlasSpec) -> None:
        super().__init__(None, prompt_ids, output, spec)
        mtp = is_mtp(module)
        if len(prompt_ids) < 2:
            raise ConfigError(f"{'an MTP layer' if mtp else 'an EAGLE-3 head'} needs a prompt of at least two tokens")
        self.target = target
        self.head = module
        self.layers = (module.feature_layers if mtp
                       else module.cfg.layers_for(int(target.config.num_hidden_layers)))
        self.lead = 1 if mtp else 0  # pair j sits at position j + lead (MtpSource, HeadSource)
        self.window = module.window if mtp else 0
        self.prefix = len(self.seq) - 1  # pair j = (feature j, token j + 1)
        self.outs: dict[Key, torch.Tensor] = {}  # fed nodes' outputs (h,), this chunk only
        self.root_outs = torch.empty(0)

    def _seen(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """(T, width) bool: the committed pairs rows at positions ``rows`` see (a sliding window)."""
        seen = torch.ones(rows.shape[0], width, dtype=torch.bool)
        if self.window:
            seen &= rows[:, None] - (torch.arange(width) + self.lead)[None, :] < self.window
        return seen

    def canonical(self, p: int, path: tuple[int, ...]) -> Key:
        return p, path

    def forget(self) -> None:
        self.outs = {}

    def _grow(self, p: int, graft: list[tuple[tuple[int, ...], float]]) -> _Superset:
        """The superset, and the text's own chain from ``p`` (a node on the text is not the root one
        position later here): a chain drafter that follows the text is always answered."""
        superset = super()._grow(p, graft)
        text = tuple(self.output[p:p + self.spec.max_depth - 1])
        superset.wanted += [(p, text[:i]) for i in range(1, len(text) + 1) if (p, text[:i]) not in self.children]
        return superset

    def _topk(self, logits: torch.Tensor, keys: list[Key]) -> None:  # the head's forward returns logits
        q, ids = torch.softmax(logits, dim=-1).topk(self._widest(), dim=-1)  # (T, k)
        tokens = ids + self.head.d2t[ids] if is_head(self.head) else ids  # a head's draft id -> target id
        for key, toks, qs in zip(keys, tokens.tolist(), q.tolist()):
            self.children[key] = list(zip(toks, qs))[: self._k(key)]

    @torch.inference_mode()
    def _prefill(self) -> None:
        """The target's features over the text, then the head over every pair: the roots' children."""
        ids = torch.tensor(self.seq)
        _, features = forward_features(self.target, DynamicCache(config=self.target.config), ids,
                                       torch.arange(len(ids)), None, self.layers)  # (S, F)
        n = self.prefix
        positions = torch.arange(n) + self.lead
        causal = torch.ones(n, n, dtype=torch.bool).tril() & self._seen(positions, n)
        out, logits = self.head(features[:n], ids[1:], positions, self.cache,
                                additive_mask(causal, self.head.dtype))  # (S - 1, h), (S - 1, V)
        self.forwards += 2
        self.root_outs = out
        first = self.root_index - 1  # the pair of the root at p = 0
        for start in range(first, n, 256):
            stop = min(start + 256, n)
            self._topk(logits[start:stop], [(p - first, ()) for p in range(start, stop)])

    def _batches(self, order: list[Key]) -> Iterator[list[Key]]:
        """One layer of nodes a forward (a node needs its parent's output), at most ``MAX_ROWS``."""
        for depth in sorted({len(path) for _, path in order}):
            layer = [key for key in order if len(key[1]) == depth]
            for start in range(0, len(layer), MAX_ROWS):
                yield layer[start:start + MAX_ROWS]

    def _forward(self, batch: list[Key]) -> torch.Tensor:
        old = self.cache.get_seq_length()
        visible = torch.zeros(len(batch), old + len(batch), dtype=torch.bool)  # (T, S + T)
        g, positions = [], []
        for row, (p, path) in enumerate(batch):
            root_pair = self.root_index + p - 1
            where = torch.tensor([root_pair + len(path) + self.lead])
            visible[row, : root_pair + 1] = self._seen(where, root_pair + 1)[0]
            for i in range(1, len(path)):
                visible[row, self.slots[(p, path[:i])]] = True
            visible[row, old + row] = True
            self.slots[(p, path)] = old + row
            g.append(self.root_outs[root_pair] if len(path) == 1 else self.outs[(p, path[:-1])])
            positions.append(root_pair + len(path) + self.lead)
        out, logits = self.head(torch.stack(g), torch.tensor([path[-1] for _, path in batch]),
                                torch.tensor(positions), self.cache, additive_mask(visible, self.head.dtype))
        for row, key in enumerate(batch):
            self.outs[key] = out[row]
        self.forwards += 1
        self.rows += len(batch)
        return logits
