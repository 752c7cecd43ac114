# Source on the H200 (device tool) before any bench command: the carried wheels (ultralytics 8.4.190,
# ultralytics-thop, ultralytics-platform, cloudpickle; --no-deps, everything else is on the image; fetched into
# .whl/ by scripts/device/h200_wheels.sh on the calling machine), offline settings, and
# a writable Ultralytics config folder with a font so nothing is downloaded.
# Call it as: BENCH_GIT_REVISION=<sha> BENCH_GIT_DIRTY=0|1 bash scripts/... (the copied tree has no .git, or the
# stale .git of the session's start, so env.json records the revision given here; without it, git's or null).
if ! compgen -G '.whl/*.whl' > /dev/null; then
  echo 'h200_env.sh: no wheels in .whl/ (ignored by git, so a new checkout lacks them): run `bash scripts/device/h200_wheels.sh` on the machine that calls the device, then carry .whl' >&2
  return 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 YOLO_OFFLINE=1 YOLO_CONFIG_DIR=/tmp/yolo-cfg
mkdir -p /tmp/yolo-cfg/Ultralytics
cp "$(python3 -c 'import matplotlib, pathlib; print(pathlib.Path(matplotlib.__file__).parent / "mpl-data/fonts/ttf/DejaVuSans.ttf")')" /tmp/yolo-cfg/Ultralytics/Arial.ttf
RUNS="$OUT/runs"; mkdir -p "$RUNS"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, typer, pandas, ultralytics; print('torch', torch.__version__, 'typer', typer.__version__, 'pandas', pandas.__version__, 'ultralytics', ultralytics.__version__)"
. scripts/device/h200_pack.sh
