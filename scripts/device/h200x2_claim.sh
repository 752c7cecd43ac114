#!/usr/bin/env bash
# H200 ×2: the multi-GPU claim (CUDA tests on two GPUs, parity --gpus 2, screen --gpus 2, the 2-GPU pair runs).
# Usage, in a device call on nvidia-h200-x2 (NVLink multicast stays off: the ranks get NCCL_NVLS_ENABLE=0 and
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1 from the harness, and they are exported here for the tests too):
#   BENCH_GIT_REVISION=<sha> DEADLINE=<s> bash scripts/device/h200x2_claim.sh STEP...
# .whl/ must hold the cloudpickle (>= 3.1.1) wheel beside the ultralytics ones (Ultralytics' DDP launch needs it):
# scripts/device/h200_wheels.sh fetches them all.
# STEP is one of
#   tests    pytest -m cuda (every CUDA test; the two-GPU ones in tests/experiments/fit/test_ddp.py run only here), then
#            tests/experiments/fit/test_ddp.py and tests/optimizers/test_distributed.py whole on this machine
#   parity   bench parity --gpus 2 on YOLO26n: one step judged, 20 reported (and x, 5 steps)
#   screen   bench screen --gpus 2 at n and x: baseline, candidate (guard 256), upstream 8.4.190; 3 pairs
#   screen1  the same screen on one GPU (the candidate's one-GPU step, for the 2-GPU target at x)
#   pair     the claim: real trainer, YOLO26n, 640 px, global batch 8 (4 per GPU), bf16, 384 steps, --gpus 2,
#            upstream 8.4.190 against the candidate with its A/A control in the same schedule (as the one-GPU
#            decisive claim: --control, ±1%), bar 8, 1 warm-up, pairs by the precision rule (at least 6, looks
#            to 14: fewer can never keep 95% on the reference skewed law)
#   stages   the same fits once with --stages (diagnostic): where a 2-GPU fit's time goes
# Fit steps start runs/<step>/ or resume the run there (each run slices itself with --stop-after); all steps
# share one DEADLINE (default 560 s); the run folders this call changed come back in $OUT/runs.tgz and the logs
# in $OUT/logs.tgz, packed after every step (scripts/device/h200_pack.sh). Carry runs/ and run the same command again
# to continue.
. scripts/h200_env.sh || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 -c "import cloudpickle; print('cloudpickle', cloudpickle.__version__)" || exit 1
end=$(( $(date +%s) + ${DEADLINE:-560} ))
left() { echo $(( end - $(date +%s) )); }
claim=(--workload ultralytics --device cuda --gpus 2 --images 256 --imgsz 640 --batch 8 --amp bf16 --steps 384 --quiet)

resumable() {  # resumable NAME TIER START-ARGS...: start runs/NAME's run of TIER, or resume it, before the deadline
  local name=$1 tier=$2; shift 2
  local budget; budget=$(left)
  if [ "$budget" -lt 90 ]; then echo "$name: ${budget} s left, not started"; return; fi
  local run; run=$(ls -d runs/"$name"/"$tier"-* runs/"$name"/stages-* 2>/dev/null | tail -1)
  if [ -z "$run" ]; then
    python3 -m harness.cli "$tier" "$@" --out runs/"$name" --stop-after "$budget" > "$LOGS/$name.log" 2>&1
  else
    python3 -m harness.cli "$tier" --resume "$run" --quiet --stop-after "$budget" >> "$LOGS/$name.log" 2>&1
  fi
  echo "$name rc=$?"; tail -4 "$LOGS/$name.log"
}

for step in "$@"; do
  case $step in
    tests) timeout $(( $(left) - 20 )) python3 -m pytest -q -m cuda -rs -p no:cacheprovider > "$LOGS/cuda-tests.log" 2>&1
           echo "cuda tests rc=$?"; tail -6 "$LOGS/cuda-tests.log"
           timeout $(( $(left) - 10 )) python3 -m pytest -q -rs -p no:cacheprovider tests/experiments/fit/test_ddp.py tests/optimizers/test_distributed.py \
             > "$LOGS/ddp-tests.log" 2>&1
           echo "ddp tests rc=$?"; tail -6 "$LOGS/ddp-tests.log" ;;
    parity) timeout $(( $(left) - 10 )) python3 -m harness.cli parity --device cuda --gpus 2 --steps 20 --out runs/parity --quiet > "$LOGS/parity.log" 2>&1
            echo "parity n rc=$?"
            timeout $(( $(left) - 10 )) python3 -m harness.cli parity --device cuda --gpus 2 --scale x --steps 5 --out runs/parity --quiet >> "$LOGS/parity.log" 2>&1
            echo "parity x rc=$?"; grep -E "One-step contract|agree" "$LOGS/parity.log" runs/parity/*/report.md | head -8 ;;
    screen) resumable screen screen --scales n,x --guards 256 --arms baseline,candidate,upstream --steps 10 \
              --warmup-steps 2 --warmup 2 --pairs 3 --device cuda --gpus 2 --quiet
            grep -A 8 "Under a process group" runs/screen/*/report.md | head -12 ;;
    screen1) resumable screen1 screen --scales n,x --guards 256 --arms baseline,candidate,upstream --steps 10 \
               --warmup-steps 2 --warmup 2 --pairs 3 --device cuda --quiet ;;
    pair) resumable pair pair "${claim[@]}" --arms upstream,candidate --bar 8 --control --tolerance 1 \
            --pairs auto --precision 2 --max-pairs 14 --warmup 1 ;;
    stages) resumable stages pair "${claim[@]}" --arms upstream,candidate --stages --warmup 0 --pairs 1 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  # After every step, so a call that runs past its limit still brings back the folders of the steps it finished.
  mkdir -p runs && pack runs runs
done
