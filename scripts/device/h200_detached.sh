#!/usr/bin/env bash
# H200: one step of scripts/device/h200_decisive.sh run detached (its own process session), so that one slice of a
# claim spans several device calls on a machine kept warm: a call ends at 10 minutes, and every resume of a
# claim costs a warm-up fit, so one long slice measures more rounds than several short ones.
# The step runs in a copy of the tree under /tmp/detached, where a later call's fresh copy of the working tree
# cannot overwrite its run folder. Usage, in device calls fired back to back (the machine goes back when idle):
#   BENCH_GIT_REVISION=<sha> BENCH_GIT_DIRTY=0 DEADLINE=<s> bash scripts/device/h200_detached.sh start STEP
#   bash scripts/device/h200_detached.sh wait SECONDS
# STEP may be several steps in one quoted word ("tests screen upstream"): one detached run, no machine start or
# claim warm-up between them. `start` returns at once; `wait` returns when the run ends or SECONDS pass,
# whichever is first, and either way leaves the folders the run changed, as they stand, in $OUT/decisive.tgz
# and its logs in $OUT/logs.tgz (a snapshot: a run cut off later resumes from the last one brought back).
set -u
ROOT=/tmp/detached
case ${1:-} in
  start)
    step=${2:?which step}
    rm -rf "$ROOT" && mkdir -p "$ROOT/out" "$ROOT/logs" && touch "$ROOT/started" && cp -a . "$ROOT/tree" || exit 1
    (cd "$ROOT/tree" && OUT="$ROOT/out" LOGS="$ROOT/logs" MARK="$ROOT/started" setsid bash -c \
      "bash scripts/device/h200_decisive.sh $step > '$ROOT/logs/detached.log' 2>&1; echo \$? > '$ROOT/rc'" \
      < /dev/null > /dev/null 2>&1 &)
    echo "started $step detached (deadline ${DEADLINE:-560} s)" ;;
  wait)
    end=$(( $(date +%s) + ${2:?how many seconds} ))
    while [ ! -e "$ROOT/rc" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    if [ -e "$ROOT/rc" ]; then echo "finished rc=$(cat "$ROOT/rc")"; else echo "still running"; fi
    (cd "$ROOT/tree" && LOGS="$ROOT/logs" MARK="$ROOT/started" && . scripts/device/h200_pack.sh && pack decisive reports/h200-decisive)
    tail -n 4 "$ROOT"/logs/*.log ;;
  *) echo "usage: h200_detached.sh start STEP | wait SECONDS"; exit 2 ;;
esac
