"""Duet rounds: the machine as loaded as at the start until every trial of a round has ended.

The rule, stated once: ``docs/methods.md`` (``harness/duet.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.safe_fs import remove_tree

PARTNER_REASON = "duet partner"


def duet_partners(plan: Any, unit: list[Any], rows: list[dict[str, Any]]) -> list[Any]:
    """Warm-ups of the arms of ``unit``'s round that the log already holds."""
    if not unit or unit[0].phase != "measured":
        return []
    first = unit[0]
    pending = {t.index for t in unit}
    same = (first.case, first.round, "measured")
    logged = [t for t in plan.schedule if (t.case, t.round, t.phase) == same and t.index not in pending]
    used = {int(r["index"]) for r in rows} | {t.index for t in plan.schedule}
    start = max(used, default=-1) + 1
    return [replace(t, index=start + n, phase="warmup") for n, t in enumerate(logged)]


FILLER_INDEX = 1_000_000_000  # a filler's index: its trial's plus this, apart from every logged index


def fill_until_partners_end(
    ctx_for: Any, trial: Any, trial_fn: Any, run_dir: Path, partners: Sequence[threading.Event]
) -> int:
    """Run discarded copies of ``trial`` until every event in ``partners`` is set; return how many started."""
    done = threading.Event()

    def watch() -> None:
        for ended in partners:
            ended.wait()
        done.set()

    threading.Thread(target=watch, daemon=True).start()
    filler = replace(trial, index=FILLER_INDEX + trial.index, phase="filler")
    started = 0
    try:
        while not done.is_set():
            started += 1
            try:
                trial_fn(ctx_for(filler, done))
            except Exception:  # noqa: BLE001 - stopped by its partner's end, or failed: discarded either way
                pass
    finally:
        _remove_files(run_dir, filler.index)
    return started


def _remove_files(run_dir: Path, index: int) -> None:
    """A filler's log and trial folder, as the worker tiers name them (``trials/<index>.log``, ``trials/<index>``)."""
    trials = Path(run_dir) / "trials"
    for log in trials.glob(f"{index}.*log"):
        log.unlink(missing_ok=True)
    remove_tree(trials / f"{index:03d}")
