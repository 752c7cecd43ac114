#!/usr/bin/env bash
# Regenerate every committed report and its tables from its run folder (bench report --tables), then the
# side-by-side reports from the folders their runs tables name, then the index, and show what changed: a report change should
# leave `git status` clean, or change exactly what it meant to. Usage: bash scripts/regenerate_reports.sh   (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=0
while IFS= read -r plan; do
  "$python" -m harness.cli report --tables "$(dirname "$plan")" > /dev/null || { echo "failed: $(dirname "$plan")"; failed=1; }
done < <(find reports -name plan.json | sort)
# A side-by-side report names its runs in its runs table ("| N | `folder` | ..."): the same folders, in order.
while IFS= read -r report; do
  folders=()
  while IFS= read -r name; do
    folders+=("$(find reports -type d -name "$name" | head -1)")
  done < <(grep -E '^\| [0-9]+ \| `' "$report" | awk -F'|' '{gsub(/[ `]/, "", $3); print $3}')
  "$python" -m harness.cli report "${folders[@]}" -o "$report" > /dev/null || { echo "failed: $report"; failed=1; }
done < <(grep -rl --include='*.md' '^| run | folder | tier | kind |' reports | sort)
# The decisive claims re-read beside the figures they had before the median became the primary (f244045).
"$python" scripts/reread_claims.py --old-commit f244045 > /dev/null || { echo "failed: reread_claims.py"; failed=1; }
"$python" scripts/reports_index.py > /dev/null || { echo "failed: scripts/reports_index.py"; failed=1; }
git status --short reports README.md
exit "$failed"
