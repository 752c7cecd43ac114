"""The complete-fit tier (`bench pair`) on the embedded workload: end to end, stages, worker death, resume,
and every refused input. Each trial is a real worker process, so the settings are tiny."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments.fit.plan import FitSettings, check_steps
from experiments.fit.stages import STAGES, host_iteration_median, stage_column, within_epoch_gaps
from harness.cli import main
from harness.errors import InputError
from harness.tier import Run
from tests import ROOT
from tests.argv import TINY_FIT
from tests.runfolders import only_run

ULTRALYTICS = all(importlib.util.find_spec(name) is not None for name in ("ultralytics", "torchvision"))
TINY = [*TINY_FIT, "--quiet"]


def test_steps_must_be_whole_epochs() -> None:
    assert check_steps(384, 256, 4) == 6
    assert check_steps(64, 256, 4) == 1
    with pytest.raises(
        InputError, match="--steps 100 is not a whole number of epochs of 64 iterations.*--steps 128 or 64"
    ):
        check_steps(100, 256, 4)
    with pytest.raises(
        InputError, match="250 training images are not a whole number of batches of 4.*--images 252 or 248"
    ):
        check_steps(384, 250, 4)


def test_host_iteration_median_skips_the_gap_across_an_epoch_end() -> None:
    # Two epochs of three iterations; the epoch boundary gap (validation) is 100 s and must not count.
    stamps = [0.0, 1.0, 2.0, 102.0, 103.0, 104.0]
    assert within_epoch_gaps(stamps, 3) == [1.0, 1.0, 1.0, 1.0]
    assert host_iteration_median(stamps, 3) == 1.0


@pytest.mark.slow
def test_pair_embedded_end_to_end(tmp_path: Path, capsys) -> None:
    """`bench pair` through the CLI: a warm-up and two pairs, each a fresh worker; claim, report, rows."""
    assert main(["pair", *TINY, "--warmup", "1", "--pairs", "2", "--bar", "8", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "workload: embedded (--workload embedded)" in out
    assert "arms: baseline,candidate-cpu (the default on cpu:" in out  # no --arms on a CPU: say which
    folder = only_run(tmp_path)
    rows = folder.rows()
    assert [r["phase"] for r in rows] == ["warmup"] + ["measured"] * 4
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    classes = {r["arm"]: r["optimizer_class"] for r in rows}
    assert classes == {
        "baseline": "optimizers.musgd.MuSGD",
        "candidate-cpu": "experiments.arms.BatchedMuSGDOnCPU",
    }
    for row in rows:
        assert row["iterations"] == 4 and row["value"] > 0
        assert row["checkpoint_bytes"] > 0  # real checkpoint files were written each epoch ...
        assert row["iteration_host_median_s"] > 0
        assert row["peak_allocated"] is None  # no device-memory figure on the CPU, never a made-up one
        assert (folder.path / "trials" / f"{row['index']}.log").is_file()
    assert not list((folder.path / "trials").rglob("*.pt"))  # ... and deleted after the trial
    plan = json.loads(folder.file("plan.json").read_text())
    assert plan["tier"] == "pair" and plan["in_process"] is False
    assert FitSettings.from_dict(plan["settings"]).epochs == 2
    answer, claim = folder.file("claim.txt").read_text().split("\n", 1)  # the answer first, in words
    assert answer.startswith("candidate-cpu ") and "2 pairs" in answer and "the 8% bar" in answer
    assert claim.startswith("On cpu: baseline ran the per-parameter MuSGD")
    claim_body = "\n".join(claim.splitlines()[1:])
    assert claim_body.startswith("Baseline median ") and "The paired reduction is" in claim
    assert "verdict against the 8% bar: " in claim
    assert "1 warm-up fit(s) discarded, then 2 pairs in alternate order (AB, BA)" in claim
    assert "95% order-statistic interval of the median reduction" in claim and "2 pairs" in claim
    # Two pairs' range attains 50%: insufficient, said with what 95% needs.
    assert "95% stated, 50.0% attained" in claim and "95% needs 5" in claim
    assert "Checks: geometric-mean t " in claim and "sign-test interval of the median" in claim
    assert "Environment: " in claim
    assert " ".join(answer.split()) in " ".join(
        out.split()
    )  # the console opens with the answer; claim.txt says more
    report = folder.file("report.md").read_text()
    assert "### Fit settings" in report and "4 = 2 epochs × 2 iterations (8 images / batch 4)" in report
    assert "### Per-trial figures" in report
    folder.file("claim.txt").write_text("stale")
    assert main(["report", str(folder.path)]) == 0
    assert folder.file("claim.txt").read_text() == "stale"  # presentation writes nothing but the report
    assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report"]) == 0  # nothing left to run
    assert folder.file("claim.txt").read_text() == f"{answer}\n{claim}"  # derived from the log again
    # the gate follows the claim's verdict (ungated the command exits 0 either way). Whether two measured
    # pairs clear 8% on a shared CPU is the machine's business, not this test's (their interval was once
    # wide, now 13.9-16.4%): a gated resume exits 0 and says so when the claim clears, 1 and says why when
    # not (both exits on fixed rows: tests/harness/test_cli.py).
    # The primary's verdict, not the secondary's (whose line ends the same way: CI once read a secondary
    # "clears" beside an ambiguous primary and expected the gate to pass).
    primary = re.search(r"median reduction [^\n]*verdict against the 8% bar: (\w+)\.", claim)
    assert primary is not None
    clears = primary.group(1) == "clears"
    assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report", "--gate"]) == (
        0 if clears else 1
    )
    captured = capsys.readouterr()
    err = captured.err
    if clears:
        assert "bench: gate passed" in captured.out and "bench: gate:" not in err
    else:
        assert "bench: gate: candidate-cpu vs baseline (claim): " in err and "(claim): clears" not in err


@pytest.mark.slow
def test_an_aa_control_fit_is_judged_against_its_tolerance(tmp_path: Path) -> None:
    """`--control --bar 50`: the baseline against itself, its claim a noise floor judged against ±50%."""
    assert (
        main(
            [
                "pair",
                *TINY,
                "--arms",
                "baseline",
                "--control",
                "--bar",
                "50",
                "--warmup",
                "0",
                "--pairs",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    folder = only_run(tmp_path)
    assert {r["optimizer_class"] for r in folder.rows()} == {"optimizers.musgd.MuSGD"}
    claim = folder.file("claim.txt").read_text().split("\n", 1)[1]  # after the answer
    assert claim.startswith("A/A control on cpu: baseline ran the per-parameter MuSGD")
    assert claim.splitlines()[1].startswith("A/A control (noise floor): Baseline median ")
    (verdict,) = {
        line.split("tolerance: ")[1].split(".")[0] for line in claim.splitlines() if "tolerance: " in line
    }
    assert "A/A verdict against the ±50% tolerance: " in claim and verdict == "insufficient"  # one pair


@pytest.mark.slow
def test_stages_run_attributes_the_whole_fit(tmp_path: Path, capsys) -> None:
    """`--stages` is its own diagnostic run: the stages add up to the fit, and the ceiling is stated."""
    assert main(["pair", *TINY, "--stages", "--warmup", "0", "--pairs", "1", "--out", str(tmp_path)]) == 0
    folder = only_run(tmp_path)
    assert folder.path.name.startswith("stages-")
    rows = folder.rows()
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    for row in rows:
        stages = [row[stage_column(s)] for s in STAGES]
        assert all(v >= 0 for v in stages)
        assert row[stage_column("optimizer")] > 0 and row[stage_column("forward_backward")] > 0
        assert abs(sum(stages) - row["value"]) < 0.05 * row["value"]  # the marks cover the bracket
        assert row["iteration_sync_median_s"] > 0
        first, median = row["stage_optimizer_first_s"], row["stage_optimizer_step_median_s"]
        assert 0 < first < row[stage_column("optimizer")] and 0 < median < row[stage_column("optimizer")]
        assert 0 < row["stage_optimizer_host_median_s"] <= median  # each step's host part is within the step
    graphs = {row["arm"]: row["optimizer_graphs"] for row in rows}
    assert graphs["baseline"] is None  # the per-parameter MuSGD keeps no graph counts
    assert graphs["candidate-cpu"].startswith("eager: ")  # no CUDA graph on the CPU, and the reason is said
    kept = {row["arm"]: row["optimizer_plan_bytes"] for row in rows}
    assert kept["baseline"] is None and kept["candidate-cpu"] > 0  # the candidate's stacks and scratch
    claim = folder.file("claim.txt").read_text()
    assert claim.startswith("On cpu: baseline ran the per-parameter MuSGD")  # what ran, first in every claim
    assert (
        claim.splitlines()[1] == "Stages diagnostic (not a claim):" and "Ceiling: in baseline's fits" in claim
    )
    stages_csv = folder.file("stages.csv").read_text()
    assert "optimizer" in stages_csv and "share" in stages_csv
    report = folder.file("report.md").read_text()
    assert "### Stage shares" in report
    assert "- candidate-cpu: the first optimizer step took " in report and "its core ran: eager: " in report
    assert "of it on the host before the device was waited for" in report
    assert "| kept between steps |" in report and "Kept between steps: device memory" in report
    assert "diagnostic, not a claim" in report and "**Claim (" not in report  # never read as a claim
    assert "A diagnostic run (synchronized inside the timed region): no verdict." in report


@pytest.mark.slow
def test_a_worker_that_dies_is_a_failed_row_and_the_run_goes_on(tmp_path: Path) -> None:
    arms = "baseline,tests.workerfns:DiesMidFit"
    # The dying arm runs first in the pair, so the baseline after it shows the run went on.
    assert (
        main(
            [
                "pair",
                *TINY,
                "--arms",
                arms,
                "--order",
                "random",
                "--seed",
                "1",
                "--warmup",
                "0",
                "--pairs",
                "1",
                "--out",
                str(tmp_path),
                "--no-report",
            ]
        )
        == 3  # every trial of the dying arm failed: exit 3, the baseline's rows logged all the same
    )
    rows = only_run(tmp_path).rows()
    assert [r["arm"] for r in rows] == ["tests.workerfns:DiesMidFit", "baseline"]
    died, survivor = rows
    assert died["status"] == "error" and died["value"] is None
    assert "worker died without a result (exit -9)" in died["message"]
    assert survivor["status"] == "ok" and survivor["iterations"] == 4


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text().split() if (task / "children").exists() else []
        found |= {int(p) for p in text}
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(predicate, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the worker")
def test_a_killed_run_resumes_with_only_the_rest(tmp_path: Path) -> None:
    """The parent is SIGKILLed during trial 2; its worker dies with it; --resume runs trial 2 only."""
    command = [
        sys.executable,
        "-m",
        "harness.cli",
        "pair",
        *TINY,
        "--warmup",
        "0",
        "--pairs",
        "1",
        "--out",
        str(tmp_path),
        "--no-report",
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(p.name.startswith("pair-") for p in tmp_path.glob("*")))
        folder = only_run(tmp_path)
        _wait_for(lambda: len(folder.rows()) == 1 and (folder.path / "trials" / "1.log").exists())
        _wait_for(lambda: bool(_children(process.pid)))
        workers = _children(process.pid)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    _wait_for(lambda: not any(_alive(w) for w in workers), timeout=60)  # no orphaned fit left running
    before = folder.rows()
    assert [r["index"] for r in before] == [0]

    assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report"]) == 0
    after = folder.rows()
    # the resume's warm-up first (index 2, outside the schedule), then the rest of the pair
    assert [(r["index"], r["phase"]) for r in after] == [(0, "measured"), (2, "warmup"), (1, "measured")]
    assert after[0] == before[0]  # the finished trial was kept, not re-run
    assert all(r["status"] == "ok" for r in after)
    assert folder.file("claim.txt").is_file()


@pytest.mark.slow
def test_stop_after_stops_before_a_first_fit_too_long_and_resume_finishes(tmp_path: Path, capsys) -> None:
    """--stop-after 1: the untimed first fit alone runs past it, so its worker is ended and nothing is logged.

    The resume runs every trial. Pairs stopped between are in `test_first_estimate`.
    """
    argv = ["pair", *TINY, "--warmup", "0", "--pairs", "2", "--stop-after", "1", "--out", str(tmp_path)]
    assert main([*argv, "--no-report"]) == 130
    folder = only_run(tmp_path)
    assert folder.rows() == []
    assert "stopping before the first trial: it alone runs past --stop-after" in capsys.readouterr().err
    assert not (folder.path / "probe").exists()
    assert main(["pair", "--resume", str(folder.path), "--quiet", "--no-report"]) == 0
    assert sorted(r["index"] for r in folder.rows() if r["phase"] == "measured") == [0, 1, 2, 3]
    assert [r["phase"] for r in folder.rows()] == ["measured"] * 4  # an empty log resumes as a fresh start


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--steps", "100", "--images", "256"],
            "--steps 100 is not a whole number of epochs of 64 iterations",
        ),
        (["--images", "250"], "250 training images are not a whole number of batches of 4"),
        (["--workload", "bogus"], "--workload 'bogus' is not accepted"),
        (["--amp", "fp16"], "--amp fp16 needs a CUDA device"),
        (["--amp", "fp64"], "--amp 'fp64' is not accepted"),
        (["--data", "x.yaml"], "--data needs the real trainer"),
        (["--cache", "ssd"], "--cache 'ssd' is not accepted"),
        (["--imgsz", "4"], "--imgsz 4 is too small for the embedded model"),
        (["--arms", "baseline,nowhere:Nothing"], "--arms: arm 'nowhere:Nothing': cannot import module"),
        (["--pairs", "0"], "--pairs must be a positive whole number"),
        (["--stop-after", "0"], "--stop-after must be a positive number of seconds"),
        (["--workers", "-1"], "--workers must be zero or more"),
        (["--stages", "--bar", "8"], "--bar with --stages: a stages run is a diagnostic with no verdict"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_run_folder(tmp_path: Path, bench, arguments, message) -> None:
    out = tmp_path / "runs"
    workload = [] if "--workload" in arguments else ["--workload", "embedded"]  # an option is given once
    bench.refused(["pair", *workload, *arguments, "--out", str(out)], message)
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no CUDA device exists")
def test_cuda_where_there_is_none_is_refused(tmp_path: Path, capsys) -> None:
    assert main(["pair", "--workload", "embedded", "--device", "cuda", "--out", str(tmp_path / "r")]) == 2
    assert "no CUDA device is available here" in capsys.readouterr().err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_embedded_fit_on_cuda_records_peaks(tmp_path: Path, amp: str) -> None:
    assert (
        main(
            [
                "pair",
                *TINY,
                "--device",
                "cuda",
                "--amp",
                amp,
                "--warmup",
                "0",
                "--pairs",
                "1",
                "--no-report",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    rows = only_run(tmp_path).rows()
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    for row in rows:
        assert row["peak_allocated"] > 0 and row["peak_reserved"] >= row["peak_allocated"]
        assert row["iterations"] == 4


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_stages_on_cuda_cover_the_fit(tmp_path: Path) -> None:
    assert (
        main(
            [
                "pair",
                *TINY,
                "--device",
                "cuda",
                "--stages",
                "--warmup",
                "0",
                "--pairs",
                "1",
                "--no-report",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    for row in only_run(tmp_path).rows():
        assert row["status"] == "ok", row["message"]
        total = sum(row[stage_column(s)] for s in STAGES)
        assert abs(total - row["value"]) < 0.05 * row["value"]


@pytest.mark.parametrize(
    ("arms", "first", "verdict"),
    [
        (
            "baseline,candidate",
            "An A/A in effect on cpu: every compared arm ran the baseline's code",
            "withheld",
        ),
        ("baseline,candidate-cpu", "On cpu: baseline ran the per-parameter MuSGD", "against the 8% bar"),
    ],
)
def test_the_claim_opens_with_what_the_arms_ran(tmp_path: Path, arms: str, first: str, verdict: str) -> None:
    """claim.txt's first line names what each arm ran.

    Where the candidate ran the baseline's code (the candidate on the CPU), it calls the run an A/A in effect
    and withholds the verdict.
    """
    from experiments.fit.plan import make_plan
    from experiments.tiers import TIERS
    from harness.options import protocol_options
    from harness.run import Runner, RunOptions

    protocol = protocol_options(arms=arms, warmup=0, pairs=2, bar=8.0, device="cpu")
    plan = make_plan(protocol, FitSettings(workload="embedded", images=8, batch=4, steps=4, val_images=8))
    figures = [10.0, 9.0, 9.5, 10.5]  # by trial index: the untimed probe runs trial 0 once more
    runner = Runner(TIERS, RunOptions(out=tmp_path, quiet=True, report=False))
    folder = runner.start(plan, lambda ctx: {"value": figures[ctx.trial.index]}).folder
    claim = folder.file("claim.txt").read_text().splitlines()[1:]  # after the answer
    assert claim[0].startswith(first), claim[0]
    assert any(verdict in line for line in claim)
    if verdict == "withheld":
        assert claim[1].startswith("A/A in effect (noise, not a speed-up): Baseline median ")
        assert "verdict withheld: candidate ran the baseline's code" in claim[2]
        assert claim[3].startswith("Checks: ") and claim[3].count("attained, withheld)") == 2, claim[3]
    else:
        assert "candidate-cpu ran the batched path" in claim[0] and claim[1].startswith("Baseline median ")


def test_a_failed_arm_keeps_the_median_estimand_and_says_why_it_is_insufficient(tmp_path: Path) -> None:
    """A failed candidate trial keeps the median as the estimand: its interval ranks the failure slowest and
    stays the primary.
    """
    from experiments.fit.plan import make_plan
    from experiments.tiers import TIERS
    from harness.options import protocol_options
    from harness.run import Runner, RunOptions

    def run(pairs: int, figures: list[float | None]) -> tuple[list[str], str]:
        protocol = protocol_options(
            arms="baseline,candidate-cpu", warmup=0, pairs=pairs, bar=8.0, device="cpu"
        )
        plan = make_plan(protocol, FitSettings(workload="embedded", images=8, batch=4, steps=4, val_images=8))
        values = iter(figures)

        def trial(ctx):
            value = next(values)
            if value is None:
                raise RuntimeError("the trial broke")
            return {"value": value}

        out = tmp_path / str(pairs)
        folder = Runner(TIERS, RunOptions(out=out, quiet=True, report=False)).start(plan, trial).folder
        basis = str(Run.load(folder).summaries.claims["verdict_basis"].iloc[0])
        return folder.file("claim.txt").read_text().splitlines(), basis

    claim, basis = run(2, [10.0, None, 9.5, 10.5])
    assert any("order-statistic interval of the median reduction" in line for line in claim), claim
    assert basis == "primary"
    claim, _ = run(1, [10.0, 9.0])
    assert any("95% needs 5" in line for line in claim), claim


def user_set(root: Path, train: int, val: int = 2) -> Path:
    """A YOLO-format data.yaml whose splits hold ``train`` and ``val`` image files (counted, never opened)."""
    for split, count in (("train", train), ("val", val)):
        (root / "images" / split).mkdir(parents=True)
        for index in range(count):
            (root / "images" / split / f"{index}.jpg").write_bytes(b"")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: a\n")
    return root / "data.yaml"


@pytest.mark.skipif(not ULTRALYTICS, reason="--data needs the real trainer (the ultralytics extra)")
def test_with_data_a_batch_that_does_not_divide_the_set_suggests_another_batch(tmp_path: Path) -> None:
    """--data fixes the image count, so the hint names batches that divide it, never --images."""
    from experiments.fit.plan import make_plan
    from harness.options import protocol_options

    protocol = protocol_options(arms="baseline,candidate", device="cpu")
    data = user_set(tmp_path, train=10)
    with pytest.raises(InputError) as refused:
        make_plan(protocol, FitSettings(workload="ultralytics", data=str(data), batch=3, steps=4))
    message = str(refused.value)
    assert "--images" not in message and "--batch 2 or --batch 5" in message, message
    assert "--data has 10 training images" in message
    with pytest.raises(InputError, match=r"use a multiple of 2 \(e\.g\. --steps 4 or 2\)"):
        make_plan(protocol, FitSettings(workload="ultralytics", data=str(data), batch=5, steps=3))


@pytest.mark.skipif(not ULTRALYTICS, reason="the note concerns the real trainer (the ultralytics extra)")
def test_the_cpu_note_of_the_real_trainer_follows_the_fit_asked() -> None:
    """The note's estimate follows --steps, --imgsz and the fits scheduled; a fit estimated short gets none."""
    from experiments.fit.plan import _minutes, estimated_cpu_fit_seconds, make_plan
    from harness.options import protocol_options

    def notes(**settings) -> list[str]:
        said: list[str] = []
        protocol = protocol_options(arms="baseline,candidate-cpu", device="cpu", pairs=1, warmup=0)
        make_plan(protocol, FitSettings(workload="ultralytics", **settings), announce=said.append)
        return [line for line in said if line.startswith("note: the real trainer on the CPU")]

    (default,) = notes()  # 384 steps of batch 4 at 640 px over 6 epochs, validating 32 images each
    assert f"an estimated {_minutes(estimated_cpu_fit_seconds(384, 6, 4, 640, 32))} per fit" in default
    assert "(384 steps of batch 4 at 640 px" in default and "for the 2 fits" in default
    assert notes(steps=4, images=8, imgsz=64, val_images=8) == []  # seconds, not minutes: no note
    (short,) = notes(steps=4, images=8, imgsz=640, val_images=8)
    assert "(4 steps of batch 4 at 640 px" in short
    assert estimated_cpu_fit_seconds(768, 6, 4, 640, 32) > 1.9 * estimated_cpu_fit_seconds(384, 6, 4, 640, 32)
    assert estimated_cpu_fit_seconds(384, 6, 4, 320, 32) == estimated_cpu_fit_seconds(384, 6, 4, 640, 32) / 4


def test_the_embedded_workload_is_shorter_by_default_on_the_cpu_only() -> None:
    """On the CPU the embedded default is 64 steps of 128 images (2 epochs × 32), said before the run.

    Given values, CUDA and the real trainer keep 384 steps of 256 images.
    """
    from experiments.fit.plan import make_plan
    from harness.protocol_options import ProtocolOptions
    from harness.schedule import Arm

    arms = (Arm("baseline", "baseline", "baseline"), Arm("candidate", "candidate", "candidate"))

    def planned(device: str, **settings) -> tuple[FitSettings, list[str]]:
        said: list[str] = []
        plan = make_plan(ProtocolOptions(arms, device=device), FitSettings(**settings), announce=said.append)
        return FitSettings.from_dict(plan.settings), said

    cpu, said = planned("cpu", workload="embedded")
    assert (cpu.steps, cpu.images, cpu.epochs, cpu.iterations_per_epoch) == (64, 128, 2, 32)
    assert any(
        line.startswith(
            "fit: 64 steps of 128 images = 2 epochs × 32 iterations (128 images and 64 steps: the embedded "
            "workload's CPU default"
        )
        for line in said
    )
    _, said = planned("cpu", workload="embedded", steps=384)
    (note,) = [line for line in said if line.startswith("fit:")]
    assert note.startswith("fit: 384 steps of 128 images = 12 epochs × 32 iterations (128 images: ")
    gpu, said = planned("cuda", workload="embedded")
    assert (gpu.steps, gpu.images) == (384, 256) and not any(line.startswith("fit:") for line in said)
    given, said = planned("cpu", workload="embedded", steps=384, images=256)
    assert (given.steps, given.images) == (384, 256) and not any(line.startswith("fit:") for line in said)
    if ULTRALYTICS:
        real, _ = planned("cpu", workload="ultralytics")
        assert (real.steps, real.images, real.imgsz) == (384, 256, 640)


def test_the_embedded_fit_logs_each_epoch(tmp_path: Path, capsys) -> None:
    """A worker's `trials/N.log` is its stdout.

    The embedded fit prints one line per epoch: train loss, validation loss and accuracy, host seconds. A last
    line covers the whole fit.
    """
    from experiments.arms import make_optimizer
    from experiments.fit import embedded
    from harness.timing import NullClock

    result = embedded.fit(
        lambda groups, kwargs: make_optimizer("baseline", groups, kwargs),
        FitSettings(workload="embedded", steps=4, images=8, val_images=8, imgsz=16, batch=4, amp="fp32"),
        device="cpu",
        data_seed=0,
        seed=0,
        trial_dir=tmp_path,
        clock=NullClock(),
    )
    lines = capsys.readouterr().out.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1/2", "epoch 2/2"]
    for line in epochs:
        assert (
            "train loss " in line and "val loss " in line and "val accuracy " in line and line.endswith(" s")
        )
    assert f"val accuracy {result['val_accuracy']:.4f}" in epochs[-1]
    assert lines[0].startswith(
        "embedded fit: 2 epochs × 2 iterations of batch 4 at 16 px, fp32, optimizers.musgd.MuSGD"
    )
    assert lines[-1].startswith("fit done: 4 iterations in ")
