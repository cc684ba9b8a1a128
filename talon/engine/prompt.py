"""A run's two ends: the prompt turned into token ids (``encode_prompt``) and where generation
stops (``StopCheck``: max_new_tokens, EOS, stop strings)."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from talon.models import LoadedModel
from talon.trace import StopReason


class PromptError(ValueError):
    """The prompt cannot be run (empty, too long); the message says why, with the numbers."""


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, prompt: str | list[int], chat_template: bool, vocab_size: int
) -> list[int]:
    """Token ids of the prompt; a list of ids is taken as it is (no chat template)."""
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and 0 <= t < vocab_size for t in prompt):
            raise PromptError(f"prompt ids must be a non-empty list of ints in [0, {vocab_size})")
        return list(prompt)
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptError("the prompt is empty: type some text to continue")
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(prompt)["input_ids"]
    if not ids:
        raise PromptError("the tokenizer turns this prompt into no tokens at all: try other text")
    return ids


def eos_ids(lm: LoadedModel) -> set[int]:
    ids: set[int] = set()
    gen_eos = getattr(lm.model.generation_config, "eos_token_id", None)
    for value in (gen_eos, lm.tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(value)
    return ids


@dataclass
class StopCheck:
    """Where to cut the new tokens of a step: max_new_tokens, EOS, stop strings."""

    tokenizer: PreTrainedTokenizerBase | None  # None: no stop strings (a replay has no tokenizer)
    eos: set[int]
    stop_strings: tuple[str, ...]
    max_new_tokens: int

    def cut(self, generated: list[int], new_tokens: list[int]) -> tuple[list[int], StopReason | None]:
        """The prefix of ``new_tokens`` to keep and why generation stops (None: it goes on)."""
        window = max((len(s) for s in self.stop_strings), default=0) + 8
        for i, token in enumerate(new_tokens):
            kept = new_tokens[: i + 1]
            if len(generated) + len(kept) >= self.max_new_tokens:
                return kept, "max_new_tokens"
            if token in self.eos:
                return kept, "eos"
            if self.stop_strings:
                tail = self.tokenizer.decode((generated + kept)[-window:])
                if any(s in tail for s in self.stop_strings):
                    return kept, "stop_string"
        return new_tokens, None
