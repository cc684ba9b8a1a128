"""The words a newcomer meets, each defined where it first appears on a text: ``define`` wraps the
first use of every glossary term in a piece of HTML (or Markdown, which passes HTML through) in
``<abbr title="definition">``, so hovering the term says what it means; ``fold`` keeps what a text
shows at first to about ``LEAD_WORDS`` words, the rest behind a "more" fold."""

from __future__ import annotations

import html
import re

# term -> one clause that defines it (the app's texts use these words in exactly this sense)
GLOSSARY: dict[str, str] = {
    "MAT": "mean accepted tokens: the tokens one target forward commits, on average (plain decoding: 1)",
    "AR": "autoregressive: plain decoding, one token per target forward",
    "TALON": "the adaptive-tree paper this app is named after (arXiv 2601.07353): a budget, confidence gates",
    "μ": "the gate: a node expands while its path confidence is at least μ times the best of its layer",
    "path confidence": "c: the product of the draft's q along the node's path from the root",
    "bonus": "the target's own token after the accepted path: every step commits at least one token",
    "graft": "retrieval's continuation joined into the draft model's tree",
    "MTP layer": "multi-token prediction: a layer the model ships to predict past its next token; it drafts "
                 "from the target's last hidden state, with no second model",
    "frontier width": "the nodes one draft layer expands together",
    "atlas": "the draft's proposals around one prompt's greedy text, recorded once and replayed with no model",
    "Pareto": "the settings that no other setting beats on both MAT and step time",
    "hindsight": "known only after the run: no decoder can choose it in advance",
    "near-tie": "two tokens whose logits are closer than a bf16 rounding step",
    "position id": "where a token sits in the text (its length plus the node's depth): siblings share one",
    "residual": "the target's distribution with the rejected drafts removed, renormalised",
    "sibling rank": "a child's place among its parent's children by the draft's q (1 = its top guess)",
    "coverage": "the share of a replay's draft requests that the atlas holds",
    "calibrated": "estimated from how often this run's earlier nodes of the same kind were accepted",
}
_TAG = re.compile(r"(<[^>]+>)")


def _pattern(term: str) -> re.Pattern[str]:
    flags = 0 if term.isupper() or not term.isascii() else re.IGNORECASE
    return re.compile(rf"(?<![\w-]){re.escape(term)}(?![\w-])", flags)


PATTERNS = {term: _pattern(term) for term in GLOSSARY}


def define(text: str) -> str:
    """``text`` with the first use of each glossary term (outside tags) wrapped in an ``<abbr>``
    that defines it."""
    parts = _TAG.split(text)
    for term, pattern in PATTERNS.items():
        title = html.escape(GLOSSARY[term], quote=True)
        for i in range(0, len(parts), 2):  # the text between tags
            if i > 0 and parts[i - 1].startswith("<abbr"):
                continue  # already a defined term
            match = pattern.search(parts[i])
            if match:
                a, b = match.span()
                parts[i:i + 1] = [parts[i][:a], f'<abbr title="{title}">', match.group(0), "</abbr>", parts[i][b:]]
                break
    return "".join(parts)


def undefined(text: str) -> set[str]:
    """The glossary terms ``text`` uses whose first use is not defined (an ``<abbr>`` with the
    term's definition): what a text shown to a newcomer must not have."""
    missing = set()
    visible = _TAG.sub(" ", text)
    for term, pattern in PATTERNS.items():
        if pattern.search(visible) and f'<abbr title="{html.escape(GLOSSARY[term], quote=True)}">' not in text:
            missing.add(term)
    return missing


LEAD_WORDS = 40  # what a text shows before its "more" fold, at most (a first sentence may run longer)
_SENTENCE_END = re.compile(r"(?<=[.;!?])\s+(?=[*A-Z(<])")
_VOID = ("<br", "<img", "<hr", "<input", "<meta", "<wbr")


def words_shown(text: str) -> int:
    """The words of ``text`` (HTML or Markdown) that show before a fold opens."""
    shown = re.sub(r"<details\b.*?</details>", " ", text, flags=re.S)
    shown = re.sub(r"<(\w+)[^>]*\bhidden\b[^>]*>.*?</\1>", " ", shown, flags=re.S)
    return len(_TAG.sub(" ", shown).split())


def _depth(text: str) -> int:
    """Open elements at the end of ``text`` (a split there would break one)."""
    depth = 0
    for tag in _TAG.findall(text):
        if tag.startswith("</"):
            depth -= 1
        elif not tag.endswith("/>") and not tag.startswith(_VOID) and not tag.startswith("<!"):
            depth += 1
    return depth


def fold(text: str, limit: int = LEAD_WORDS) -> str:
    """``text`` (HTML or Markdown) with the sentences after the first ``limit`` words behind a
    "more" fold; the first sentence always shows, and no split falls inside an element."""
    cuts = [m for m in _SENTENCE_END.finditer(text) if _depth(text[:m.start()]) == 0]
    lead = 0
    for m in cuts:
        if len(_TAG.sub(" ", text[:m.start()]).split()) > limit:
            break
        lead = m.start()
    if lead == 0 and cuts:
        lead = cuts[0].start()
    if not lead or len(_TAG.sub(" ", text[lead:]).split()) < 6:
        return text
    return (f"{text[:lead]} <details class=\"talon-more\"><summary>more</summary>\n\n{text[lead:].strip()}"
            "\n\n</details>")
