#!/usr/bin/env bash
# The decisive side-by-side report of one series, on any machine (no GPU needed: a report reads run folders).
# Usage: bash scripts/decisive_claims.sh SERIES   (e.g. d)
# Picks, under reports/h200-decisive/, the newest run folder of each: the two claims of the series
# (upstream-SERIES, baseline-SERIES), each stages pair, the screen, parity at YOLO26n and YOLO26x (the two
# newest parity folders) and the three probes; then writes reports/h200-decisive/claims.md from them.
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:?usage: decisive_claims.sh SERIES}
home=reports/h200-decisive
newest() { { ls -d "$home/$1"/*-2* 2>/dev/null || true; } | tail -"${2:-1}"; }
folders=()
for kind in "upstream-$series" "baseline-$series" stages-upstream stages-baseline screen; do
  found=$(newest "$kind")
  if [ -z "$found" ]; then echo "decisive_claims.sh: no run folder under $home/$kind" >&2; exit 2; fi
  folders+=("$found")
done
mapfile -t parity < <(newest parity 2)
folders+=("${parity[@]}")
for kind in probe-lm-24GiB probe-lm-6GiB probe-detect-24GiB; do folders+=("$(newest "$kind")"); done
printf '%s\n' "${folders[@]}"
exec "${PYTHON:-python3}" -m harness.cli report "${folders[@]}" -o "$home/claims.md"
