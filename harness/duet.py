"""Fillers for duet rounds: the machine stays as loaded as at the start until every trial of a round has ended.

A duet round starts its arms at once, each on its own share of the worker cores. Without more, the arm that
ends first leaves its partner to finish alone on a quieter machine, and the slower arm looks faster than it
is: with a mutual slow-down c, a true reduction R reads as R / (1 + (1 − R)c). So a half whose trial has
ended runs discarded copies of it (fillers) until its partners end; a partner's end stops a filler at once
(``TrialContext.cancel``). Each arm's whole trial then runs beside a working partner, and the slow-down
touches both arms alike. A filler writes no row; its files are removed.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

FILLER_INDEX = 1_000_000_000  # a filler's index: its trial's plus this, apart from every logged index


def fill_until_partners_end(
    ctx_for: Any, trial: Any, trial_fn: Any, run_dir: Path, partners: Sequence[threading.Event]
) -> int:
    """Run discarded copies of ``trial`` until every event in ``partners`` is set; return how many started.

    ``ctx_for(filler, cancel)`` builds the filler's ``TrialContext``. A filler's failure is nobody's figure:
    it is ignored, and the next copy starts while a partner still runs.
    """
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
    folder = trials / f"{index:03d}"
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)
