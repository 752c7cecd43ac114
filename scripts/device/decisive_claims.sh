#!/usr/bin/env bash
# The decisive side-by-side report of one series, on any machine (no GPU needed: a report reads run folders).
# Usage: bash scripts/device/decisive_claims.sh SERIES   (e.g. d; DECISIVE_HOME=... for another tree, PYTHON=... for
# another interpreter)
# Picks, under reports/h200-decisive/, the newest run folder of each: the two claims of the series
# (upstream-SERIES, baseline-SERIES), each stages pair, the screen, parity at YOLO26n and YOLO26x (the two
# newest parity folders) and the three probes; then writes claims.md there from them. A claim not yet started
# is left out with a note (the report is then provisional: its runs table shows which claims it holds); every
# other kind must have a folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
series=${1:-}
if [ $# -ne 1 ] || [ -z "$series" ]; then
  echo "decisive_claims.sh: which series? usage: decisive_claims.sh SERIES (a letter, e.g. d)" >&2; exit 2
fi
home=${DECISIVE_HOME:-reports/h200-decisive}
newest() { { ls -d "$home/$1"/*-2* 2>/dev/null || true; } | tail -"${2:-1}"; }
folders=()
for kind in "upstream-$series" "baseline-$series" stages-upstream stages-baseline screen parity \
  probe-lm-24GiB probe-lm-6GiB probe-detect-24GiB; do
  count=1
  [ "$kind" = parity ] && count=2
  mapfile -t found < <(newest "$kind" "$count")
  if [ ${#found[@]} -eq 0 ]; then
    case $kind in
      *-"$series") echo "decisive_claims.sh: $home/$kind has no run folder yet: left out (provisional report)" >&2; continue ;;
      *) echo "decisive_claims.sh: no run folder under $home/$kind" >&2; exit 2 ;;
    esac
  fi
  folders+=("${found[@]}")
done
printf '%s\n' "${folders[@]}"
exec "${PYTHON:-python3}" -m harness.cli report "${folders[@]}" -o "$home/claims.md"
