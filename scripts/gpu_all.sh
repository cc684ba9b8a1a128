#!/usr/bin/env bash
# One device call: the speed probe (curves, loop timings), then the check with what time is left.
#   bash .gpu/run.sh bash scripts/gpu_all.sh OUT_DIR CHECK_SECONDS [PAIR]
set -u
out=${1:?out dir}; check_s=${2:-300}; pair=${3:-qwen2.5-7b}
mkdir -p "$out/costs"
start=$(date +%s)
python3 scripts/gpu_speed.py --pair "$pair" --out-dir "$out/costs" > "$out/speed.log" 2>&1
echo "speed: rc=$? in $(( $(date +%s) - start )) s"; tail -n 25 "$out/speed.log"
python3 scripts/gpu_check.py --pairs "$pair" --stream "$out/check.jsonl" --out "$out/check.json" \
  --deadline-s "$check_s" > "$out/check.log" 2>&1
echo "check: rc=$? in $(( $(date +%s) - start )) s"; tail -n 30 "$out/check.log"
