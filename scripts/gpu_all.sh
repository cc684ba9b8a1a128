#!/usr/bin/env bash
# One device call, the proof of the GPU's defaults first, within BUDGET seconds (default 540):
#   1. every lossless configuration with drafts accepted (MAT floor) on the default path (CUDA
#      graphs, fold off) and the other paths (fold on, dynamic, static, the tree grown on the
#      device): talon/gpucheck/check.py --checks lossless,steps;
#   2. the check's teeth on this GPU: a tree mask bug, then a position bug, planted; every path of
#      step 1 must fail in a configuration whose tree can express it (the report names each path);
#   3. Talon's step measured with real acceptance: the shape replay on six lesson atlases, beside
#      generate() and the prediction on this GPU's curves (python -m talon.gpucheck.shape);
#   4. the grouped-query fold timed on and off (two minutes at most);
#   5. the speed probe (curves, loop timings) with what time is left.
# The compiled step is not in it (its buckets compile for minutes): `python -m experiments.gpu_compile` times it.
# With a head preset (HEAD, default llama-3.1-8b-eagle3; "" for none), after step 1 its head is trained on
# the device on its random target's text and checked lossless on every path, its forward timed, and the
# planted bugs of step 2 run on both pairs. With an MTP preset (MTP, default glm-4.7-flash-mtp; "" for none),
# its target's own classes at its widths (4 layers), its MTP layer trained on the device, checked the same way.
#   bash .gpu/run.sh bash scripts/gpu_all.sh OUT_DIR [BUDGET] [PAIR] [HEAD] [MTP]
set -u
out=${1:?out dir}; budget=${2:-540}; pair=${3:-qwen2.5-7b}; head=${4-llama-3.1-8b-eagle3}; mtp=${5-glm-4.7-flash-mtp}
mkdir -p "$out/costs"
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
took() { echo "$1: rc=$2 at $(( $(date +%s) - start )) s"; }

python3 -m talon.gpucheck --pairs "$pair" --checks lossless,steps --stream "$out/check.jsonl" \
  --out "$out/check.json" --deadline-s $(( budget / 2 )) > "$out/check.log" 2>&1
took "lossless,steps" $?; tail -n 12 "$out/check.log"
python3 -c "
import json, sys
for line in open(sys.argv[1]):
    c = json.loads(line); d = c['detail']
    print(c['name'][:40], '| ok', c['ok'], '| step', d.get('step', d.get('steps')), '| MAT', d.get('mat'), '| below floor', d.get('below_floor'), '| no draft accepted', d.get('unread'))
" "$out/check.jsonl"

cap() { local l; l=$(left); echo $(( l > $1 ? $1 : l )); }  # seconds for the next step: at most $1
if [ -n "$head" ] && [ "$(left)" -gt 150 ]; then  # the head preset: trained here, lossless on every path, timed
  timeout "$(cap 180)" python3 -m talon.gpucheck --pairs "$head" --checks lossless,steps,head \
    --stream "$out/head.jsonl" --out "$out/head.json" > "$out/head.log" 2>&1
  took "head preset $head" $?; grep -E "^\| $head" "$out/head.log"
fi
if [ -n "$mtp" ] && [ "$(left)" -gt 150 ]; then  # the MTP preset: its layer trained here, lossless on every path
  timeout "$(cap 180)" python3 -m talon.gpucheck --pairs "$mtp" --checks lossless,steps,sampling \
    --stream "$out/mtp.jsonl" --out "$out/mtp.json" > "$out/mtp.log" 2>&1
  took "MTP preset $mtp" $?; grep -E "^\| $mtp" "$out/mtp.log"
fi
for p in $pair $head $mtp; do  # one pair a call: each takes two to three minutes, both at once outran the cap
  for bug in mask position; do
    if [ "$(left)" -gt 120 ]; then
      timeout "$(cap 180)" python3 -m talon.gpucheck --pairs "$p" --checks lossless,steps \
        --plant "$bug" --out "$out/plant-$bug-$p.json" > "$out/plant-$bug-$p.log" 2>&1
      took "planted $bug bug on $p (rc 0 = caught on every path)" $?; grep -E "^(PLANTED|  )" "$out/plant-$bug-$p.log"
    fi
  done
done

if [ "$(left)" -gt 90 ]; then  # Talon's step with real acceptance: the shape replay on the lesson atlases
  timeout "$(cap 150)" python3 -m talon.gpucheck.shape --pair "$pair" --limit 6 --tokens 64 --out "$out/shape.json" \
    > "$out/shape.log" 2>&1
  took "shape replay" $?; tail -n 7 "$out/shape.log"
fi
if [ -n "$head" ] && [ "$(left)" -gt 90 ]; then  # the head's step with its own acceptance: head atlases, replayed
  timeout "$(cap 120)" python3 -m talon.gpucheck.shape --pair "$head" --tokens 64 --out "$out/shape-head.json" \
    > "$out/shape-head.log" 2>&1
  took "shape replay, $head" $?; tail -n 6 "$out/shape-head.log"
fi
if [ "$(left)" -gt 60 ]; then
  timeout "$(cap 120)" python3 -m experiments.gqa_fold --pair "$pair" --sizes 1,8,64,256 --out "$out/fold.json" \
    > "$out/fold.log" 2>&1
  took fold $?; grep -E "^(target|draft) " "$out/fold.log"
fi
if [ "$(left)" -gt 30 ]; then
  timeout "$(left)" python3 -m talon.gpucheck.speed --pair "$pair" --out-dir "$out/costs" > "$out/speed.log" 2>&1
  took speed $?; tail -n 25 "$out/speed.log"
fi
