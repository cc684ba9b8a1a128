"""MTP layers for checks and fixtures: random MTP layers on a target (transformers' ``MtpModel``),
trained briefly on the target's own greedy text so that their drafts are accepted (DeepSeek-V3
trains its MTP module beside the model; here the layer alone, a few hundred Adam steps), and
written into the target's checkpoint in a family's own naming, so the loader reads them as it
reads a published checkpoint.

Two namings (``talon.models.mtp``): ``layers``, DeepSeek-V3's and GLM-4-MoE's
``model.layers.{N + k}.*`` (``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` beside the
block's tensors), and ``mtp``, Mellum's ``mtp.*`` (``mtp.fc``, ``mtp.pre_fc_norm_embedding``,
``mtp.pre_fc_norm_hidden``, ``mtp.norm``, ``mtp.layers.0.*``). The block's own tensors are written
by transformers' ``save_pretrained`` of a model made of the MTP blocks (the target's layer class,
per-expert tensors as checkpoints ship them), then renamed.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from talon.core.forward import additive_mask
from talon.models.memory import GLM_47_FLASH
from talon.models.mtp import MtpLayers, declare_mtp_layers, mtp_layer_count

Naming = Literal["layers", "mtp"]
NAMINGS: tuple[Naming, ...] = ("layers", "mtp")
MTP_STEPS = 300  # Adam steps the fixtures' layers train
MTP_LR = 1e-2

# An MTP preset's target: its transformers model type and config.json fields (``talon.models.memory``)
MTP_TARGETS: dict[str, tuple[str, dict]] = {"zai-org/GLM-4.7-Flash": ("glm4_moe_lite", GLM_47_FLASH)}
CHECK_LAYERS = 4  # the GPU check's target at a preset's widths: its dense first layer, three MoE layers
TINY_SHRINK = {"hidden_size": 16, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
               "qk_rope_head_dim": 8, "intermediate_size": 128, "moe_intermediate_size": 48, "n_routed_experts": 16,
               "num_experts_per_tok": 2, "num_attention_heads": 5}  # --tiny: each field divided by this


MLA_SHARPEN = 16.0


def check_config(target: str, tiny: bool, vocab: int) -> dict:
    """The GPU check's config for an MTP preset's target (``MTP_TARGETS``): its widths, MLA and
    MoE at ``CHECK_LAYERS`` layers (depth adds nothing a tree's positions or masks read: each
    layer gets the same mask), or ``tiny``, every width shrunk (``TINY_SHRINK``); the vocabulary
    ``vocab`` (the check's byte tokenizer's), no end-of-text token (every run decodes its length)."""
    _, published = MTP_TARGETS[target]
    config = {**published, "num_hidden_layers": CHECK_LAYERS, "vocab_size": vocab, "eos_token_id": None,
              "bos_token_id": None, "pad_token_id": 0}
    if tiny:
        config.update({k: max(published[k] // f, 1) for k, f in TINY_SHRINK.items()})
        config["num_key_value_heads"] = config["num_attention_heads"]
    return config


def check_target(kind: str, config: dict, seed: int, dtype: torch.dtype, device: torch.device,
                 sharpen: float = MLA_SHARPEN) -> PreTrainedModel:
    """A random target of transformers' model type ``kind`` (an MTP preset's, ``MTP_TARGETS``) at
    ``config``, its LM head sharpened (as the fixtures' are) so that its greedy text is decisive,
    and its latent attention's queries and rotary keys by ``sharpen`` (the rotary logits by its
    square): at the init's scale attention is near uniform, and a node one position off changes
    no token."""
    from transformers import AutoConfig

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **config), attn_implementation="sdpa",
                                             dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
        for layer in model.get_decoder().layers:
            attention = layer.self_attn
            (attention.q_b_proj if attention.q_b_proj is not None else attention.q_proj).weight.mul_(sharpen)
            attention.kv_a_proj_with_mqa.weight.mul_(sharpen)  # its latent part is normed: the rotary keys' scale
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = None, 0
    return model.to(device=device, dtype=dtype).eval()


def random_mtp(target: PreTrainedModel, seed: int = 0) -> MtpLayers:
    """The target's MTP layers (as many as its config declares), random, float32, on its device;
    its embedding and LM head shared, never trained."""
    from transformers.modeling_layers import MtpModel

    torch.manual_seed(seed)
    declare_mtp_layers(target.config)
    mtp = MtpModel(target, mtp_layer_count(target.config))
    with torch.no_grad():
        for name, param in mtp.named_parameters():
            if name.startswith(("embed_tokens.", "shared_head.")):
                continue
            if "norm" in name and param.dim() == 1:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.5 / param.shape[-1] ** 0.5)
        for name, buffer in mtp.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.zero_()
    return MtpLayers(mtp.to(next(target.parameters()).device).eval(), target)


def last_hidden(target: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """(n, H) float32: the target's last hidden state (after its final norm) at every position of ``ids``."""
    with torch.inference_mode():
        out = target.get_decoder()(input_ids=torch.tensor([ids], device=target.device))
    return out.last_hidden_state[0].float().clone()


def train_mtp(layers: MtpLayers, target: PreTrainedModel, texts: list[list[int]], steps: int = MTP_STEPS,
              seconds: float = float("inf"), levels: int = 2, chained: bool = False) -> dict:
    """Fit the MTP layers on ``texts`` (the target's greedy text) with Adam: level 0 predicts token
    t + 2 from (h_t, token t + 1) at position t + 1; level k feeds level k - 1's output at t with
    token t + k + 1, at position t + k + 1. Reused (``chained`` off): layer 0 at every level, seeing
    level 0 up to t and its own chain (the drafter's rule). ``chained``: layer k at level k, causal
    over its own level, as transformers trains and drafts (``levels``: the layers). Only the MTP
    layers train; the target's embedding and head stay."""
    trained = [p for n, p in layers.mtp.named_parameters() if not n.startswith(("embed_tokens.", "shared_head."))]
    frozen = [p for p in target.parameters()]
    for param in frozen:
        param.requires_grad_(False)
    for param in trained:
        param.requires_grad_(True)
    batches = [(last_hidden(target, ids), torch.tensor(ids, device=target.device)) for ids in texts]
    opt = torch.optim.Adam(trained, lr=MTP_LR)
    start, done, loss = time.perf_counter(), 0, torch.zeros(())
    layers.train()
    while done < steps and time.perf_counter() - start < seconds:
        loss = sum(_loss(layers, hidden, ids, levels, chained) for hidden, ids in batches)
        opt.zero_grad()
        loss.backward()
        opt.step()
        done += 1
    for param in trained:
        param.requires_grad_(False)
    layers.eval()
    return {"steps": done, "seconds": round(time.perf_counter() - start, 1), "levels": levels, "chained": chained,
            "loss": round(float(loss.detach()), 4), "texts": len(texts)}


def _loss(layers: MtpLayers, hidden: torch.Tensor, ids: torch.Tensor, levels: int, chained: bool) -> torch.Tensor:
    """The summed cross-entropy of every level over one text."""
    n = ids.shape[0] - 1 - levels  # rows t = 0 .. n - 1 have a target at every level
    device = hidden.device
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (n, n)
    cache, out, loss = DynamicCache(), hidden[:n], torch.zeros((), device=device)
    for k in range(levels):
        # chained: layer k's own part of the cache, causal; reused: layer 0's, level 0 and the chain so far
        visible = causal if chained else torch.cat([causal] + [torch.eye(n, dtype=torch.bool, device=device)] * k,
                                                   dim=1)  # (n, n) or (n, (k+1) n)
        out, logits = layers(out, ids[k + 1:k + 1 + n], torch.arange(k + 1, k + 1 + n, device=device), cache,
                             additive_mask(visible, torch.float32), layer=k if chained else 0)
        loss = loss + torch.nn.functional.cross_entropy(logits, ids[k + 2:k + 2 + n])
    return loss


def mtp_checkpoint_tensors(layers: MtpLayers, target: PreTrainedModel, naming: Naming) -> dict[str, torch.Tensor]:
    """The MTP layers' tensors under ``naming``, the blocks' as ``save_pretrained`` writes a layer."""
    declare_mtp_layers(target.config)
    config = target.config.get_mtp_config()
    blocks = AutoModelForCausalLM.from_config(config)
    for k, layer in enumerate(layers.mtp.layers):
        blocks.model.layers[k].load_state_dict(layer.mtp_block.state_dict())
    with tempfile.TemporaryDirectory() as tmp:
        blocks.save_pretrained(tmp)
        written = {}
        for file in Path(tmp).glob("*.safetensors"):
            written.update(load_file(str(file)))
    n = int(target.config.get_text_config().num_hidden_layers)
    tensors: dict[str, torch.Tensor] = {}
    for k, layer in enumerate(layers.mtp.layers):
        inside = f"model.layers.{k}."
        block = {name[len(inside):]: t for name, t in written.items() if name.startswith(inside)}
        extras = {"enorm": layer.enorm.weight, "hnorm": layer.hnorm.weight, "eh_proj": layer.eh_proj.weight,
                  "post_norm": layer.post_norm.weight}
        if naming == "layers":
            prefix = f"model.layers.{n + k}."
            names = {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "post_norm": "shared_head.norm"}
            tensors.update({prefix + name: t for name, t in block.items()})
            tensors.update({f"{prefix}{names[key]}.weight": t for key, t in extras.items()})
        else:  # Mellum: one layer, its projection and norms one level up
            names = {"enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden", "eh_proj": "fc",
                     "post_norm": "norm"}
            tensors.update({f"mtp.layers.{k}.{name}": t for name, t in block.items()})
            tensors.update({f"mtp.{names[key]}.weight": t for key, t in extras.items()})
    return {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in tensors.items()}


def write_mtp_checkpoint(target: PreTrainedModel, layers: MtpLayers, out: Path, naming: Naming,
                         tokenizer: object | None = None) -> Path:
    """``target``'s checkpoint with its MTP layers in ``naming``, in directory ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    target.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)  # type: ignore[attr-defined]
    weights = out / "model.safetensors"
    tensors = load_file(str(weights))
    tensors.update(mtp_checkpoint_tensors(layers, target, naming))
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return out
