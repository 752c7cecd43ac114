#!/usr/bin/env bash
# H200 batch 2: the CUDA test suite again (after the budget fix), the probes and the full crossover screen.
. scripts/h200_env.sh || exit 1
timeout 120 python3 -m pytest -q -m cuda -rs -p no:cacheprovider 2>&1 | tee "$OUT/cuda_tests.log" | tail -8
P="--arms baseline,candidate --device cuda --out $RUNS --quiet"
timeout 90 python3 -m harness.cli probe --head lm --variants native,chunked --budget 24GiB --warmup 2 --pairs 10 --learner-ms 288.6 $P > "$OUT/probe_lm24.log" 2>&1; echo "probe lm 24GiB rc=$?"
timeout 60 python3 -m harness.cli probe --head lm --variants native,chunked --budget 6GiB --warmup 1 --pairs 5 --learner-ms 288.6 $P > "$OUT/probe_lm6.log" 2>&1; echo "probe lm 6GiB rc=$?"
timeout 90 python3 -m harness.cli probe --head detect --scale n,x --budget 24GiB --warmup 2 --pairs 10 $P > "$OUT/probe_detect.log" 2>&1; echo "probe detect rc=$?"
tail -5 "$OUT"/probe_*.log
timeout 300 python3 -m harness.cli screen --scales n,s,m,l,x --guards 0,256,512,none --arms baseline,candidate,upstream \
  --steps 10 --repeats 5 --warmup 2 --warmup-trials 1 --floor-replays 20 --dtype float32 --device cuda --seed 0 \
  --out "$RUNS" --quiet > "$OUT/screen.log" 2>&1; echo "screen rc=$?"
tail -45 "$OUT/screen.log"
tar czf "$OUT/runs.tgz" -C "$OUT" runs && rm -rf "$RUNS"
