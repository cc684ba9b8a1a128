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
The superset's growth is ``talon.atlas.superset``'s; ``PairRecorder`` drafts it with a module on the
target's features (an EAGLE-3 head in the draft slot, the target's MTP layer).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence

import torch
from transformers import DynamicCache

from talon.atlas.data import QUANTIZED_DRAFT, Atlas, AtlasSpec, Key
from talon.atlas.superset import MAX_ROWS, Progress, Superset, SupersetRecorder
from talon.core.forward import additive_mask, forward_features
from talon.drafters.model import ModelSource
from talon.drafters.mtp import mtp_layers_of
from talon.engine.engine import Engine
from talon.engine.prompt import eos_ids
from talon.models.eagle3 import is_head
from talon.models.mtp import is_mtp
from talon.models.prepack import is_prepacked
from talon.run_config import ConfigError, RunConfig, SamplingConfig

logger = logging.getLogger(__name__)

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
    if mtp and cfg.mtp_layers != "reuse":
        raise ConfigError("an atlas records MTP layer 0 drafting every depth (--mtp-layers reuse); the chained "
                          "layers draft only in runs (generate, bench)")
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
    run, made = engine.run(prompt, run_cfg), 0
    for step in run:  # a word every step: a slow forward is seen moving, never a silent minute
        made = min(made + len(step.accepted), cfg.max_new_tokens)  # a last step's bonus may pass the limit
        report(0.25 * made / max(1, cfg.max_new_tokens),
               f"running the target for its greedy text: {made} of at most {cfg.max_new_tokens} tokens")
    summary = run.summary
    assert summary is not None
    run_s = time.perf_counter() - t0
    prompt_ids, output = summary.prompt_token_ids, summary.token_ids
    report(0.25, f"{len(output)} tokens in {run_s:.1f} s; the pair's cost curves (timed once per pair, then cached)")
    costs = engine.cost_snapshot(cfg.draft_vocab, drafting if mtp else None)  # what replays plan and time on
    report(0.25, f"{len(output)} tokens in {run_s:.1f} s; drafting the atlas")
    t1 = time.perf_counter()
    if mtp or head:
        recorder: SupersetRecorder = PairRecorder(engine.target.model, drafting, prompt_ids, output, spec)
    else:
        target_vocab = engine.target.model.get_input_embeddings().weight.shape[0]
        source = ModelSource(engine.draft.model, cfg.draft_vocab, target_vocab)
        recorder = SupersetRecorder(source, prompt_ids, output, spec)
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
                "run_accept_lens": [len(s.accepted) for s in run.steps],
                "entries": len(recorder.children), "rows": recorder.rows, "forwards": recorder.forwards},
        suite=suite,
    )
    if atlas.batch_dependent:
        logger.warning("this atlas is approximate: %s", QUANTIZED_DRAFT)
    report(1.0, f"atlas recorded: {len(atlas.children)} nodes in {atlas_s:.1f} s (the run took {run_s:.1f} s)")
    return atlas


class PairRecorder(SupersetRecorder):
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

    def _grow(self, p: int, graft: list[tuple[tuple[int, ...], float]]) -> Superset:
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
