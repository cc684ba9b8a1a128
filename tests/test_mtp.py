"""A target's own MTP layers as Talon's drafter (``talon.models.mtp``, ``talon.drafters.mtp``), on
the tiny checkpoints of ``data/mtp_parity`` (``python -m scripts.mtp_fixtures``): DeepSeek-V3's
classes (MLA, a routed MoE) and GLM-4.7-Flash's in their ``model.layers.{N}.*`` naming, and Mellum's (dense, grouped
queries) in its ``mtp.*`` naming, each MTP layer trained briefly on its target's text.

* Lossless: greedy float32 equals the target's ``generate`` on every tree mode and both CPU
  forwards, with drafts accepted; the command line's ``--drafter mtp`` too.
* Parity with transformers' ``MTPCandidateGenerator`` (``generate(use_mtp=True)``): on a chain of
  one, Talon's draft and its logits equal the reference's at every step (float32, 1e-5); a hidden
  state fed one position late and the concatenation swapped each break it.
* Refusals before any weight loads: a Gated DeltaNet target, a checkpoint without MTP weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DeepseekV3Config, MellumConfig
from transformers.modeling_layers import MtpModel

from talon.drafters.mtp import MtpChainSource, MtpSource, attach_mtp, mtp_layers_of
from talon.engine.engine import Engine, generate
from talon.gpucheck.mtp import random_mtp
from talon.models import LoadedModel, ModelLoadError
from talon.models.mtp import MtpLayers, check_mtp_spec, load_mtp, mtp_layer_count, mtp_refusal
from talon.run_config import ConfigError, RunConfig, TreeConfig
from tests.tiny import REPO, byte_tokenizer

FIXTURES = REPO / "data" / "mtp_parity"
MTP_FAMILIES = ("deepseek_v3", "mellum")  # those transformers' generate(use_mtp=True) runs: the parity tests'
# and GLM-4.7-Flash's classes (MLA, a dense layer then a routed MoE), its config declaring the layer as the
# published one does (num_nextn_predict_layers alone, which transformers 5.23 does not map for this family)
DECODED_FAMILIES = (*MTP_FAMILIES, "glm4_moe_lite")
PARITY_TOL = 1e-5
PROMPT = "def add(a, b):"
TOKENS = 40


def loaded(family: str) -> LoadedModel:
    path = FIXTURES / family
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    return LoadedModel(model, byte_tokenizer(), str(path), torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module", params=MTP_FAMILIES)
def family(request: pytest.FixtureRequest) -> tuple[str, LoadedModel]:
    return request.param, loaded(request.param)


@pytest.fixture(scope="module", params=DECODED_FAMILIES)
def decoded(request: pytest.FixtureRequest) -> tuple[str, LoadedModel]:
    return request.param, loaded(request.param)


def prompt_ids(target: LoadedModel, prompt: str = PROMPT) -> list[int]:
    return target.tokenizer(prompt)["input_ids"]


def greedy(target: LoadedModel, ids: list[int], tokens: int = TOKENS, **kwargs: object) -> list[int]:
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = target.model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=tokens,
                                    **kwargs)
    return out[0, len(ids):].tolist()


def test_the_loader_reads_both_namings_onto_transformers_mtp_layers(decoded: tuple[str, LoadedModel]) -> None:
    name, target = decoded
    written = json.loads((FIXTURES / name / "config.json").read_text(encoding="utf-8"))
    if name == "glm4_moe_lite":  # as GLM-4.7-Flash's config declares its layer: transformers' own fields derived
        assert written["num_nextn_predict_layers"] == 1 and not {"num_mtp_layers", "mtp_mlp_layer_types"} & set(written)
    layers = mtp_layers_of(target.model, target.name)
    assert isinstance(layers, MtpLayers) and layers.layers == 1
    assert layers.feature_layers == (target.model.config.num_hidden_layers,)
    names = json.loads((FIXTURES / name / "training.json").read_text(encoding="utf-8"))["naming"]
    assert names == {"deepseek_v3": "layers", "glm4_moe_lite": "layers", "mellum": "mtp"}[name]
    block = layers.mtp.layers[0].mtp_block
    assert type(block) is type(target.model.get_decoder().layers[-1])  # the target's own layer class
    assert type(block.mlp).__name__.endswith("MoE") == (name != "mellum")  # a routed MoE, as transformers builds it
    assert layers.mtp.shared_head is target.model.lm_head  # the target's head, shared


@pytest.mark.parametrize("forward", ["dynamic", "static"])
@pytest.mark.parametrize("tree", ["adaptive", "static", "chain"])
def test_mtp_decodes_the_targets_own_greedy_text(decoded: tuple[str, LoadedModel], tree: str, forward: str) -> None:
    _, target = decoded
    engine = Engine(target, None, forward=forward)
    ids = prompt_ids(target)
    want = greedy(target, ids)
    for drafter in ("mtp", "mtp-hybrid"):
        cfg = RunConfig(drafter=drafter, max_new_tokens=TOKENS, chat_template=False,
                        tree=TreeConfig(mode=tree, budget=12, cost_aware=False, min_conf=0.0))
        summary, steps = generate(engine, ids, cfg)
        assert summary.token_ids == want, (drafter, tree, forward)
        assert summary.mean_accepted_tokens >= 1.5, (drafter, tree, forward, summary.mean_accepted_tokens)
        assert any(s.sources[n] == "mtp" for s in steps for n in s.accepted[1:])  # the MTP layer's drafts, accepted


def test_an_unseen_prompt_is_lossless_with_drafts_rejected(family: tuple[str, LoadedModel]) -> None:
    """A prompt the layer never trained on: many drafts rejected, the text still the target's."""
    _, target = family
    ids = prompt_ids(target, "zebra quartz 42")
    cfg = RunConfig(drafter="mtp", max_new_tokens=TOKENS, chat_template=False,
                    tree=TreeConfig(mode="adaptive", budget=16, cost_aware=False, min_conf=0.0))
    summary, steps = generate(Engine(target, None), ids, cfg)
    assert summary.token_ids == greedy(target, ids)
    assert sum(len(s.tokens) - 1 - s.accept_len for s in steps) > 0  # drafted nodes rejected


Drafts = dict[tuple[int, int], tuple[int, torch.Tensor]]  # (depth - 1, the root's position) -> token drafted, logits


def reference_drafts(target: LoadedModel, ids: list[int]) -> tuple[list[int], Drafts]:
    """``generate(use_mtp=True)``'s text, and per MTP call and depth the root's position (its
    last input's), the drafted token and its logits (a forward hook on transformers' ``MtpModel``:
    its logic untouched; with several layers it chains layer k at depth k + 1)."""
    calls: Drafts = {}

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, out: tuple) -> None:
        if isinstance(module, MtpModel):
            root = int(kwargs["position_ids"][0, -1])
            for depth, (token, logits) in enumerate(zip(out[0][0].tolist(), out[1][0])):
                calls[(depth, root)] = token, logits.float().clone()

    handle = torch.nn.modules.module.register_module_forward_hook(hook, with_kwargs=True)
    try:
        n, layers = int(target.model.config.num_hidden_layers), mtp_layer_count(target.model.config)
        # the class's own pattern names DeepSeek-V3's 61 layers: name this checkpoint's
        target.model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{n + k}\..*" for k in range(layers)]
        target.model._keys_to_ignore_on_load_unexpected.append(r"^mtp\.")
        text = greedy(target, ids, use_mtp=True)
    finally:
        handle.remove()
    return text, calls


def talon_drafts(target: LoadedModel, ids: list[int], source: type[MtpSource] = MtpSource,
                 swap: bool = False) -> tuple[list[int], Drafts]:
    """Talon's text on a chain of one node a step per MTP layer, and per step and depth the root's
    position, its draft and logits (``source``: the rule; an MtpChainSource chains the layers)."""
    layers = load_mtp(target.model, target.name)
    layers.mtp.config.mtp_hidden_states_first = swap  # planted: the projection reads [hidden, embedding]
    attach_mtp(target.model, layers)
    calls: Drafts = {}

    def hook(module: torch.nn.Module, args: tuple, out: tuple) -> None:  # a one-layer chain: the root's drafts
        calls[(0, int(args[2][-1]))] = int(out[1][-1].argmax()), out[1][-1].detach().clone()

    chained = issubclass(source, MtpChainSource)
    handle = None if chained else layers.register_forward_hook(hook)
    import talon.drafters.mtp as mtp_module

    made, chain_made = mtp_module.MtpSource, mtp_module.MtpChainSource
    mtp_module.MtpChainSource = recording_drafts(source, calls) if chained else chain_made
    mtp_module.MtpSource = made if chained else source
    try:
        cfg = RunConfig(drafter="mtp", max_new_tokens=TOKENS, chat_template=False,
                        mtp_layers="chained" if chained else "reuse",
                        tree=TreeConfig(mode="chain", budget=layers.layers, cost_aware=False, min_conf=0.0))
        summary, _ = generate(Engine(target, None), ids, cfg)
    finally:
        mtp_module.MtpSource, mtp_module.MtpChainSource = made, chain_made
        if handle is not None:
            handle.remove()
        mtp_module.LOADED.pop(target.model, None)
    return summary.token_ids, calls


def recording_drafts(source: type[MtpChainSource], calls: Drafts) -> type[MtpChainSource]:
    """``source`` recording each draft's logits under (depth - 1, the root's position)."""

    class Recording(source):  # type: ignore[misc, valid-type]
        def _feed_committed(self) -> tuple[int, torch.Tensor]:
            rows, logits = super()._feed_committed()
            calls[(0, len(self.context) - 1)] = int(logits[-1].argmax()), logits[-1].detach().clone()
            return rows, logits

        def _feed_tree(self, tree: object, nodes: list[int]) -> tuple[int, torch.Tensor]:
            rows, logits = super()._feed_tree(tree, nodes)
            for node, row in zip(nodes, logits):
                calls[(tree.depths[node], len(self.context) - 1)] = int(row.argmax()), row.detach().clone()
            return rows, logits

    return Recording


def parity_gap(family: tuple[str, LoadedModel], **planted: object) -> float:
    """The largest logit gap between Talon's MTP drafts and the reference's, step by step and
    depth by depth (inf where a drafted token differs). The reference's first step is the target's
    alone (its MTP needs a hidden state first); Talon drafts from its first step, so its prompt
    carries the target's first token, and both then draft from the same root at every step."""
    _, target = family
    ids = prompt_ids(target)
    ref_text, ref = reference_drafts(target, ids)
    text, got = talon_drafts(target, ids + ref_text[:1], **planted)
    assert text[:len(ref_text) - 1] == ref_text[1:] and ref_text == greedy(target, ids)  # lossless either way
    depths = mtp_layer_count(target.model.config)
    last = max(root for _, root in ref)  # the reference's last call drafts past the text's end
    compared = [key for key in ref if key[1] < last]
    assert len(compared) >= 9 * depths and {key[0] for key in compared} == set(range(depths)), sorted(ref)
    gap = 0.0
    for key in compared:
        if key not in got or got[key][0] != ref[key][0]:
            return float("inf")
        gap = max(gap, float((got[key][1] - ref[key][1]).abs().max()))
    return gap


def test_mtp_drafts_and_logits_equal_transformers_mtp_candidate_generator(family: tuple[str, LoadedModel]) -> None:
    assert parity_gap(family) < PARITY_TOL


class OneLate(MtpSource):
    """Planted: each pair gets the hidden state one position late (h_{t+1} with token t + 1)."""

    def add_features(self, features: torch.Tensor) -> None:
        if not self.features:
            features = features[1:]
        super().add_features(features)

    def _feed_context(self) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.features) < len(self.context) - 1:
            self.features.append(self.features[-1])
        return super()._feed_context()


@pytest.mark.parametrize("planted", ["one position late", "concatenation swapped"])
def test_parity_catches_a_planted_bug(family: tuple[str, LoadedModel], planted: str) -> None:
    kwargs = {"source": OneLate} if planted == "one position late" else {"swap": True}
    assert parity_gap(family, **kwargs) > 1e-3


CHAINED = "deepseek_v3_chained"  # three MTP layers, trained chained


@pytest.fixture(scope="module")
def chained() -> tuple[str, LoadedModel]:
    return CHAINED, loaded(CHAINED)


@pytest.mark.parametrize("forward", ["dynamic", "static"])
@pytest.mark.parametrize("tree", ["adaptive", "static", "chain"])
def test_chained_layers_decode_the_targets_greedy_text(chained: tuple[str, LoadedModel], tree: str,
                                                       forward: str) -> None:
    """``--mtp-layers chained``: layer k drafts depth k + 1, so the tree is at most three deep,
    and the third layer's drafts are accepted."""
    _, target = chained
    ids = prompt_ids(target)
    want = greedy(target, ids)
    for drafter in ("mtp", "mtp-hybrid"):
        cfg = RunConfig(drafter=drafter, max_new_tokens=TOKENS, chat_template=False, mtp_layers="chained",
                        tree=TreeConfig(mode=tree, budget=12, cost_aware=False, min_conf=0.0))
        summary, steps = generate(Engine(target, None, forward=forward), ids, cfg)
        assert summary.token_ids == want, (drafter, tree, forward)
        assert summary.mean_accepted_tokens >= 2.5, (drafter, tree, forward, summary.mean_accepted_tokens)
        assert max(d for s in steps for d, src in zip(s.depths, s.sources) if src == "mtp") == 3
        assert any(s.accept_len >= 3 and s.sources[s.accepted[3]] in ("mtp", "both") for s in steps)


def test_chained_drafts_and_logits_equal_transformers_at_every_depth(chained: tuple[str, LoadedModel]) -> None:
    """transformers' ``MTPCandidateGenerator`` chains a three-layer checkpoint's layers; on a chain
    of three, Talon's drafts and logits at depths 1, 2 and 3 equal its own, every step."""
    assert parity_gap(chained, source=MtpChainSource) < PARITY_TOL


class UnseenAncestors(MtpChainSource):
    """Planted: a node's entry in a deeper layer sees the committed pairs and itself, not its
    ancestors' entries there (the entries whose tokens are drafts)."""

    def _attended(self, tree: object, node: int) -> list[int]:
        return [node]


class NodesOneLate(MtpChainSource):
    """Planted: the tree's entries (past the root) sit one position late (a whole layer shifted
    would not show: rotary attention sees relative positions)."""

    def _run(self, layer: int, g: torch.Tensor, ids: list[int], positions: torch.Tensor,
             visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super()._run(layer, g, ids, positions + (positions >= len(self.context)), visible)


@pytest.mark.parametrize("planted", [MtpSource, UnseenAncestors, NodesOneLate],
                         ids=["layer 0 at every depth", "ancestors unseen", "tree entries one late"])
def test_chained_parity_catches_a_planted_bug(chained: tuple[str, LoadedModel], planted: type) -> None:
    assert parity_gap(chained, source=planted) > 1e-3


def test_the_command_line_decodes_with_mtp_as_generate_does(decoded: tuple[str, LoadedModel], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    """``python -m talon generate --target DIR --drafter mtp --dtype float32 --json``, in process."""
    name, target = decoded
    summary = cli_summary(name, [], tmp_path, monkeypatch, capsys)
    assert summary["token_ids"] == greedy(target, prompt_ids(target))
    assert summary["mean_accepted_tokens"] >= 1.5
    assert summary["config"]["drafter"] == "mtp"


def test_the_command_line_chains_the_layers_as_generate_with_mtp_does(chained: tuple[str, LoadedModel],
                                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """``--tree chain --mtp-layers chained`` on three layers: ``generate(use_mtp=True)``'s text."""
    name, target = chained
    summary = cli_summary(name, ["--tree", "chain", "--mtp-layers", "chained"], tmp_path, monkeypatch, capsys)
    assert summary["token_ids"] == reference_drafts(target, prompt_ids(target))[0]
    assert summary["mean_accepted_tokens"] >= 2.5 and summary["config"]["mtp_layers"] == "chained"


def cli_summary(name: str, extra: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture) -> dict:
    """``python -m talon generate --target FIXTURE --drafter mtp ... --json``'s summary, run in process."""
    from talon.cli.main import main

    monkeypatch.setenv("TALON_PREPACK", "0")
    monkeypatch.setenv("TALON_COST_CACHE", str(tmp_path))
    argv = ["generate", "--target", str(FIXTURES / name), "--drafter", "mtp", "--dtype", "float32", "--json",
            "--no-chat-template", "--prompt", PROMPT, "--max-new-tokens", str(TOKENS),
            "--cost-aware", "off", *extra]  # planning on a probe taken while the suite runs would vary the trees
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def write_config(path: Path, config: object) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)  # type: ignore[attr-defined]
    return path


def test_a_gated_deltanet_target_is_refused_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from transformers import Qwen3_5TextConfig

    from talon.cli.main import main

    cfg = Qwen3_5TextConfig(vocab_size=258, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=128, mtp_num_hidden_layers=1)
    path = write_config(tmp_path / "qwen35", cfg)  # a config alone: nothing to load, the refusal comes first
    assert main(["generate", "--target", str(path), "--drafter", "mtp", "--prompt", "x"]) == 2  # no exception
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0] and "linear_attention" in errors[0], errors


def test_a_checkpoint_without_mtp_weights_is_refused(tmp_path: Path) -> None:
    config = DeepseekV3Config(vocab_size=258, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              n_routed_experts=2, num_experts_per_tok=1, n_group=1, topk_group=1)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path / "plain")
    with pytest.raises(ModelLoadError, match="holds no MTP weights"):
        check_mtp_spec(str(tmp_path / "plain"))
    with pytest.raises(ModelLoadError, match="ships no MTP layers"):
        check_mtp_spec("embedded:qwen2.5-coder-1.5b-instruct")
    assert mtp_refusal(config, None) is None  # its config declares one: only its tensors tell


def test_a_target_without_mtp_layers_refuses_the_mtp_kinds_at_once() -> None:
    from tests.tiny import tiny_loaded

    engine = Engine(tiny_loaded("llama", 0), None)
    with pytest.raises(ConfigError, match="declares no MTP layers"):
        engine.prepare("abc", RunConfig(drafter="mtp", chat_template=False))


@pytest.mark.parametrize("rule", ["reuse", "chained"])
def test_sampled_mtp_runs_keep_the_targets_distribution(rule: str) -> None:
    """Sampling with MTP layers (random, over six ids: a tiny dense Mellum target's one layer
    reused, a tiny DeepSeek-V3's two layers chained): the first two tokens are distributed as the
    target's, with drafts accepted."""
    from talon.core.accept import warp_probs
    from talon.run_config import SamplingConfig

    vocab, sampling = 6, SamplingConfig(temperature=0.7, top_k=4, top_p=0.9, seed=0)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None)
    config = (MellumConfig(**common, num_key_value_heads=1, head_dim=16, mlp_layer_types=["dense"] * 2,
                           num_nextn_predict_layers=1, mtp_layer_types=["full_attention"],
                           mtp_mlp_layer_types=["dense"])
              if rule == "reuse" else
              DeepseekV3Config(**common, num_key_value_heads=2, num_nextn_predict_layers=2, moe_intermediate_size=16,
                               n_routed_experts=2, num_experts_per_tok=1, n_group=1, topk_group=1, kv_lora_rank=8,
                               q_lora_rank=12, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16))
    torch.manual_seed(21)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    target = LoadedModel(model, byte_tokenizer(), "t", torch.float32, torch.device("cpu"))
    attach_mtp(model, random_mtp(model, seed=22))
    prompt = [1, 4, 2, 0, 3]
    with torch.inference_mode():
        p1 = warp_probs(model(torch.tensor([prompt])).logits[0, -1][None], 0.7, 4, 0.9)[0]
        exact = {}
        for x in range(vocab):
            p2 = warp_probs(model(torch.tensor([prompt + [x]])).logits[0, -1][None], 0.7, 4, 0.9)[0]
            exact.update({(x, y): float(p1[x] * p2[y]) for y in range(vocab)})
    engine = Engine(target, None)
    tree = TreeConfig(mode="adaptive", budget=4, root_k=3, top_k=2, mu=0.0, max_depth=3, cost_aware=False)
    n, counts, accepted = 1200, {}, 0
    for seed in range(n):
        run = engine.run(prompt, RunConfig(drafter="mtp", tree=tree, max_new_tokens=2, mtp_layers=rule,
                                           sampling=SamplingConfig(**{**sampling.__dict__, "seed": seed})))
        accepted += sum(step.accept_len for step in run)
        key = tuple(run.summary.token_ids[:2])
        counts[key] = counts.get(key, 0.0) + 1.0 / n
    assert accepted > n // 4, "drafts must be accepted, not only bonus tokens"
    keys = set(counts) | set(exact)
    tv = 0.5 * sum(abs(counts.get(k, 0.0) - exact.get(k, 0.0)) for k in keys)
    rng = torch.Generator().manual_seed(0)
    probs = torch.tensor([exact[k] for k in sorted(exact)])
    nulls = sorted(0.5 * float((torch.bincount(torch.multinomial(probs, n, replacement=True, generator=rng),
                                               minlength=len(probs)) / n - probs).abs().sum()) for _ in range(400))
    bound = nulls[int(0.999 * len(nulls))]
    assert bound < 0.1, "n too small to tell a biased sampler (the naive rule's bias: over 0.1)"
    assert tv < bound, (tv, bound)


@pytest.fixture(scope="module")
def mtp_atlas() -> tuple[Engine, list[int], object]:
    """An atlas recorded with the DeepSeek-V3 fixture's MTP layer drafting."""
    from talon.atlas.record import record_atlas
    from talon.cost.model import synthetic_costs

    target = loaded("deepseek_v3")
    engine = Engine(target, None, costs=synthetic_costs({1: 0.1, 16: 0.14, 64: 0.3}, {1: 0.004, 16: 0.006}))
    ids = prompt_ids(target)
    atlas = record_atlas(engine, ids, RunConfig(drafter="mtp-hybrid", max_new_tokens=TOKENS, chat_template=False))
    return engine, ids, atlas


def test_an_atlas_of_the_chained_layers_is_refused(chained: tuple[str, LoadedModel]) -> None:
    from talon.atlas.record import record_atlas

    _, target = chained
    cfg = RunConfig(drafter="mtp", mtp_layers="chained", max_new_tokens=4, chat_template=False)
    with pytest.raises(ConfigError, match="records MTP layer 0"):
        record_atlas(Engine(target, None), PROMPT, cfg)


@pytest.mark.parametrize("drafter", ["mtp", "mtp-hybrid"])
def test_replays_of_an_mtp_atlas_equal_the_real_runs(mtp_atlas: tuple, drafter: str) -> None:
    from talon.atlas.data import parse_atlas
    from talon.atlas.loop import compare_runs
    from talon.atlas.replay import replay

    engine, ids, atlas = mtp_atlas
    atlas = parse_atlas(json.loads(json.dumps(atlas.to_dict())))  # as a file reads back
    assert atlas.draft_kind == "mtp" and atlas.reads_features
    for mode in ("adaptive", "static", "chain"):
        cfg = RunConfig(drafter=drafter, max_new_tokens=TOKENS, chat_template=False, cost_model="fixed",
                        tree=TreeConfig(mode=mode, budget=12, cost_aware=False))
        summary, steps = generate(engine, ids, cfg)
        result = replay(atlas, cfg)
        assert result.summary.token_ids == summary.token_ids == atlas.output
        agreement = compare_runs(steps, result.steps, coverage=result.coverage)
        assert agreement.equal and [s.tokens for s in steps] == [s.tokens for s in result.steps], agreement.reason
        assert summary.mean_accepted_tokens >= 1.5


def test_the_engines_mtp_rules_sweep_an_mtp_atlas(mtp_atlas: tuple, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from talon.cli.main import main

    _, _, atlas = mtp_atlas
    path = tmp_path / "mtp.atlas.json"
    path.write_text(json.dumps(atlas.to_dict()), encoding="utf-8")
    assert main(["atlas", "sweep", str(path), "--grid", "drafter=mtp,mtp-hybrid", "--grid", "budget=4,12"]) == 0
    out = capsys.readouterr().out
    assert "mtp-hybrid | 12" in out and "exact" in out
    words = {"vllm": "vLLM mtp, k=", "sglang": "SGLang NEXTN, topk=", "llamacpp": "llama.cpp draft-mtp, n_max="}
    for engine, word in words.items():
        assert main(["atlas", "sweep", str(path), "--engine", engine]) == 0
        assert word in capsys.readouterr().out


def test_serve_it_gives_each_engines_mtp_flags() -> None:
    from talon.atlas.serving import serving_config

    cfg = RunConfig(drafter="mtp", tree=TreeConfig(mode="chain", budget=3, max_depth=3))
    out = serving_config(cfg, "zai-org/GLM-4.5-Air", None)
    assert out.sglang_flags[:2] == ["--speculative-algorithm", "NEXTN"]
    assert "--speculative-draft-model-path" not in out.sglang_flags  # the MTP layer is in the target's checkpoint
    assert out.vllm_config == {"method": "mtp", "num_speculative_tokens": 3}
    assert out.llamacpp_flags[out.llamacpp_flags.index("--spec-type") + 1] == "draft-mtp"


def test_the_lesson_lines_up_mtp_eagle3_and_a_draft_model(mtp_atlas_file: Path, head_atlas_file: Path,
                                                          model_atlas_file: Path) -> None:
    """Three atlases of one prompt on the tiny target (its MTP layer, an EAGLE-3 head, a noisy
    draft model): each replayed alone; the per-depth acceptance is the replays' own, and the
    words rank the drafters as their MAT does."""
    from talon.atlas.data import load_atlases
    from talon.figures.lessons import mtp_lineup_figure, mtp_lineup_words
    from talon.lessons.mtp import depth_acceptance, lineups_of, mtp_lineup

    atlases = load_atlases([mtp_atlas_file, head_atlas_file, model_atlas_file])
    [group] = lineups_of(atlases)
    lesson = mtp_lineup(group, budget=16)
    assert lesson.kinds == ("mtp", "head", "draft")
    assert all(lesson.mat[k] > 1.0 for k in lesson.kinds), lesson.mat
    assert depth_acceptance([0, 1, 3, 3]) == [0.75, 2 / 3, 1.0, 0.0, None, None]
    assert len(mtp_lineup_figure(lesson).data) == 3
    words = mtp_lineup_words(lesson)
    ranked = sorted(lesson.kinds, key=lambda k: -lesson.mat[k])
    names = {"mtp": "MTP layer", "head": "EAGLE-3 head", "draft": "draft model"}
    assert [words.index(names[k]) for k in ranked] == sorted(words.index(names[k]) for k in ranked)
    assert lineups_of(atlases[1:]) == []  # no MTP atlas: nothing to line up


def test_a_sliding_mtp_layer_sees_only_the_pairs_inside_its_window() -> None:
    """A sliding MTP layer (Mellum2's) with a window of 3: each committed pair at position j + 1
    and each tree node sees only the committed pairs fewer than 3 positions behind it, plus its
    ancestors and itself (the masks a ``PairSource`` hands its module)."""
    from transformers import DynamicCache

    from talon.drafters.pairs import PairSource
    from talon.tree import DraftTree

    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    class Probe:  # records each forward's positions and mask, appends one cache entry a row
        dtype = torch.float32

        def __call__(self, g: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
                     mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            seen.append((positions.clone(), mask[0, 0] == 0))
            cache.update(torch.zeros(1, 1, len(ids), 2), torch.zeros(1, 1, len(ids), 2), 0)
            return torch.zeros(len(ids), 4), torch.linspace(0, 1, 5).repeat(len(ids), 1)

    class Sliding(PairSource):
        position_lead = 1

    source = Sliding(Probe(), (2,), window=3)  # type: ignore[arg-type]
    source.reset(list(range(8)))
    source.add_features(torch.zeros(7, 4))
    tree = DraftTree.with_root(7)
    child = tree.add(0, source.expand(tree, [0], 2)[0][0][0], 0.9, "model")
    source.expand(tree, [child], 2)
    (pair_pos, pairs), (node_pos, node) = seen
    assert pair_pos.tolist() == list(range(1, 8))
    want = torch.tensor([[c <= r and r - c < 3 for c in range(7)] for r in range(7)])
    assert torch.equal(pairs, want)
    assert node_pos.tolist() == [8] and node[0].tolist() == [False] * 5 + [True, True, True]  # pairs at 6, 7; itself
    seen.clear()
    source.window = 0  # planted: the window ignored
    source.reset(list(range(8)))
    source.add_features(torch.zeros(7, 4))
    source.expand(DraftTree.with_root(7), [0], 2)
    assert not torch.equal(seen[0][1], want)
