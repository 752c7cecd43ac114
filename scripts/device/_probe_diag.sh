. scripts/h200_env.sh >/dev/null 2>&1 || exit 1
for arms in baseline,candidate baseline; do
python3 -m harness.cli probe --head lm --tokens 32768 --vocab 8192 --dim 256 --chunk 1024 --device cuda --budget 1GiB --reserve 256MiB --warmup 1 --pairs 2 --arms $arms $( [ $arms = baseline ] && echo --control ) --out /tmp/diag-$arms --quiet > $OUT/diag-$arms.log 2>&1
python3 - $arms <<'PY'
import pandas as pd, glob, sys
f = glob.glob(f"/tmp/diag-{sys.argv[1]}/*/trials.csv")[0]
t = pd.read_csv(f)
cols = [c for c in t.columns if c.startswith("oom_")]
print(t[["case","phase","arm","status"] + cols].to_string())
for m in t["message"].dropna().unique(): print("MSG", m[:400])
PY
done
