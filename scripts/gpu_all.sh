#!/usr/bin/env bash
# One device call: the attention fold's timing (two minutes at most), the speed probe (curves,
# loop timings), then the check with what time is left.
#   bash .gpu/run.sh bash scripts/gpu_all.sh OUT_DIR CHECK_SECONDS [PAIR]
set -u
out=${1:?out dir}; check_s=${2:-300}; pair=${3:-qwen2.5-7b}
mkdir -p "$out/costs"
start=$(date +%s)
timeout 120 python3 scripts/gqa_fold.py --pair "$pair" --sizes 1,8,64,256 --out "$out/fold.json" > "$out/fold.log" 2>&1
echo "fold: rc=$? in $(( $(date +%s) - start )) s"; grep -E "^(target|draft) " "$out/fold.log"
python3 scripts/gpu_speed.py --pair "$pair" --out-dir "$out/costs" > "$out/speed.log" 2>&1
echo "speed: rc=$? in $(( $(date +%s) - start )) s"; tail -n 25 "$out/speed.log"
python3 scripts/gpu_check.py --pairs "$pair" --stream "$out/check.jsonl" --out "$out/check.json" \
  --deadline-s "$check_s" > "$out/check.log" 2>&1
echo "check: rc=$? in $(( $(date +%s) - start )) s"; tail -n 30 "$out/check.log"
