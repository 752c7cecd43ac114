#!/usr/bin/env bash
# H200: the paired-fit claim (YOLO26n, 640 px, batch 4, bf16 AMP, 256 synthetic images, 384 steps), run in
# commands of at most ~9 minutes: the first call starts it, later calls resume it (bash scripts/device/h200_pair.sh resume).
. scripts/h200_env.sh || exit 1
if [ "${1:-start}" = start ]; then
  python3 -m harness.cli pair --workload ultralytics --device cuda --steps 384 --images 256 --imgsz 640 --batch 4 \
    --amp bf16 --warmup 2 --pairs 3 --bar 60 --out runs --quiet --stop-after 530
else
  python3 -m harness.cli pair --resume "$(ls -d runs/pair-* | tail -1)" --quiet --stop-after 530
fi
echo "pair rc=$?"
tar czf "$OUT/pair.tgz" --exclude='*.pt' --exclude='datasets' runs
