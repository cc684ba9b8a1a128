"""How an engine's models run: the forward (``dynamic``, ``static``, ``graphs`` or ``compiled``; see
``talon.graphs.static``) and, on the static forwards, the pools of preallocated forwards it keeps, one
per model that verifies or drafts: the target's, the draft model's, the async forks' (eager
under graphs: no graph is captured or replayed on the drafter thread, docs/gpu.md), and any
other drafting model's (a view of the target, ``talon.drafters.layer_skip``), made at its first
run. ``Engine`` asks it for a run's verifier and model sources."""

from __future__ import annotations

import threading

from transformers import PreTrainedModel

from talon.core.verify import TargetVerifier
from talon.drafters.model import ModelSource
from talon.drafters.pairs import pair_timer
from talon.drafters.static_draft import StaticModelSource
from talon.graphs.pool import StaticPool, StaticTimer, StaticVerifier, static_timer
from talon.graphs.static import COMPILED_UPTO, resolve_forward, spans_devices
from talon.models import LoadedModel
from talon.models.eagle3 import is_head
from talon.models.mtp import is_mtp, mtp_layer_count, mtp_refusal
from talon.run_config import ConfigError, RunConfig


class Forwards:
    def __init__(self, forward: str, target: LoadedModel, draft: LoadedModel | None, chain: bool = False) -> None:
        """``forward``: as asked (``auto`` resolves to graphs on one CUDA device, dynamic elsewhere).
        ``chain``: model sources grow TALON's adaptive trees on the device (``talon.graphs.chain``);
        a static forward only."""
        split = spans_devices(target.model) or (draft is not None and spans_devices(draft.model))
        self.forward = resolve_forward(forward, target.device, split)
        if chain and self.forward == "dynamic":
            raise ConfigError("chained drafting grows the tree in a static forward's buffers: "
                              "it needs the static, graphs or compiled forward, not dynamic")
        self.chain = chain
        self.target = target
        self.graphs = self.forward in ("graphs", "compiled")
        self.compile_upto = COMPILED_UPTO if self.forward == "compiled" else 0  # the drafting models' small buckets
        self._lock = threading.Lock()
        self._target: StaticPool | None = None
        self._pools: dict[int, tuple[StaticPool, StaticPool | None]] = {}  # id(model) -> (pool, async forks' pool)
        if self.forward != "dynamic":
            head = draft is not None and is_head(draft.model)  # then every target forward keeps its features
            layers = draft.model.cfg.layers_for(int(target.model.config.num_hidden_layers)) if head else ()
            if not head and mtp_layer_count(target.model.config) and mtp_refusal(target.model.config, None) is None:
                layers = (int(target.model.config.get_text_config().num_hidden_layers),)  # its MTP layers' input
            self._target = StaticPool(target.model, self.graphs, feature_layers=layers)
            if draft is not None and not head:  # a head runs its own forward
                self.pools_of(draft.model)

    def pools_of(self, model: PreTrainedModel) -> tuple[StaticPool, StaticPool | None]:
        """The drafting ``model``'s pool and its async forks' (made at first use)."""
        with self._lock:
            if id(model) not in self._pools:
                self._pools[id(model)] = (StaticPool(model, self.graphs, compile_upto=self.compile_upto, drafts=True),
                                         StaticPool(model, drafts=True) if self.graphs else None)
            return self._pools[id(model)]

    def precompile(self) -> float:
        """The compiled forward: compile the drafting models' buckets now (``StaticPool.precompile``),
        at start-up rather than in a user's first runs; seconds taken (0 on other forwards)."""
        with self._lock:
            pools = [pool for pool, _ in self._pools.values()]
        return sum(pool.precompile() for pool in pools)

    def roles(self, draft: PreTrainedModel | None) -> dict[str, StaticPool]:
        """The pools by role (none on the dynamic forward): target, draft, fork."""
        if self._target is None:
            return {}
        pools = {"target": self._target}
        if draft is not None and not is_head(draft):
            pools["draft"], fork = self.pools_of(draft)
            pools.update({"fork": fork} if fork is not None else {})
        return pools

    def timers(self, model: PreTrainedModel | None) -> tuple[StaticTimer | None, StaticTimer | None]:
        """The cost probe's timers on this forward: the target's, the drafting model's (a head's or
        MTP layers' own forward, whatever the target's)."""
        target = static_timer(self._target) if self._target is not None else None
        if model is not None and (is_head(model) or is_mtp(model)):
            return target, pair_timer
        if self._target is None:
            return None, None
        return target, static_timer(self.pools_of(model)[0]) if model is not None else None

    def verifier(self, cfg: RunConfig, prompt_len: int, feature_layers: tuple[int, ...] = ()) -> TargetVerifier:
        """The run's verifier; ``feature_layers``: it also returns the target's features there."""
        if self._target is None:
            return TargetVerifier(self.target.model, cfg.sampling, feature_layers)
        if feature_layers and feature_layers != self._target.feature_layers:
            raise ConfigError(f"drafter {cfg.drafter!r} reads the target's hidden states entering layers "
                              f"{feature_layers}; this engine's {self.forward} forwards keep "
                              f"{self._target.feature_layers or 'none'}")
        tokens = prompt_len + cfg.max_new_tokens + cfg.tree.budget + 1
        # with async drafting every bucket is captured first: no capture while another thread drafts
        return StaticVerifier(self.target.model, cfg.sampling, self._target, tokens, capture_all=cfg.async_draft,
                              features=bool(feature_layers))

    def model_source(self, model: PreTrainedModel, cfg: RunConfig, prompt_len: int) -> ModelSource:
        """A model source over ``model`` on this forward."""
        target_vocab = self.target.model.get_input_embeddings().weight.shape[0]
        if self._target is None:
            return ModelSource(model, cfg.draft_vocab, target_vocab)
        pool, fork = self.pools_of(model)
        tokens = prompt_len + cfg.max_new_tokens + cfg.tree.budget + cfg.tree.root_k + 1
        if self.chain:  # its layers of a bucket holding the budget, up to max_depth of them
            tokens += cfg.tree.max_depth * max(cfg.tree.budget, 1) * 2
        return StaticModelSource(model, pool, tokens, cfg.draft_vocab, target_vocab, fork_pool=fork,
                                  capture_all=cfg.async_draft, chain=self.chain)
