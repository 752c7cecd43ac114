#!/usr/bin/env bash
# H200, 2026-12-01: the candidate at its launch floor (CUDA tests, parity, screen) and the noise study of quiet
# fits (a placed sequential A/A and a duet A/A at the claim's settings). Usage, in a device call:
#   BENCH_GIT_REVISION=<sha> DEADLINE=<s> bash scripts/device/h200_quiet.sh STEP...
# STEP is one of
#   tests    pytest -m cuda: every CUDA test (the candidate's graph replay and distributed tests included)
#   parity   bench parity on YOLO26n (60 steps) and YOLO26x (5 steps): one step judged, the rest reported
#   screen   bench screen n..x: baseline, candidate at guards 256 and none, upstream 8.4.190; 3 pairs
#   quiet    A/A of the candidate at the claim's settings (real trainer, YOLO26n, 640 px, b4, bf16, 384 steps),
#            placed (--cpus auto), sequential, 1 warm-up, 4 pairs
#   duet     the same A/A as duet pairs (--order duet --cpus auto): both fits at once on halves of the cores
# Fit steps start runs/<step>/ or resume the run there; all steps share one DEADLINE (default 560 s); run
# folders come back in $OUT/runs.tgz (checkpoints and the dataset cache left out), logs as $OUT/*.log.
. scripts/h200_env.sh || exit 1
end=$(( $(date +%s) + ${DEADLINE:-560} ))
left() { echo $(( end - $(date +%s) )); }
claim=(--workload ultralytics --device cuda --images 256 --imgsz 640 --batch 4 --amp bf16 --steps 384 --quiet)

fit() {  # fit NAME START-OPTIONS...: start runs/NAME's run, or resume it, stopping before the deadline
  local name=$1; shift
  local budget; budget=$(left)
  if [ "$budget" -lt 90 ]; then echo "$name: ${budget} s left, not started"; return; fi
  local run; run=$(ls -d runs/"$name"/pair-* 2>/dev/null | tail -1)
  if [ -z "$run" ]; then
    python3 -m harness.cli pair "${claim[@]}" "$@" --out runs/"$name" --stop-after "$budget" > "$OUT/$name.log" 2>&1
  else
    python3 -m harness.cli pair --resume "$run" --quiet --stop-after "$budget" >> "$OUT/$name.log" 2>&1
  fi
  echo "$name rc=$?"; tail -4 "$OUT/$name.log"
}

for step in "$@"; do
  case $step in
    tests) timeout $(( $(left) - 20 )) python3 -m pytest -q -m cuda -rs -p no:cacheprovider > "$OUT/cuda-tests.log" 2>&1
           echo "tests rc=$?"; tail -6 "$OUT/cuda-tests.log" ;;
    parity) python3 -m harness.cli parity --device cuda --steps 60 --out runs/parity --quiet > "$OUT/parity.log" 2>&1
            echo "parity n rc=$?"
            python3 -m harness.cli parity --device cuda --scale x --steps 5 --out runs/parity --quiet >> "$OUT/parity.log" 2>&1
            echo "parity x rc=$?"; grep -E "One-step contract" "$OUT/parity.log" ;;
    screen) timeout $(( $(left) - 10 )) python3 -m harness.cli screen --scales n,s,m,l,x --guards 256,none \
              --arms baseline,candidate,upstream --steps 10 --warmup-steps 2 --warmup 2 --pairs 3 --device cuda \
              --out runs/screen --quiet > "$OUT/screen.log" 2>&1
            echo "screen rc=$?"; grep -A 40 "Targets, checked" runs/screen/*/report.md | head -45 ;;
    quiet) fit quiet --arms candidate --control --bar 1 --cpus auto --warmup 1 --pairs 4 ;;
    duet) fit duet --arms candidate --control --bar 1 --cpus auto --order duet --warmup 1 --pairs 5 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
tar czf "$OUT/runs.tgz" --exclude='*.pt' --exclude='datasets' --exclude='weights' runs
