"""`bench parity`: the one-step contract holds for the candidate, is exactly zero for the control, and breaks
(exit 1) for an optimizer that computes something else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments import parity
from experiments.parity_steps import STEP_FIELDS, ParityResult, ParitySettings, run_parity
from harness.cli import main
from harness.tables import RunFolder
from harness.tier import Run
from optimizers import MuSGD
from optimizers.batched import batched_on_cpu


class NudgedMuSGD(MuSGD):
    """The baseline plus a nudge of 1e-3 × lr on every parameter: a candidate that computes something else."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(1e-3 * group["lr"])
        return loss


# One intra-op thread: these small bf16 products only lose from threads on a busy two-core runner. Every
# comparison runs both of its trajectories in this process, at the same thread count.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def fit_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of one uninterrupted `bench parity --fit --steps 3`.

    The two tests that use it only read it, and `bench report` rewrites its report byte for byte.
    """
    out = tmp_path_factory.mktemp("parity-fit")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in every test here: this fixture is set up before their one_thread
    try:
        assert main(["parity", "--fit", "--steps", "3", "--out", str(out), "--quiet"]) == 0
    finally:
        torch.set_num_threads(threads)
    (folder,) = out.iterdir()
    return folder


def test_candidate_on_the_batched_path_keeps_the_contract() -> None:
    """The test-only switch routes CPU tensors through the padded batches and foreach momentum."""
    with batched_on_cpu():
        result = run_parity(ParitySettings(scale="n", steps=1))
    first = {f.comparison: f for f in result.steps if f.step == 1}
    control, candidate = first["control"], first["candidate"]
    assert control.max_abs_diff == 0.0 and control.params_equal == control.params_total
    assert control.buffers_equal == control.buffers_total == 492
    assert result.contract["candidate: largest difference within lr·muon·bf16 rounding of the update"]
    assert 0 < result.bound_worst_ratio["candidate"] <= 1.0 or candidate.max_abs_diff == 0.0
    # CPU bf16 GEMMs over a zero-padded width may sum in another order, so a Muon update can round
    # differently; the SGD momentum of that parameter then reads a different p through weight decay. Any
    # buffer that differs must belong to a parameter that differs, never to one that matches.
    differing_buffers = candidate.buffers_total - candidate.buffers_equal
    assert differing_buffers <= candidate.params_total - candidate.params_equal


def result_in(folder: Path) -> ParityResult:
    return parity.result_of(Run.load(RunFolder.open(folder)))


def test_a_candidate_that_computes_something_else_breaks_the_contract(tmp_path: Path, capsys) -> None:
    code = main(
        [
            "parity",
            "--candidate",
            "tests.experiments.parity.test_parity:NudgedMuSGD",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 1
    (folder,) = tmp_path.iterdir()
    result = result_in(folder)
    assert result.holds is False
    assert (
        result.contract["candidate: largest difference within lr·muon·bf16 rounding of the update"] is False
    )
    assert result.contract["control: parameters identical"] is True
    assert "BROKEN" in (folder / "report.md").read_text()
    assert "BROKEN" in (folder / "claim.txt").read_text()
    assert str(folder) in capsys.readouterr().out  # the run folder is named, --quiet or not


def test_fit_mode_compares_loss_bytes_and_writes_divergence(fit_run: Path) -> None:
    folder = fit_run
    assert result_in(folder).contract["candidate: loss bytes identical"] is True
    lines = (folder / "divergence.csv").read_text().splitlines()
    assert len(lines) == 1 + 2 * 3  # header, control and candidate for each step
    for name in ("env.json", "plan.json", "trials.jsonl", "report.md"):
        assert (folder / name).is_file(), name


def test_a_parity_run_is_a_run_folder_that_resumes_and_reports(fit_run: Path, tmp_path: Path) -> None:
    """A parity run stopped after some steps resumes, replaying the earlier steps unlogged, to the rows of an
    uninterrupted run.

    `bench report` regenerates its report byte for byte.
    """
    whole = fit_run
    assert main(["parity", "--fit", "--steps", "3", "--out", str(tmp_path / "cut"), "--quiet"]) == 0
    (cut,) = (tmp_path / "cut").iterdir()
    log = cut / "trials.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text(lines[0] + lines[4])  # control step 1 and candidate step 2 kept; the rest to run again
    assert main(["parity", "--resume", str(cut), "--quiet"]) == 0
    figures = list(STEP_FIELDS)
    by_index = lambda folder: {r["index"]: {k: r[k] for k in figures} for r in RunFolder(folder).rows()}  # noqa: E731
    assert by_index(cut) == by_index(whole)
    report = (whole / "report.md").read_bytes()
    assert main(["report", str(whole)]) == 0
    assert (whole / "report.md").read_bytes() == report


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scale", "q"], "--scale 'q'"),
        (["--steps", "0"], "--steps must be"),
        (["--candidate", "nope"], "unknown arm"),
    ],
)
def test_bad_inputs_exit_2_and_write_nothing(args: list[str], message: str, tmp_path: Path, capsys) -> None:
    assert main(["parity", *args, "--out", str(tmp_path / "runs")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_parity_over_ten_steps() -> None:
    result = run_parity(ParitySettings(scale="n", steps=10), device="cuda")
    assert result.holds, result.contract
