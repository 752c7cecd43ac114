#!/usr/bin/env bash
# Fills .whl/ with the wheels the device machines install (scripts/h200_env.sh, --no-deps: everything else is
# on their image): Ultralytics 8.4.190, the two packages of its own that the image lacks, and cloudpickle for
# Ultralytics' DDP launch (the ×2 claim). Run it here, on the machine that calls the device, before the first
# call of a new checkout (.whl/ is ignored by git), then pass carry [".whl"]. Pinned: the versions every
# committed H200 run used.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip download -q --no-deps --only-binary :all: -d .whl \
  ultralytics==8.4.190 ultralytics-thop==2.2.3 ultralytics-platform==0.1.99 cloudpickle==3.1.3
ls .whl
