"""The fit tier under faults: non-finite fits, seeds the real trainer takes, options it would ignore."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments.fit.ultralytics_fit import upstream_seed
from experiments.fit.worker import non_finite_results
from harness.cli import main
from tests.argv import EMBEDDED, ONE_PAIR, TINY_FIT
from tests.runfolders import only_run


def test_the_fit_worker_names_every_non_finite_figure_and_parameter() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    assert (
        non_finite_results({"train_loss": 0.5, "val_loss": 1.0, "val_accuracy": 0.2}, {"model": model}) == []
    )
    with torch.no_grad():
        model[1].weight[0, 1] = float("inf")
    problems = non_finite_results(
        {"train_loss": float("nan"), "val_loss": 1.0, "val_map50": float("nan"), "val_map50_95": None},
        {"model": model},
    )
    assert problems == ["train_loss nan", "val_map50 nan", "model parameter 1.weight (1 of 2 entries)"]


@pytest.mark.slow
def test_a_fit_whose_last_step_writes_nan_fails_as_non_finite(tmp_path: Path) -> None:
    """The issue's case: NaN written at the last step gave status ok, val_loss null and a 15% "reduction"."""
    arms = "baseline,tests.workerfns:NaNAtLastStep"
    command = ["pair", *TINY_FIT, "--arms", arms, *ONE_PAIR, "--quiet", "--no-report"]
    assert main([*command, "--out", str(tmp_path)]) == 3  # every trial of the NaN arm failed
    rows = {r["arm"]: r for r in only_run(tmp_path).rows()}
    assert rows["baseline"]["status"] == "ok", rows["baseline"]["message"]
    failed = rows["tests.workerfns:NaNAtLastStep"]
    assert failed["status"] == "error" and failed["value"] is None
    assert "non-finite" in failed["message"] and "parameter" in failed["message"], failed["message"]
    assert "val_loss nan" in failed["message"], failed["message"]
    folder = only_run(tmp_path)
    assert sorted(p.name for p in (folder.path / "trials").iterdir()) == ["0.log", "1.log"]  # logs only
    claim = folder.file("claim.txt").read_text()
    assert "1 of 1 tests.workerfns:NaNAtLastStep trials failed" in claim  # never a "faster" NaN


def test_the_real_trainer_gets_a_seed_numpy_takes() -> None:
    """Upstream seeds numpy's legacy generator with seed + 1 + rank, which must stay below 2**32."""
    assert upstream_seed(7) == 7 and upstream_seed(4_294_967_296 - 2048) == 4_294_967_296 - 2048
    for seed in (4_295_012_885, 2**63 - 1, 2**40 + 3):
        assert 0 <= upstream_seed(seed) + 1 + 8 < 2**32
    assert upstream_seed(2**40 + 3) != upstream_seed(2**40 + 4)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--model", "foo.pt"), ("--workers", "8"), ("--cache", "disk"), ("--close-mosaic", "2")],
)
def test_real_trainer_options_with_the_embedded_workload_are_refused(
    tmp_path: Path, bench, no_run, option: str, value: str
) -> None:
    out = tmp_path / "runs"
    bench.refused([*EMBEDDED, option, value, "--out", str(out)], f"{option} {value}", "real trainer")
    assert not out.exists()


def test_a_data_cache_nothing_would_use_is_refused(tmp_path: Path, bench, no_run) -> None:
    """`--data-cache` holds the real trainer's synthetic sets: with the embedded workload, which holds its set
    in memory, it is refused.
    """
    out = tmp_path / "runs"
    bench.refused(
        [*EMBEDDED, "--data-cache", str(tmp_path / "sets"), "--out", str(out)],
        "--data-cache",
        "embedded",
    )
    assert not out.exists()
