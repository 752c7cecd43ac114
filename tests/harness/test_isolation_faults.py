"""A trial's worker: it starts lean, and its parent reads no more of its log than a failure needs."""

from __future__ import annotations

import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from harness.isolation import WorkerDied, run_in_ranks, run_in_worker
from tests import ROOT

WORKER_TARGETS = [
    "experiments.fit.worker",
    "experiments.screen.ranks",
    "experiments.parity",
]


def test_a_trial_worker_imports_torch_and_its_trial_not_the_statistics_or_the_plots() -> None:
    """Every trial starts a process that imports `harness.isolation` and its target, without pandas, scipy or
    matplotlib.

    Those three serve only the parent's tables and reports, and cost each worker about 3 s of its 6 s start on
    two cores.
    """
    code = (
        "import importlib, sys\n"
        "import harness.isolation\n"
        f"for name in {WORKER_TARGETS!r}: importlib.import_module(name)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'scipy', 'matplotlib'}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


BIG_LOG = 16 * 2**20  # bytes: a chatty fit's log, far over what a failure message needs
READ_BOUND = 4 * 2**20  # the parent's peak of traced memory while it runs the trial


def _peak_while(call) -> tuple[object, int]:
    """``call()``'s outcome (its value or the exception it raised) and the parent's traced memory peak."""
    tracemalloc.start()
    try:
        try:
            outcome: object = call()
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcome = exc
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("ending", ["", "; echo last words; kill -9 $PPID"])
def test_the_parent_reads_at_most_a_bounded_tail_of_a_workers_large_log(tmp_path: Path, ending: str) -> None:
    """A worker prints 16 MB, then returns or is killed: the parent never holds the whole log.

    A killed worker's message still ends with the log's last line.
    """
    line = "a line of a chatty fit"
    chatter = f"yes '{line}' | head -n {BIG_LOG // len(line) + 1}{ending}"
    log = tmp_path / "trial.log"
    outcome, peak = _peak_while(lambda: run_in_worker("os:system", chatter, timeout_s=120, log_path=log))
    assert log.stat().st_size >= BIG_LOG
    if ending:
        assert isinstance(outcome, WorkerDied) and str(outcome).endswith("(exit -9): last words"), outcome
    else:
        assert outcome == 0
    assert peak < READ_BOUND, f"the parent held {peak} bytes"


def test_ranks_that_die_are_named_from_the_launchers_summary_after_a_large_log(tmp_path: Path) -> None:
    """A resumed trial's log holds 16 MB already: the launcher's failure summary, at its end, still names the
    rank that died, and the parent never holds the whole log."""
    log = tmp_path / "trial.log"
    log.write_bytes(b"an earlier attempt's line\n" * (BIG_LOG // 26 + 1))
    outcome, peak = _peak_while(lambda: run_in_ranks("os:_exit", 3, 2, timeout_s=120, log_path=log))
    assert isinstance(outcome, WorkerDied), outcome
    assert re.fullmatch(r"rank [01] died without a result \(exitcode 3; launcher exit 1\)", str(outcome))
    assert peak < READ_BOUND, f"the parent held {peak} bytes"
