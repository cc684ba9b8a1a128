"""Hand-made steps and traces for the figure, trace-file and app tests: a small tree step
(``make_step``), hostile token texts (``hostile_steps``, ``RAW_BAD``), a whole run of steps, a
sampled step, a summary of steps, and a well-formed trace file's JSON (``good_trace``)."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from talon.trace import RunSummary, StepTrace


def good_trace() -> dict:
    steps = [make_step(i) for i in range(2)]
    data = {"format": "talon-trace/1", "summary": summary_of(steps).to_dict(), "steps": [s.to_dict() for s in steps]}
    return json.loads(json.dumps(data))  # as read from a file: tuples become lists


def summary_of(steps) -> RunSummary:
    return RunSummary("t", [1], [1], len(steps), 3.0, 10.0, 0.3, target="tiny", draft="tiny")


HOSTILE = ["<script>alert(1)</script>", "\"quoted' & <b>bold", "\x07bell\x1b[31m", "\u202egnp.exe", "tab\there\nnl"]


def make_step(step: int = 3, texts: list[str] | None = None) -> StepTrace:
    """A hand-built tree (node: parent, source):

    0 root ─┬─ 1 retrieval ── 2 retrieval ── 3 model     accepted: 0-1-2, 3 rejected, bonus
            ├─ 4 model ─┬─ 6 model                       4 rejected, 6/7 unreached
            │           └─ 7 model
            └─ 5 both                                    5 rejected, gated out
    """
    parents = [-1, 0, 1, 2, 0, 0, 4, 4]
    depths = [0, 1, 2, 3, 1, 1, 2, 2]
    sources = ["root", "retrieval", "retrieval", "model", "model", "both", "model", "model"]
    q = [1.0, 0.9, 0.8, 0.5, 0.3, 0.05, 0.6, 0.3]
    conf = [1.0]
    for i in range(1, 8):
        conf.append(conf[parents[i]] * q[i])
    layer_max = [None, 0.9, 0.72, None, 0.9, 0.9, 0.72, 0.72]
    passed = [None, True, True, None, True, False, True, True]
    texts = texts or ["def", " add", "(", "a", " sub", "\n", ":", " x"]
    return StepTrace(
        step=step,
        tokens=[10, 11, 12, 13, 14, 15, 16, 17],
        texts=texts,
        parents=parents,
        depths=depths,
        q_draft=q,
        path_conf=conf,
        sources=sources,
        gate_layer_max=layer_max,
        gate_threshold=[None if m is None else 0.1 * m for m in layer_max],
        gate_passed=passed,
        target_top1=[11, 12, 99, 5, 6, 7, 8, 9],
        accepted=[0, 1, 2],
        bonus_token=99,
        bonus_text="b<",
        new_tokens=[11, 12, 99],
        drafter_busy=[(0.01 * step, 0.01 * step + 0.004)],
        verifier_busy=[(0.01 * step + 0.004, 0.01 * step + 0.009)],
    )


def sampled_step(st: StepTrace) -> StepTrace:
    """``st`` as a sampled step records it: the target's top 5 after each node, and per tried
    node its p and its chance of being kept (p of what was left after the elder siblings)."""
    import dataclasses

    n = len(st.tokens)
    p_target = [None, 0.7, 0.6, 0.1, 0.2, 0.05, None, None]
    p_accept = [None, 0.7, 0.6, 0.1, None, None, None, None]
    return dataclasses.replace(st, p_target=p_target[:n], p_accept=p_accept[:n],
                               target_topk_ids=[[11, 14, 15, 3, 4]] * n,
                               target_topk_probs=[[0.7, 0.2, 0.05, 0.03, 0.02]] * n)


def run_steps(n: int = 5) -> list[StepTrace]:
    return [make_step(i) for i in range(n)]


RAW_BAD = ["<script", "<b>bold", "<img", "\x07", "\x1b", "\u202e"]


def hostile_steps() -> list[StepTrace]:
    steps = []
    for i in range(3):
        st = make_step(i, texts=[HOSTILE[(i + k) % len(HOSTILE)] for k in range(8)])
        st.bonus_text = "<img src=x onerror=alert(1)>"
        steps.append(st)
    return steps


def parse(html_text: str) -> TagCollector:
    parser = TagCollector()
    parser.feed(html_text)
    parser.close()
    return parser


class TagCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()
        self.titles: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        for key, value in attrs:
            self.attrs.add(key)
            if key == "title":
                self.titles.append(value or "")
