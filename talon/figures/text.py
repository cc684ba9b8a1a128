"""Text made safe to show: control, bidi and zero-width characters replaced by visible stand-ins,
then HTML-escaped (``esc``, ``token_label``), for HTML and for Plotly hovers and labels alike:
quotes as numeric references (``&#34;``): Plotly's labels decode numeric references but, of the
named ones, only ``&amp; &lt; &gt;`` (a ``&quot;`` stayed on screen as typed)."""

from __future__ import annotations

import html
import math
import unicodedata
from collections.abc import Iterable

from talon.trace import StepTrace

WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}
# Bidirectional overrides and zero-width characters can disguise text: always show them as codes.
INVISIBLE = (
    {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"}
    | {chr(c) for c in range(0x202A, 0x202F)}
    | {chr(c) for c in range(0x2066, 0x206A)}
)


# ---------------------------------------------------------------------------------------------
# Text: control characters made visible, then HTML-escaped
# ---------------------------------------------------------------------------------------------


def _visible_char(ch: str) -> str:
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)  # U+2400 control pictures: ␀ ␇ ␛ ...
    if code == 0x7F:
        return "␡"
    if ch in INVISIBLE or unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn"):
        return f"\\u{code:04x}"
    return ch


def clean_text(text: str, keep: str = "\n\t") -> str:
    """``text`` with control/invisible characters replaced by visible stand-ins (``keep`` kept)."""
    return "".join(ch if ch in keep else _visible_char(ch) for ch in text)


def visible_ws(text: str) -> str:
    """Whitespace made visible (␣ ↵ ⇥) and other control characters shown as symbols."""
    return clean_text("".join(WHITESPACE.get(ch, ch) for ch in text), keep="")


def escape(text: str) -> str:
    """``html.escape`` with the quotes as numeric references, which HTML and Plotly both read."""
    return html.escape(text, quote=False).replace('"', "&#34;").replace("'", "&#39;")


def esc(text: str) -> str:
    """Safe for HTML text and attribute values (quotes escaped); newlines and tabs kept."""
    return escape(clean_text(text))


def short_text(text: str, limit: int = 0) -> str:
    """A token as a short label with visible whitespace, not escaped: for a widget that shows its
    labels as text (a dropdown), where an entity would show as typed."""
    shown = visible_ws(text)
    return shown[: limit - 1] + "…" if limit and len(shown) > limit else shown


def token_label(text: str, limit: int = 0) -> str:
    """A token as a short, escaped label with visible whitespace (for hovers and tick labels)."""
    shown = visible_ws(text)
    if limit and len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return escape(shown)


def token_vocab(steps: Iterable[StepTrace]) -> dict[int, str]:
    """Token id -> text, from every token the steps know the text of (tree and bonus tokens)."""
    vocab: dict[int, str] = {}
    for st in steps:
        for ids, texts in zip(st.target_topk_ids, st.target_topk_texts):
            vocab.update(zip(ids, texts))
        vocab.update(zip(st.tokens, st.texts))
        vocab[st.bonus_token] = st.bonus_text
    return vocab


def fmt_number(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}g}"
