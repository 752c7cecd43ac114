#!/usr/bin/env bash
# H200: the fit tier's remaining evidence, in device calls of at most ~9 minutes. Usage (in the device call):
#   BENCH_GIT_REVISION=<sha> bash scripts/device/h200_fits.sh STEP...
# STEP is one of
#   tests     pytest -m cuda (every CUDA test, the fit tier's included) -> $OUT/cuda-tests.log
#   control   A/A control: baseline against itself, YOLO26n 640 px b4 bf16, 128 steps, 2 warm-ups, 3 pairs, ±1%
#             (the 2026-11-29 run predates --bar for controls and ran without it)
#   upstream  candidate against upstream 8.4.190 MuSGD, the claim's settings (384 steps), 2 warm-ups, 3 pairs
#   stages    the --stages diagnostic for upstream and candidate (384 steps, 1 pair): what bounds the upstream claim
# A fit step starts its run under runs/<step>/, or resumes the one there (carry `runs` back between calls when
# the machine went cold). All steps share one deadline, DEADLINE seconds (default 560) from the start; the
# run folders come back in $OUT/runs.tgz (checkpoints and the dataset cache left out).
. scripts/h200_env.sh || exit 1
end=$(( $(date +%s) + ${DEADLINE:-560} ))
left() { echo $(( end - $(date +%s) )); }
claim=(--workload ultralytics --device cuda --images 256 --imgsz 640 --batch 4 --amp bf16 --quiet)

fit() {  # fit NAME START-OPTIONS...: start runs/NAME's run, or resume it, stopping before the deadline
  local name=$1; shift
  local budget; budget=$(left)
  if [ "$budget" -lt 60 ]; then echo "$name: ${budget} s left, not started"; return; fi
  local run; run=$(ls -d runs/"$name"/pair-* 2>/dev/null | tail -1)
  if [ -z "$run" ]; then
    python3 -m harness.cli pair "${claim[@]}" "$@" --out runs/"$name" --stop-after "$budget"
  else
    python3 -m harness.cli pair --resume "$run" --quiet --stop-after "$budget"
  fi
  echo "$name rc=$?"
}

for step in "$@"; do
  case $step in
    tests) set -o pipefail; python3 -m pytest -q -m cuda -rs 2>&1 | tee "$OUT/cuda-tests.log"; echo "tests rc=$?" ;;
    control) fit control --arms baseline --control --bar 1 --steps 128 --warmup 2 --pairs 3 ;;
    upstream) fit upstream --arms upstream,candidate --steps 384 --warmup 2 --pairs 3 --bar 20 ;;
    stages) fit stages --arms upstream,candidate --steps 384 --stages --warmup 0 --pairs 1 ;;
    *) echo "unknown step $step (tests, control, upstream, stages)"; exit 2 ;;
  esac
done
tar czf "$OUT/runs.tgz" --exclude='*.pt' --exclude='datasets' runs
