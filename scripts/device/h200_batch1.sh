#!/usr/bin/env bash
# H200 batch 1: the CUDA test suite, parity (synthetic 60 steps, and the fit workload), and the probes.
. scripts/h200_env.sh || exit 1
timeout 200 python3 -m pytest -q -m cuda -rs -p no:cacheprovider 2>&1 | tee "$OUT/cuda_tests.log" | tail -25
timeout 100 python3 -m harness.cli parity --device cuda --steps 60 --out "$RUNS" > "$OUT/parity.log" 2>&1; echo "parity rc=$?"
timeout 60 python3 -m harness.cli parity --device cuda --fit --steps 20 --out "$RUNS" > "$OUT/parity_fit.log" 2>&1; echo "parity fit rc=$?"
grep -E "contract|^\| (control|candidate) " "$OUT/parity.log" "$OUT/parity_fit.log"
P="--arms baseline,candidate --device cuda --out $RUNS --quiet"
timeout 90 python3 -m harness.cli probe --head lm --variants native,chunked --budget 24GiB --warmup 2 --pairs 10 --learner-ms 288.6 $P | tail -12
timeout 60 python3 -m harness.cli probe --head lm --variants native,chunked --budget 6GiB --warmup 1 --pairs 5 --learner-ms 288.6 $P | tail -12
timeout 90 python3 -m harness.cli probe --head detect --scale n,x --budget 24GiB --warmup 2 --pairs 10 $P | tail -12
tar czf "$OUT/runs.tgz" -C "$OUT" runs && rm -rf "$RUNS"
