"""The words on the page: the header, the text legend and each figure's explanation (Markdown),
kept apart from the components that show them; every glossary term is defined at its first use
in each text, and each explanation shows about 40 words with the rest behind a "more" fold
(``talon.figures.glossary``)."""

from talon.figures.glossary import define, fold

_HEADER = """
<div class="talon-header">
  <h1>Talon <span>tree speculative decoding, one step at a time</span></h1>
  <p>A small <b>drafter</b> proposes a <b>tree</b> of possible next tokens; the big <b>target</b>
  model checks the whole tree in one forward pass and keeps the longest path it agrees with, plus
  one token of its own (the <b>bonus</b>).</p>
  <details class="talon-fold"><summary>more</summary>The drafter is a draft model, retrieval from
  the text so far, or both. The output is what the target alone would write; it comes faster when
  the target agrees with enough of the drafts to pay for them, and the summary says by how
  much.</details>
  <details class="talon-fold"><summary>exactly the same text?</summary>With greedy decoding, token
  for token in float32; in bfloat16 up to rounding ties (where the two best logits are closer than
  bf16 can tell apart, forwards of different shapes may pick differently). With sampling, every
  token is drawn from exactly the target's distribution.</details>
</div>
"""

HEADER = define(_HEADER)

TEXT_LEGEND = """
<div class="talon-legend">
  <span class="tk src-model">draft model</span>
  <span class="tk src-retrieval">retrieval</span>
  <span class="tk src-both">model + retrieval</span>
  <span class="tk src-bonus">target's bonus token</span>
  <span class="tk src-resampled">target's token after a rejection</span>
  <span class="legend-note">│ separates steps · hover a token for its step and probabilities ·
  ←/→ keys step through</span>
</div>
"""

_EXPLAIN: dict[str, str] = {
    "tree": (
        "**Draft tree.** Left to right = tokens ahead of the text. Colour: who drafted the token "
        "(blue model, indigo the target's MTP layer, orange retrieval, purple both). **Bold ring**: accepted by "
        "the target. "
        "**Faded**: rejected, or never reached because an ancestor was rejected. **⊗**: gated out, "
        "too unsure to expand. **★**: the bonus token the target adds after a fully accepted path; "
        "**◆**: the token it puts in place of a rejected draft (resampled). Hover a node for q "
        "(drafter probability), c (path confidence), its position id and the target's top 5; the "
        "**Node inspector** below holds the full table."
    ),
    "gates": (
        "**Confidence gates.** Each dot is a candidate of one layer; height = its path confidence "
        "c (product of q along the path, log scale). Dashed line: the layer's threshold μ × max. "
        "Above it the node proposes children; below it is gated out. A larger μ gates more out; whether the "
        "tree then grows deeper or stops sooner depends on the prompt (the Lessons tab's exercises replay it)."
    ),
    "cost": (
        "**Cost model.** Left: what verification (green, by tree nodes) and one draft layer (blue, "
        "by frontier width) cost on this machine, measured at first use and refined by every "
        "step; dots are this run's steps. Right: for the chosen step, the expected tokens per "
        "second had the tree been cut to its best n nodes; ◆ is what was verified, ★ where it "
        "peaks. On a CPU the peak comes early; on a GPU the curve stays flat and trees grow."
    ),
    "lessons": (
        "**What the papers claim, on real prompts.** This app rests on two 2026 papers, both named Talon. The "
        "adaptive-tree paper (TALON, arXiv 2601.07353) says a budget-driven, confidence-gated tree beats a tree "
        "of fixed depth, because the best depth changes from prompt to prompt; the hybrid-drafting paper "
        "(Talon, AAAI 2026) says drafting from retrieval and from a draft model together wins, because each is "
        "strong where the other is weak. Both are replayed here, exactly and with no model, on atlases of a "
        "few Spec-Bench prompts recorded on the embedded pair: pick a prompt and a budget."
    ),
    "serve": (
        "**Run it in a server.** The controls on the left as the nearest SGLang launch flags, "
        "vLLM `--speculative-config` and `llama-server` flags, checked against the engines' source at the "
        "versions named. "
        "What has no equivalent there (the adaptive gate, the hybrid graft of retrieval into the "
        "model's tree, async pre-drafting, cost-aware planning) is listed plainly. vLLM and SGLang "
        "report acceptance as *mean acceptance length* and *per-position acceptance rate*: Talon's "
        "traces and benchmark results carry the same numbers (`serving_metrics`). With a draft atlas "
        "of the prompt (Threshold explorer), the tab also replays each serving engine's *own* drafting "
        "on it: the acceptance the exported flags will get there, and each one's best settings."
    ),
    "inspector": (
        "**Node inspector.** For the chosen node: the target's top 5 at its place (the drafted "
        "token marked), the verdict, its position id and, under sampling, the acceptance "
        "probability; for an accepted node, what the target would write next. **Near-tie**: two "
        "tokens closer than a bf16 rounding step, where bf16 and float32 runs can part ways."
    ),
    "mask": (
        "**Tree attention mask.** The target checks every node in one forward. Row i shows what "
        "token i may attend to: itself and its ancestors (and all committed text, not drawn), so "
        "each branch sees only its own path. Dark row: the accepted path. Each row is labelled "
        "node:token @position id: a node's position is the text length plus its depth, so "
        "siblings share one (they are alternatives for the same place); only the mask tells them apart."
    ),
    "timeline": (
        "**Timeline.** When the drafter and the target (verifier) are busy, in ms. Synchronous "
        "decoding takes turns; with *async* on, the drafter pre-drafts the next tree while the "
        "target verifies, so the bars overlap."
    ),
    "per_step": (
        "**Tokens per step.** Each bar is one target forward: the accepted drafts by source plus the "
        "bonus token. The line is the running mean, MAT; plain decoding has MAT = 1."
    ),
    "by_depth": (
        "**Acceptance by depth.** Of the steps whose tree reached depth d, how many had their accepted "
        "path reach d. It falls with depth: every extra token must match too."
    ),
    "sources": "**Sources.** Which drafter produced the committed tokens; the bonus token is the target's own.",
    "speed": "**Tokens per second.** Per step (bars) and overall (line). Compare with autoregressive in the summary.",
    "compare": (
        "**Compare.** Runs configuration A (the controls on the left) and B (A with the changes "
        "below) on the same prompt, one after the other. Greedy decoding writes the same text in "
        "both; what differs is how many target forwards it takes."
    ),
    "explorer": (
        "**Threshold explorer.** *Record an atlas* of the prompt on the left: the models run once (a "
        "greedy run, then the draft's proposals around its text). From then on every knob below "
        "replays any greedy configuration exactly, with no model, in milliseconds: MAT is what a run "
        "would accept, tokens/s and step time are predicted by the atlas's cost model of this "
        "hardware. The heatmaps vary two knobs around the others (□ the knobs, ★ the best by "
        "predicted tokens/s; * marks a cell that asked for more drafts than the atlas holds), the "
        "Pareto chart weighs MAT against step time, and **Apply** sets the controls on the left."
    ),
    "real_sweep": (
        "Short real runs of the current prompt for each gate μ and budget N (other knobs from the "
        "left; slow: one run per cell), or the `results.json` of `python -m talon.bench --sweep`. "
        "MAT rewards big trees; tokens/s shows what they cost."
    ),
}
EXPLAIN: dict[str, str] = {key: define(fold(text)) for key, text in _EXPLAIN.items()}
