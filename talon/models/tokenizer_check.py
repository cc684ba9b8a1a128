"""Can this draft serve this target? ``check_tokenizers_match``: the same token ids for the
whole vocabulary and the same special tokens, or a ``ModelLoadError`` naming the first
difference."""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase

from talon.models.base import ModelLoadError

_GGUF_PAD_TOKEN = re.compile(r"^\[PAD\d+\]$")  # llama.cpp's filler for unused vocabulary rows


def _vocab_difference(
    target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase
) -> str | None:
    """The first target token (by id) that the draft maps to a different id, if any."""
    draft_vocab = draft_tok.get_vocab()
    for token, token_id in sorted(target_tok.get_vocab().items(), key=lambda item: item[1]):
        draft_id = draft_vocab.get(token)
        if draft_id == token_id or (draft_id is None and _GGUF_PAD_TOKEN.match(token)):
            continue
        where = "missing" if draft_id is None else f"id {draft_id}"
        return f"token {token!r} is id {token_id} in the target but {where} in the draft"
    return None


def _special_difference(
    target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase
) -> str | None:
    """The first special token (eos first) on which the two tokenizers disagree, if any."""
    if (target_tok.eos_token, target_tok.eos_token_id) != (draft_tok.eos_token, draft_tok.eos_token_id):
        return (
            f"eos token {target_tok.eos_token!r} (id {target_tok.eos_token_id}) in the target but "
            f"{draft_tok.eos_token!r} (id {draft_tok.eos_token_id}) in the draft"
        )
    target_specials, draft_specials = target_tok.all_special_tokens, set(draft_tok.all_special_tokens)
    for token in target_specials:
        if token not in draft_specials:
            return f"special token {token!r} of the target is not special in the draft"
    for token in draft_tok.all_special_tokens:
        if token not in target_specials:
            return f"special token {token!r} of the draft is not special in the target"
    return None


def check_tokenizers_match(
    target_tok: PreTrainedTokenizerBase,
    draft_tok: PreTrainedTokenizerBase,
    target_name: str,
    draft_name: str,
) -> None:
    """Raise ModelLoadError unless the draft tokenizes exactly like the target.

    Every token of the target's vocabulary must have the same id in the draft (llama.cpp's
    ``[PADn]`` filler rows excepted), and the eos and special tokens must agree.
    """
    difference = _vocab_difference(target_tok, draft_tok) or _special_difference(target_tok, draft_tok)
    if difference is not None:
        raise ModelLoadError(
            f"The draft model {draft_name!r} does not share the tokenizer of the target "
            f"{target_name!r}: {difference}. Speculative decoding needs the same tokenizer; pick a "
            "draft from the target's model family, or run with draft 'none' (retrieval drafting only)."
        )
