"""No surprise durations.

The estimate comes before the first trial, and the time budget's refusal before any trial is logged.
`--stop-after` stops before a first trial that alone would overrun it.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.protocol import PlannedStop
from tests.argv import ONE_PAIR
from tests.runfolders import only_run
from tests.trialfns import plan_of, runner

SCREEN = [
    "screen",
    "--device",
    "cpu",
    "--scales",
    "n",
    "--guards",
    "256",
    "--steps",
    "1",
    "--warmup-steps",
    "0",
]


class Slow(torch.optim.SGD):
    """Every step sleeps two seconds: a trial far longer than the limits below."""

    def step(self, closure=None):
        time.sleep(2.0)
        return super().step(closure)


class AlsoSlow(Slow):
    """The same, under another name: a second arm."""


def test_the_estimate_is_said_before_the_first_trial(tmp_path: Path, capsys) -> None:
    out = tmp_path / "runs"
    argv = [*SCREEN, "--arms", "baseline,candidate-cpu", *ONE_PAIR, "--quiet"]
    assert main([*argv, "--no-report", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "estimated: about " in printed and " for 2 trials (from an untimed first trial)" in printed
    assert len(only_run(out).rows()) == 2  # the untimed probe is not logged


def test_a_scheduled_warmup_is_the_probe_and_is_logged_once(tmp_path: Path, capsys) -> None:
    out = tmp_path / "runs"
    argv = [*SCREEN, "--arms", "baseline,candidate-cpu", "--warmup", "1", "--pairs", "1", "--quiet"]
    assert main([*argv, "--no-report", "--out", str(out)]) == 0
    assert " for 3 trials (from an untimed first trial)" in capsys.readouterr().out
    assert [r["phase"] for r in only_run(out).rows()] == ["warmup", "measured", "measured"]


def test_a_plan_over_its_time_budget_is_refused_before_any_trial_is_logged(tmp_path: Path, capsys) -> None:
    out = tmp_path / "runs"
    argv = [*SCREEN, "--arms", "baseline,candidate-cpu", "--warmup", "1", "--pairs", "4"]
    assert main([*argv, "--time-budget", "0.001", "--no-report", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "over the time budget of 0 s" in err and "--time-budget" in err, err
    assert "shorten it" in err
    assert not out.exists() or not any(out.iterdir())  # nothing half-written


def test_stop_after_stops_before_a_first_trial_that_alone_would_overrun(tmp_path: Path, capsys) -> None:
    out = tmp_path / "runs"
    arms = f"a={__name__}:Slow,b={__name__}:AlsoSlow"
    argv = [*SCREEN, "--arms", arms, *ONE_PAIR, "--no-report"]
    started = time.monotonic()
    assert main([*argv, "--stop-after", "0.5", "--out", str(out)]) == 130
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "stopping before the first trial" in err and "--stop-after" in err, err
    folder = only_run(out)
    assert folder.rows() == []
    assert main(["screen", "--resume", str(folder.path), "--quiet", "--no-report"]) == 0
    assert len(folder.rows()) >= 2


def test_stop_after_stops_between_pairs_never_inside_one(tmp_path: Path) -> None:
    """Trials of 2 s, --stop-after 7: the probe (2 s) leaves room for the first pair (4 s).

    The second pair would overrun, so the run stops between the pairs. Setup may take up to 3 s before the
    probe.
    """
    plan = plan_of("sleepy", warmup=0, pairs=2, sleep=2.0)
    with pytest.raises(PlannedStop, match="stopping before pair 2"):
        runner(tmp_path, stop_after=7.0).start(plan)
    assert [r["round"] for r in only_run(tmp_path).rows()] == [0, 0]


def test_a_worker_tier_probe_runs_the_command_and_is_held_to_the_budget(tmp_path: Path, capsys) -> None:
    """The first trial is measured with no warm-up, so the probe runs apart, in its own folder.

    A 2 s command against a budget of 1 s for 2 trials is cut at 0.5 s and refused.
    """
    out = tmp_path / "runs"
    argv = ["command", "--arms", "2,3", *ONE_PAIR, "--time-budget", "1", "--quiet"]
    assert main([*argv, "--no-report", "--out", str(out), "--", "sleep", "{arm}"]) == 2
    err = capsys.readouterr().err
    assert "over the time budget of 1 s" in err and "the first trial alone ran past 0.5 s" in err, err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("ultralytics") is None, reason="the real trainer's estimate")
def test_the_real_trainer_on_the_cpu_is_refused_at_once_by_its_own_estimate(tmp_path: Path, capsys) -> None:
    """The fit tier estimates a real-trainer fit on the CPU (hours at the defaults) before any probe.

    The plan is refused in seconds, with no data set built and no run folder.
    """
    out, cache = tmp_path / "runs", tmp_path / "cache"
    argv = ["pair", "--device", "cpu", "--workload", "ultralytics", "--pairs", "1", "--warmup", "0"]
    started = time.monotonic()
    assert main([*argv, "--time-budget", "120", "--data-cache", str(cache), "--out", str(out)]) == 2
    assert time.monotonic() - started < 20
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "2 trials would take about " in err, err
    assert "over the time budget of 2 min" in err and "before any trial" in err, err
    assert not out.exists() and not cache.exists()
