"""Quiet fits, as wired through the harness.

CPU placement applied to workers and inherited by their children, telemetry in every row, and the steady-state
figure. Also duet pairs, and the refusals that go with them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness import telemetry
from harness.cli import main
from harness.isolation import run_in_worker
from harness.placement import choose_placement
from tests.argv import ONE_PAIR, TINY_FIT, overridden
from tests.runfolders import only_run
from tests.trialfns import plan_of, runner

LINUX = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU placement needs Linux")
TINY = [*TINY_FIT, "--quiet"]


@LINUX
def test_a_placed_worker_and_its_children_run_on_the_placement_only() -> None:
    placement = choose_placement("0")
    result = run_in_worker("tests.workerfns:report_affinity", {}, timeout_s=120, placement=placement)
    assert result["worker_cores"] == [0] and result["child_cores"] == [0]
    assert result["omp"] == "1" and result["torch_threads"] == 1
    assert result["placed_cores"] == "0"  # what the worker read back after placing itself, for the row
    usage = telemetry.usage_from(result[telemetry.USAGE_KEY])
    assert usage.source == "wait4" and usage.user_s is not None and usage.user_s >= 0


def test_every_row_carries_its_telemetry(tmp_path: Path) -> None:
    folder = runner(tmp_path).start(plan_of("sleepy", warmup=1, pairs=1, sleep=0.05)).folder
    rows = folder.rows()
    assert len(rows) == 3
    for row in rows:
        for field, kind in telemetry.FIELD_TYPES.items():
            assert field in row, field
            assert row[field] is None or isinstance(row[field], kind), (field, row[field])
        assert row["telemetry_seconds"] >= 0.05
        assert row["worker_usage_source"] == "getrusage"  # an in-process trial reads its own process


@LINUX
def test_an_in_process_run_is_pinned_to_the_worker_cores_for_its_schedule(tmp_path: Path) -> None:
    before = os.sched_getaffinity(0)
    folder = runner(tmp_path).start(plan_of("affinity", warmup=0, pairs=1, cpus="0")).folder
    assert {tuple(r["cores"]) for r in folder.rows()} == {(0,)}
    assert os.sched_getaffinity(0) == before  # given back when the run ends
    assert folder.read_json("env.json")["placement"]["worker_cores"] == [0]


@pytest.mark.slow
def test_the_steady_state_figure_is_the_training_time_of_every_epoch_after_the_first(tmp_path: Path) -> None:
    """Embedded workload, 3 epochs: the steady figure is the sum of epochs 2 and 3's training spans.

    A span runs from the epoch's start to the end of its last iteration, within the clock's resolution. Epoch
    one, validation and checkpoints are left out.
    """
    argv = ["pair", *overridden(TINY, ["--steps", "6"]), *ONE_PAIR, "--out", str(tmp_path), "--no-report"]
    assert main(argv) == 0
    folder = only_run(tmp_path)
    for row in folder.rows():
        spans = row["epoch_train_s"]
        assert len(spans) == 3 and all(span > 0 for span in spans)
        assert row["steady_s"] == pytest.approx(sum(spans[1:]), abs=1e-9)  # the spans are logged to 1 µs
        assert row["steady_s"] < row["value"] - spans[0]  # validation, checkpoints and set-up are outside it
        assert row["telemetry_seconds"] >= row["value"]  # the parent's readings bracket the worker


@pytest.mark.slow
@LINUX
def test_duet_pairs_run_together_on_their_own_halves_and_swap_them(tmp_path: Path) -> None:
    argv = ["pair", *TINY, "--warmup", "0", "--pairs", "2", "--order", "duet", "--cpus", "0-1"]
    assert main([*argv, "--out", str(tmp_path), "--no-report"]) == 0
    folder = only_run(tmp_path)
    rows = sorted(folder.rows(), key=lambda r: r["index"])
    assert [r["concurrent_with"] for r in rows] == [[1], [0], [3], [2]]
    by_round = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["arm"]] = row["placed_cores"]
    other = next(arm for arm in by_round[0] if arm != "baseline")  # the device's default candidate arm
    assert by_round[0]["baseline"] != by_round[0][other]
    assert by_round[0]["baseline"] == by_round[1][other]  # each arm takes the other half next round
    assert all(r["status"] == "ok" for r in rows)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cpus", "lots"], "--cpus"),
        (["--cpus", "999"], "are not among those this process may use"),
        (["--order", "duet", "--cpus", "none"], "--order duet runs the arms at once"),
    ],
)
def test_placement_refusals_are_one_line(argv: list[str], message: str, tmp_path: Path, bench) -> None:
    bench.refused(["pair", *TINY, *argv, "--out", str(tmp_path / "runs")], message)
    assert not (tmp_path / "runs").exists()


def test_the_report_names_flagged_trials_and_keeps_them(tmp_path: Path) -> None:
    from harness.report import write_report
    from tests.trialfns import TIERS

    folder = runner(tmp_path).start(plan_of("sleepy", warmup=0, pairs=2)).folder
    rows = [
        {**r, "load1_start": 0.5, "cpu_steal_share": 0.0} for r in folder.rows()
    ]  # a quiet machine but for
    rows[1]["gpu0_throttle_mask_end"] = 0x40  # a hardware thermal slowdown at one trial's end
    rows[1]["gpu0_sm_clock_mhz_end"] = 1200.0
    folder.file("trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_report([folder], TIERS).read_text()
    assert "### Telemetry" in text and "Flagged trials (1 of 4; kept in every figure)" in text
    assert "trial 1 (measured, candidate): gpu0 reported hw_thermal_slowdown at the trial's end" in text
    assert "![test: each trial's figure against its telemetry](report-figures/telemetry.png)" in text
    assert "| only | candidate | candidate | 2 | 0 |" in text  # the flagged trial still counts in its arm
