#!/usr/bin/env bash
# H200: the candidate with concurrent Newton-Schulz lanes (optimizers/concurrent.py), issue 44.
# Usage, in a device call (carry .whl):
#   BENCH_GIT_REVISION=<sha> DEADLINE=<s> bash scripts/device/h200_concurrent.sh STEP...
# STEP is one of
#   prices   scripts/device/h200_pad_price.py over lanes 1,4,8,16 and padding prices 0,1e9,3e9,1e10 at n..x (2 rounds):
#            the step and its CUDA-graph floor per scale, lanes and price (printed; the log comes back)
#   tests    pytest -m cuda: every CUDA test
#   parity   bench parity --steps 60 on YOLO26n and YOLO26x
#   screen   bench screen n..x: baseline, candidate (guard 256), upstream 8.4.190; 3 pairs
# Run folders land under reports/h200-concurrent/<step>/; they come back in $OUT/concurrent.tgz, the logs in
# $OUT/logs.tgz (scripts/device/h200_pack.sh), packed after every step.
. scripts/h200_env.sh || exit 1
end=$(( $(date +%s) + ${DEADLINE:-560} ))
left() { echo $(( end - $(date +%s) )); }
HOME_DIR=reports/h200-concurrent
mkdir -p "$HOME_DIR"
for step in "$@"; do
  case $step in
    prices) timeout $(( $(left) - 10 )) python3 scripts/device/h200_pad_price.py --lanes 1,4,8,16 --prices 0,1e9,3e9,1e10 \
              --rounds 2 > "$LOGS/prices.log" 2>&1
            echo "prices rc=$?"; tail -82 "$LOGS/prices.log" ;;
    tests) timeout $(( $(left) - 10 )) python3 -m pytest -q -m cuda -rs -p no:cacheprovider > "$LOGS/cuda-tests.log" 2>&1
           echo "tests rc=$?"; tail -8 "$LOGS/cuda-tests.log" ;;
    parity) timeout $(( $(left) - 10 )) python3 -m harness.cli parity --device cuda --steps 60 --out "$HOME_DIR/parity" --quiet > "$LOGS/parity.log" 2>&1
            echo "parity n rc=$?"
            timeout $(( $(left) - 10 )) python3 -m harness.cli parity --device cuda --scale x --steps 60 --out "$HOME_DIR/parity" --quiet >> "$LOGS/parity.log" 2>&1
            echo "parity x rc=$?"; grep -E "One-step contract" "$LOGS/parity.log" ;;
    screen) timeout $(( $(left) - 10 )) python3 -m harness.cli screen --scales n,s,m,l,x --guards 256 \
              --arms baseline,candidate,upstream --steps 10 --warmup-steps 2 --warmup 2 --pairs 3 --device cuda \
              --out "$HOME_DIR/screen" --quiet > "$LOGS/screen.log" 2>&1
            echo "screen rc=$?"
            grep -A 30 "Targets, checked" "$(ls -d "$HOME_DIR"/screen/*/ | tail -1)report.md" | head -32 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  pack concurrent "$HOME_DIR"
done
