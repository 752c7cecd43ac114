"""The README's first command, `bench pair` with no option at all, run for real: fourteen fits of 64 steps,
each in a fresh worker. Its own file, because it is the suite's longest test: under ``--dist loadfile`` a file
is one worker's, so apart from the rest of the fit tier (``test_fit.py``) the two can run at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from harness.cli import main
from tests.runfolders import only_run


@pytest.mark.slow
def test_the_readme_first_command_compares_two_computations(tmp_path: Path, monkeypatch, capsys) -> None:
    """`bench pair` with no option at all, as on the README's fresh machine (no ultralytics, no CUDA): the
    embedded workload, baseline against candidate-cpu, and a claim whose first line names what each ran."""
    monkeypatch.setattr("experiments.fit.plan.ultralytics_importable", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    assert main(["pair"]) == 0
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert "device: cpu (auto: no CUDA device here)" in out
    assert "workload: embedded (auto: ultralytics is not importable here" in out
    assert "arms: baseline,candidate-cpu (the default on cpu:" in out
    assert (
        "fit: 64 steps of 128 images = 2 epochs × 32 iterations (128 images and 64 steps: the embedded" in out
    )
    folder = only_run(tmp_path / "runs")
    rows = folder.rows()
    assert len(rows) == 14 and all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    assert {r["arm"]: r["optimizer_class"] for r in rows} == {
        "baseline": "optimizers.musgd.MuSGD",
        "candidate-cpu": "experiments.arms.BatchedMuSGDOnCPU",
    }
    answer, first = folder.file("claim.txt").read_text().splitlines()[:2]
    assert answer.startswith("candidate-cpu ") and "baseline" in answer and "6 pairs" in answer  # in words
    assert answer in out and answer in folder.file("report.md").read_text()
    assert first == (
        "On cpu: baseline ran the per-parameter MuSGD (optimizers.musgd.MuSGD); candidate-cpu ran the batched "
        "path (batched Newton-Schulz, foreach momentum) with CPU tensors routed through it "
        "(experiments.arms.BatchedMuSGDOnCPU)."
    )
    assert first in out  # the console says it too, before the figures
    report = folder.file("report.md").read_text().splitlines()
    assert report[report.index("## Summary") + 2] == first
    log = (folder.path / "trials" / "0.log").read_text()
    assert "epoch 2/2: train loss " in log
    print(f"the default job took {elapsed:.1f} s here")
