# Source on a device machine: bring run folders and logs back within the device tool's limits (at most 8 files
# of 16 MiB each come back from $OUT). Logs go to $LOGS (outside $OUT) and come back as one logs.tgz; `pack`
# packs only the run folders that changed since $MARK (this script's sourcing, unless set), since the committed
# ones are already on the machine that asked, and leaves out checkpoints, the dataset cache and the trainer's
# config folder (font copies).
LOGS=${LOGS:-/tmp/bench-logs}
mkdir -p "$LOGS"
[ -n "${MARK:-}" ] || { MARK=$(mktemp /tmp/bench-mark.XXXXXX) && touch "$MARK"; }

# pack NAME DIR: DIR/<kind>/<run>/ folders holding a file newer than $MARK into $OUT/NAME.tgz, and every log
# into $OUT/logs.tgz, each written aside and moved into place, so a call cut at its limit still brings back
# what the last finished step packed.
pack() {
  local runs=() folder
  for folder in "$2"/*/*/; do
    case $folder in */datasets/* | */logs/*) continue ;; esac
    [ -n "$(find "$folder" -newer "$MARK" -type f -print -quit)" ] && runs+=("${folder%/}")
  done
  if [ ${#runs[@]} -gt 0 ]; then
    tar czf "$OUT/$1.part" --exclude='*.pt' --exclude=datasets --exclude=weights --exclude=ultralytics-config \
      "${runs[@]}" && mv "$OUT/$1.part" "$OUT/$1.tgz"
  fi
  tar czf "$OUT/logs.part" -C "$LOGS" . && mv "$OUT/logs.part" "$OUT/logs.tgz"
}
