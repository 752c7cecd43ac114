"""Data-parallel trials (`--gpus N`): the option and its checks, and a 2-rank gloo fit through `bench pair`
end to end.

Also a rank that dies, the real trainer's DDP launch file, the distributed screen and the ranks parity.

The ranks are real processes started by torch.distributed.run on two CPU ranks (gloo), so the fits are tiny.
The candidate shares Newton-Schulz only where it batches. `CpuBatchedCandidate` (in tests/workerfns.py, which
the ranks import) takes the batched path on CPU tensors. So the sharing is exercised without a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments.fit.plan import FitSettings
from harness.cli import main
from harness.errors import InputError
from harness.options import protocol_options, split_device_list
from tests import child_env
from tests.argv import BENCH, ONE_PAIR, overridden
from tests.argv import TINY_FIT as TINY
from tests.processes import assert_gone, started
from tests.runfolders import only_run
from tests.workerfns import PIDS_ENV

RANKS = ["--gpus", "2", "--device", "cpu", "--quiet"]


# --- the option ------------------------------------------------------------------------------------------


def test_a_device_list_names_the_first_device_and_the_rank_count() -> None:
    assert split_device_list("cuda:0,1", 1) == ("cuda:0", 2)
    assert split_device_list("cuda:2,3,4", 3) == ("cuda:2", 3)
    assert split_device_list("cpu", 2) == ("cpu", 2)
    with pytest.raises(InputError, match="must be consecutive"):
        split_device_list("cuda:0,2", 1)
    with pytest.raises(InputError, match="names 2 devices but --gpus is 3"):
        split_device_list("cuda:0,1", 3)


def test_ranks_on_the_cpu_are_gloo_ranks_of_the_cpu() -> None:
    options = protocol_options(device="cpu", gpus=2)
    assert options.gpus == 2 and options.rank_devices == ("cpu", "cpu") and options.backend == "gloo"
    assert protocol_options(device="cpu").rank_devices == ("cpu",)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["pair", *TINY, "--gpus", "0"], "--gpus must be a positive whole number"),
        (
            ["pair", *overridden(TINY, ["--gpus", "2", "--batch", "5", "--images", "10", "--steps", "4"])],
            "--batch 5 is the global",
        ),
        (
            ["pair", *TINY, "--gpus", "2", "--order", "duet", "--cpus", "auto"],
            "concurrent trials of several ranks",
        ),
        (["pair", *TINY, "--torchrun", "--nnodes 2"], "--torchrun passes rendezvous options"),
        (["pair", *TINY, "--gpus", "2", "--torchrun", "'open"], "is not a command line"),
        (
            ["pair", *TINY, "--gpus", "2", "--torchrun", "--bogus-flag 1"],
            "not torch.distributed.run's options",
        ),
        (["pair", *TINY, "--gpus", "2", "--torchrun", "rm -rf /"], "not torch.distributed.run's options"),
        (["probe", "--gpus", "2"], "the probe measures one device's memory"),
    ],
)
def test_bad_rank_options_are_one_line_exit_2_and_no_run_folder(
    tmp_path: Path, bench, arguments: list[str], message: str
) -> None:
    out = tmp_path / "runs"
    bench.refused([*arguments, "--device", "cpu", "--out", str(out)], message)
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals where no CUDA device exists")
def test_cuda_ranks_where_there_are_none_are_refused(tmp_path: Path, capsys) -> None:
    assert main(["pair", *TINY, "--device", "cuda:0,1", "--out", str(tmp_path / "r")]) == 2
    assert "no CUDA device is available here" in capsys.readouterr().err
    with pytest.raises(InputError, match="Ultralytics' DDP launch needs CUDA devices"):
        from experiments.fit.plan import make_plan

        make_plan(protocol_options(device="cpu", gpus=2), FitSettings(workload="ultralytics"))


# --- the embedded fit on two gloo ranks ----------------------------------------------------------------------


@pytest.mark.slow
def test_two_rank_fits_through_bench_pair_end_to_end(tmp_path: Path) -> None:
    """One pair of 2-rank fits: rank 0's bracket is the figure, and every rank's peaks and share are in the
    row.

    The candidate shares its Newton-Schulz over the ranks and the baseline does not. Each rank has its log.
    """
    arms = "baseline,tests.workerfns:CpuBatchedCandidate"
    assert main(["pair", *TINY, *RANKS, "--arms", arms, *ONE_PAIR, "--out", str(tmp_path)]) == 0
    folder = only_run(tmp_path)
    rows = folder.rows()
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    by_arm = {r["arm"]: r for r in rows}
    for row in rows:
        assert row["ranks"] == 2 and row["backend"] == "gloo" and row["case_ranks"] == 2
        assert row["case_batch_per_rank"] == 2 and row["iterations"] == 4
        assert row["value"] == row["rank_seconds"][0] > 0 and len(row["rank_seconds"]) == 2
        assert (
            row["rank_peak_allocated"] == [None, None] and row["peak_allocated_sum"] is None
        )  # CPU: no peaks
        assert row["checkpoint_bytes"] > 0  # rank 0 wrote them
        for rank in (0, 1):
            log = folder.path / "trials" / f"{row['index']}.rank{rank}.log"
            assert log.is_file()
    if hasattr(
        os, "sched_setaffinity"
    ):  # --cpus auto (the default): each rank on its share of the worker cores
        from harness.isolation import rank_placements
        from harness.placement import choose_placement, format_cores

        share = rank_placements(choose_placement("auto"), 2)[0]
        for row in rows:
            assert row["placed_cores"] == format_cores(share.worker_cores)
            assert row["placed_torch_threads"] == share.torch_threads
    candidate, baseline = by_arm["tests.workerfns:CpuBatchedCandidate"], by_arm["baseline"]
    assert candidate["sharing_world"] == 2 and candidate["sharing_note"] == ""
    here = candidate["rank_matrices_here"]
    assert sum(here) == candidate["sharing_matrices"] and all(
        0 < h < candidate["sharing_matrices"] for h in here
    )
    assert baseline["sharing_world"] is None and baseline["rank_matrices_here"] == [None, None]
    assert baseline["optimizer_class"] == "optimizers.musgd.MuSGD"
    report = folder.file("report.md").read_text()
    assert "2 ranks per trial, data-parallel (gloo" in report
    assert "peak allocated (sum over ranks)" in report and "NS matrices per rank" in report
    assert "rank 0 of 2 (gloo)" in folder.file("claim.txt").read_text()


def test_rank_zeros_wait_for_the_slowest_rank_is_inside_its_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bracket closes after a barrier, so rank 0's wait there for a slower rank is part of its fit.

    Its stages must hold that wait too. Otherwise `test_a_two_rank_stages_run_attributes_rank_zeros_fit`
    refuses stages summing to 93%.
    """
    from experiments.fit import worker as ddp
    from experiments.fit.stages import STAGES
    from harness.timing import StageClock

    monkeypatch.setattr(ddp, "barrier", lambda device: time.sleep(0.05))  # the slowest rank, 50 ms behind
    clock = StageClock("cpu")
    with ddp.RankBracket("cpu", clock) as bracket:
        clock.mark("data")
    attributed = sum(clock.totals(STAGES).values())
    assert bracket.seconds > 0.05 and abs(attributed - bracket.seconds) < 0.002


@pytest.mark.slow
def test_a_two_rank_stages_run_attributes_rank_zeros_fit(tmp_path: Path) -> None:
    """`--stages --gpus 2`: rank 0 marks its stages (synchronized), and they add up to its bracket."""
    from experiments.fit.stages import STAGES, stage_column

    arguments = ["pair", *TINY, *RANKS, "--stages", "--arms", "baseline", "--control", "--no-report"]
    assert main([*arguments, *ONE_PAIR, "--out", str(tmp_path)]) == 0
    rows = only_run(tmp_path).rows()
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    for row in rows:
        stages = [row[stage_column(s)] for s in STAGES]
        assert row[stage_column("optimizer")] > 0 and row[stage_column("forward_backward")] > 0
        assert abs(sum(stages) - row["value"]) < 0.05 * row["value"] and row["ranks"] == 2


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc to check that no rank survives")
def test_a_rank_that_dies_fails_its_trial_leaves_nothing_running_and_the_run_goes_on(
    tmp_path: Path, monkeypatch
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv(PIDS_ENV, str(pids))
    arms = "tests.workerfns:DiesOnRankOne,baseline"
    runs = tmp_path / "runs"
    # Every trial of the dying arm failed.
    assert main(["pair", *TINY, *RANKS, "--arms", arms, *ONE_PAIR, "--out", str(runs)]) == 3
    rows = only_run(runs).rows()
    assert [r["arm"] for r in rows] == ["tests.workerfns:DiesOnRankOne", "baseline"]
    died, survivor = rows
    assert died["status"] == "error" and died["value"] is None
    assert "rank 1 died without a result (exitcode -9 (SIGKILL)" in died["message"], died["message"]
    assert survivor["status"] == "ok" and survivor["ranks"] == 2
    ranks = {int(p.name) for p in pids.iterdir()}
    launchers = {int(p.read_text()) for p in pids.iterdir()}
    # Two ranks under one launcher, twice: the dying arm's untimed first run (the estimate) and its trial.
    assert len(ranks) == 4 and len(launchers) == 2
    assert_gone(ranks | launchers, timeout=30)


def test_a_rank_whose_teardown_aborts_after_its_result_is_in_still_gives_the_result(tmp_path: Path) -> None:
    """A rank's result is final once written: the process leaves without the interpreter's teardown.

    So a teardown that aborts, as gloo's does now and then on a loaded runner, cannot fail a finished trial.
    """
    from harness.isolation import run_in_ranks

    log = tmp_path / "ranks.log"
    value = run_in_ranks("tests.workerfns:aborts_at_exit", {"figure": 1.5}, 2, timeout_s=120, log_path=log)
    assert value["rank"] == 0 and value["figure"] == 1.5
    assert "SIGABRT" not in log.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc to check that no rank survives")
def test_ranks_and_their_launcher_end_when_the_run_is_killed(tmp_path: Path) -> None:
    """The parent is SIGKILLed mid-trial: the ranks see its end (their watchdog) and go, and so does the launcher."""
    pids = tmp_path / "pids"
    pids.mkdir()
    long_fit = overridden(TINY, ["--steps", "2000"])
    command = [*BENCH, "pair", *long_fit, *RANKS, "--arms", "tests.workerfns:NotesPids", "--control"]
    command += [*ONE_PAIR, "--no-report", "--out", str(tmp_path / "runs")]
    env = child_env(**{PIDS_ENV: str(pids)})
    with started(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as process:
        deadline = time.monotonic() + 240
        while len(list(pids.iterdir())) < 2:
            assert time.monotonic() < deadline and process.poll() is None, "the ranks never started"
            time.sleep(0.2)
        time.sleep(1.0)  # the pid files are written as the optimizers are built: the fit is under way
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    ranks = {int(p.name) for p in pids.iterdir()}
    launchers = {int(p.read_text()) for p in pids.iterdir()}
    assert_gone(ranks | launchers, timeout=60)


# --- the real trainer's DDP launch ----------------------------------------------------------------------------

HAS_ULTRALYTICS = all(
    importlib.util.find_spec(n) is not None for n in ("ultralytics", "torchvision", "cloudpickle")
)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_ULTRALYTICS, reason="needs the ultralytics extra and cloudpickle")
def test_the_real_trainers_ddp_launch_file_builds_the_arms_trainer_in_a_fresh_rank(tmp_path: Path) -> None:
    """Ultralytics' own launch file, generated for our trainer, builds the arm's trainer in a fresh rank.

    Run in a process set up as a rank, it unpickles our class by reference. It builds the arm's trainer with
    its bench side. It substitutes the arm's optimizer over upstream's MuSGD groups. Left unchecked without a
    GPU: torch.distributed.run starting it, NCCL, and the CUDA-only fit.
    """
    import json as _json

    from experiments.fit.dataset import SyntheticSet, ensure_synthetic_set
    from experiments.fit.ultralytics_ddp import TRIAL_ENV, write_trial
    from experiments.fit.ultralytics_fit import offline_environment, prepare_config_dir

    config = tmp_path / "config"
    prepare_config_dir(config)
    data_yaml = ensure_synthetic_set(SyntheticSet(8, 8, 64, 0), tmp_path / "data")
    env = child_env(**offline_environment(config))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", TRIAL_ENV):
        env.pop(name, None)
    generate = (
        f"from tests.workerfns import generate_launch_file as g; g({str(data_yaml)!r}, {str(tmp_path)!r})"
    )
    made = subprocess.run(
        [sys.executable, "-c", generate], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr[-3000:]
    launch_file = made.stdout.strip().splitlines()[-1]
    assert Path(launch_file).is_file() and Path(launch_file).with_suffix(".pt").is_file()
    assert Path(launch_file).parent == config / "Ultralytics" / "DDP"  # in the worker's own config dir

    trial_dir = tmp_path / "trial"
    settings = FitSettings(workload="ultralytics", batch=4)
    payload = {"arm_spec": "candidate", "devices": ["cuda:0", "cuda:1"], "budget": None}
    rank_env = {**env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    rank_env[TRIAL_ENV] = str(write_trial(payload, settings, trial_dir))
    out = tmp_path / "rank0.json"
    run = f"from tests.workerfns import run_launch_file_as_rank as r; r({launch_file!r}, {str(out)!r})"
    ran = subprocess.run(
        [sys.executable, "-c", run], env=rank_env, cwd=tmp_path, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = _json.loads(out.read_text())
    assert seen["classes"][1:3] == [
        "experiments.fit.ultralytics_ddp.RankTrainer",
        "ultralytics.models.yolo.detect.train.DetectionTrainer",
    ]
    assert seen["classes"][0].endswith("make_trainer_class.<locals>.ArmTrainer")  # the arm's trainer
    assert seen["device"] == "cuda:0"
    assert seen["optimizer"] == "optimizers.batched.BatchedMuSGD"
    assert set(seen["groups"]) >= {"muon", "bn", "bias"}


# --- the distributed screen -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_distributed_screen_times_each_rank_and_the_collectives_share(
    tmp_path: Path, monkeypatch
) -> None:
    """`bench screen --gpus 2` on two gloo ranks: the slowest rank's window is the figure, and each rank's is
    in the row.

    The candidate gathers once per step and shares its matrices; the baseline has no collective.
    """
    from experiments.screen import ranks

    monkeypatch.setattr(ranks, "RANK_TARGET", "tests.workerfns:tiny_screen_rank")
    arms = "baseline,tests.workerfns:CpuBatchedCandidate"
    arguments = ["screen", "--scales", "n", "--guards", "none", "--arms", arms, "--steps", "3"]
    assert main([*arguments, "--warmup-steps", "1", *ONE_PAIR, *RANKS, "--out", str(tmp_path)]) == 0
    folder = only_run(tmp_path)
    rows = {r["arm"].split("@")[0]: r for r in folder.rows()}
    assert all(r["status"] == "ok" for r in rows.values()), [r["message"] for r in rows.values()]
    for row in rows.values():
        assert row["ranks"] == 2 and row["value"] == max(row["rank_ms"]) > 0 and len(row["rank_host_ms"]) == 2
        assert row["floor_ms"] is None and "distributed screen" in row["floor_note"]
        assert row["diagnostic_step_ms"] > 0
    candidate, baseline = rows["tests.workerfns:CpuBatchedCandidate"], rows["baseline"]
    assert candidate["collectives"] == 1 and 0 < candidate["collective_ms"] < candidate["diagnostic_step_ms"]
    assert 0 < candidate["collective_share"] < 1 and sum(candidate["rank_matrices_here"]) == 9
    assert candidate["sharing_world"] == 2
    assert (
        baseline["collectives"] == 0
        and baseline["collective_share"] == 0
        and baseline["sharing_world"] is None
    )
    report = folder.file("report.md").read_text()
    assert "#### Under a process group of 2 ranks (gloo: cpu, cpu)" in report and "every rank: all" in report
    summary = folder.file("screen_summary.csv").read_text()
    assert "collective_share_median" in summary


# --- parity over ranks ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_parity_over_two_ranks_follows_the_one_rank_candidate_bit_for_bit_on_the_cpu(tmp_path: Path) -> None:
    """`bench parity --gpus 2 --fit`: the candidate on two gloo ranks against the one-rank candidate, two real
    steps.

    On the CPU it is batched, so sharing. The result is bit for bit, every rank equal to rank 0, the contract
    held.
    """
    arguments = ["parity", "--fit", "--candidate", "tests.workerfns:CpuBatchedCandidate", "--steps", "2"]
    assert main([*arguments, "--gpus", "2", "--device", "cpu", "--quiet", "--out", str(tmp_path)]) == 0
    folder = only_run(tmp_path)
    rows = [r for r in folder.rows() if r["case"] == "ranks"]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["status"] == "ok" and row["ranks_agree"] is True and row["ranks"] == 2
        assert row["params_equal"] == row["params_total"] and row["buffers_equal"] == row["buffers_total"]
        assert row["max_abs_diff"] == 0
    assert (
        rows[0]["bound_worst_ratio"] == 0 and "rank 0 of 2 orthogonalized 3 of 6" in rows[0]["sharing_text"]
    )
    claim = folder.file("claim.txt").read_text()
    assert claim.startswith("One-step contract: holds")
    report = folder.file("report.md").read_text()
    assert "| ranks: every rank holds rank 0's parameters | yes |" in report
    assert "after one step they agree bit for bit" in report
    assert not list((folder.path / "ranks-steps").iterdir())  # every saved step was compared and removed


# --- on two or more GPUs (run by the lead on an H200 ×2) -------------------------------------------------------------

TWO_GPUS = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices"
)


@pytest.mark.cuda
@TWO_GPUS
def test_cuda_two_gpu_embedded_fits_share_newton_schulz_and_record_each_ranks_peaks(tmp_path: Path) -> None:
    arguments = ["pair", *TINY, "--gpus", "2", "--device", "cuda", "--quiet", "--no-report"]
    assert main([*arguments, *ONE_PAIR, "--out", str(tmp_path)]) == 0
    rows = {r["arm"]: r for r in only_run(tmp_path).rows()}
    assert all(r["status"] == "ok" for r in rows.values()), [r["message"] for r in rows.values()]
    for row in rows.values():
        assert row["backend"] == "nccl" and row["ranks"] == 2
        assert all(p > 0 for p in row["rank_peak_allocated"])
        assert row["peak_allocated"] == max(row["rank_peak_allocated"])
        assert row["peak_allocated_sum"] == sum(row["rank_peak_allocated"])
    assert rows["candidate"]["sharing_world"] == 2 and rows["baseline"]["sharing_world"] is None


@pytest.mark.cuda
@TWO_GPUS
@pytest.mark.skipif(not HAS_ULTRALYTICS, reason="needs the ultralytics extra and cloudpickle")
def test_cuda_two_gpu_real_trainer_fit_through_ultralytics_ddp_launch(tmp_path: Path) -> None:
    arguments = ["pair", "--workload", "ultralytics", "--images", "16", "--val-images", "8", "--imgsz", "64"]
    arguments += ["--batch", "4", "--steps", "8", "--gpus", "2", "--device", "cuda", "--quiet", "--no-report"]
    assert main([*arguments, *ONE_PAIR, "--out", str(tmp_path)]) == 0
    rows = {r["arm"]: r for r in only_run(tmp_path).rows()}
    assert all(r["status"] == "ok" for r in rows.values()), [r["message"] for r in rows.values()]
    for row in rows.values():
        assert row["ranks"] == 2 and row["iterations"] == 8 and row["value"] == row["rank_seconds"][0]
        assert all(p > 0 for p in row["rank_peak_allocated"])
    assert rows["candidate"]["optimizer_class"] == "optimizers.batched.BatchedMuSGD"
    assert rows["candidate"]["sharing_world"] == 2 and rows["baseline"]["sharing_world"] is None


@pytest.mark.cuda
@TWO_GPUS
def test_cuda_parity_over_two_gpus_holds(tmp_path: Path) -> None:
    arguments = ["parity", "--steps", "2", "--gpus", "2", "--device", "cuda", "--quiet", "--no-report"]
    assert main([*arguments, "--out", str(tmp_path)]) == 0
    rows = [r for r in only_run(tmp_path).rows() if r["case"] == "ranks"]
    assert rows and all(r["status"] == "ok" and r["ranks_agree"] for r in rows)
    assert rows[0]["within_bound"] is True
