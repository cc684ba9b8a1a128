"""A static retrieval datastore: a suffix automaton over a jsonl or text corpus, built once."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from talon.drafters.suffix import (
    DEFAULT_CORPUS_MAX_TOKENS,
    DEFAULT_MAX_OCCURRENCES,
    JSONL_FIELDS,
    JSONL_SUFFIXES,
    SEPARATOR,
    SuffixIndex,
)

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- corpus


class CorpusIndex:
    """A static datastore: one frozen suffix automaton over documents joined by separators."""

    def __init__(
        self,
        documents: Iterable[Sequence[int]],
        max_tokens: int = DEFAULT_CORPUS_MAX_TOKENS,
        max_occurrences: int = DEFAULT_MAX_OCCURRENCES,
    ) -> None:
        self.index = SuffixIndex(max_occurrences)
        self.num_documents = 0
        budget = max_tokens
        for doc in documents:
            if budget <= 0:
                logger.info("corpus truncated at max_tokens=%d", max_tokens)
                break
            chunk = [int(t) for t in doc][:budget]
            if any(t < 0 for t in chunk):
                raise ValueError("corpus token ids must be >= 0")
            self.index.extend(chunk + [SEPARATOR])
            budget -= len(chunk)
            self.num_documents += 1
        self.index.freeze()

    @property
    def num_tokens(self) -> int:
        return len(self.index) - self.num_documents

    @staticmethod
    def from_file(
        path: str, tokenize: Callable[[str], list[int]], max_tokens: int = DEFAULT_CORPUS_MAX_TOKENS
    ) -> "CorpusIndex":
        """Build from a ``.jsonl`` file (fields ``turns``, ``text`` or ``prompt``; one document per
        string) or a plain text file (one document per blank-line-separated paragraph).

        Raises ValueError for a missing, unreadable, malformed or empty file."""
        texts = _read_corpus_texts(Path(path))
        corpus = CorpusIndex(_tokenize_lazily(texts, tokenize, max_tokens), max_tokens=max_tokens)
        logger.info(
            "corpus %s: %d documents, %d tokens", path, corpus.num_documents, corpus.num_tokens
        )
        return corpus


def _tokenize_lazily(
    texts: Iterable[str], tokenize: Callable[[str], list[int]], max_tokens: int
) -> Iterable[list[int]]:
    total = 0
    for text in texts:
        if total >= max_tokens:
            return
        ids = list(tokenize(text))
        total += len(ids)
        yield ids


def _read_corpus_texts(path: Path) -> list[str]:
    if not path.is_file():
        raise ValueError(f"corpus file {str(path)!r} does not exist or is not a file")
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read corpus file {str(path)!r}: {err}") from err
    if path.suffix.lower() in JSONL_SUFFIXES:
        texts = _parse_jsonl(raw, path)
    else:
        texts = [para.strip() for para in re.split(r"\n\s*\n", raw)]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError(f"corpus file {str(path)!r} holds no text")
    return texts


def _parse_jsonl(raw: str, path: Path) -> list[str]:
    texts: list[str] = []
    for lineno, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            where = f"corpus {str(path)!r} line {lineno}"
            raise ValueError(f"{where}: invalid JSON ({err.msg})") from err
        texts.extend(_record_texts(record, path, lineno))
    return texts


def _record_texts(record: object, path: Path, lineno: int) -> list[str]:
    where = f"corpus {str(path)!r} line {lineno}"
    expected = "an object with a 'turns' (list of strings), 'text' or 'prompt' (string) field"
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected {expected}, got {type(record).__name__}")
    for key in JSONL_FIELDS:
        if key not in record:
            continue
        value = record[key]
        if key == "turns" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        if key != "turns" and isinstance(value, str):
            return [value]
        raise ValueError(f"{where}: field {key!r} has the wrong type ({type(value).__name__})")
    raise ValueError(f"{where}: expected {expected}")
