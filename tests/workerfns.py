"""What worker processes and ranks import from the tests: test-only arms and targets, by `module:name`.

A trial's worker, and each rank of a data-parallel trial, imports the module its arm or target names. A test
module imports the whole CLI and pytest: 3-5 s of CPU on a busy two-core runner. This module imports torch and
the optimizers only, so a worker pays for what it runs. Keep it that way: what the tests themselves need stays
in them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from optimizers import BatchedMuSGD, MuSGD
from optimizers.batched import batched_on_cpu

# --- tests/experiments/fit/test_fit.py: a worker that dies mid-fit


class DiesMidFit(MuSGD):
    """An optimizer whose process is killed (SIGKILL) at its second step: a worker that dies mid-fit."""

    def step(self, closure=None):  # type: ignore[override]
        self.steps_taken = getattr(self, "steps_taken", 0) + 1
        if self.steps_taken == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(closure)


# --- tests/experiments/fit/test_fit_faults.py: a fit whose parameters turn NaN at its last step


class NaNAtLastStep(MuSGD):
    """An optimizer that writes NaN into every parameter at its fourth step, a tiny fit's last.

    The loss read before each step stays finite, so only the end-of-trial check sees it.
    """

    LAST_STEP = 4

    def step(self, closure=None):  # type: ignore[override]
        loss = super().step(closure)
        self.steps_taken = getattr(self, "steps_taken", 0) + 1
        if self.steps_taken == self.LAST_STEP:
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        p.fill_(float("nan"))
        return loss


# --- tests/harness/test_quiet.py: what a placed worker sees


def report_affinity(payload: dict) -> dict:
    """A worker target: its own allowed cores and thread settings, and those of a child it starts (as a
    DataLoader worker would be started)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {
        "value": 1.0,
        "worker_cores": sorted(os.sched_getaffinity(0)),
        "child_cores": json.loads(child.stdout),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads(),
    }


# --- tests/experiments/fit/test_ddp.py: data-parallel arms, the real trainer's DDP launch file, the
# distributed screen's rank


PIDS_ENV = "TEST_DDP_PIDS"  # a folder where test arms write the pids of their ranks and launchers


class CpuBatchedCandidate(BatchedMuSGD):
    """The candidate with CPU tensors on its batched path (test-only switch): it shares across CPU ranks."""

    def step(self, closure: Any = None) -> Any:
        with batched_on_cpu():
            return super().step(closure)


def _note_pids() -> None:
    """In a rank only (``RANK`` set by the launcher): the parent builds every arm once before the schedule too."""
    folder = os.environ.get(PIDS_ENV)
    if folder and "RANK" in os.environ:
        Path(folder, f"{os.getpid()}").write_text(str(os.getppid()))


class DiesOnRankOne(MuSGD):
    """The baseline, except that rank 1 SIGKILLs itself at its second step: a rank that dies mid-fit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _note_pids()
        self.steps_taken = 0

    def step(self, closure: Any = None) -> Any:
        self.steps_taken += 1
        if self.steps_taken == 2 and os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(closure)


class NotesPids(MuSGD):
    """The baseline, writing its rank's pid and its launcher's where the test can find them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _note_pids()


def generate_launch_file(data_yaml: str, project: str) -> None:
    """In a fresh launching worker (`RANK` unset): build the DDP trainer as the tier does, on the CPU.

    Write Ultralytics' DDP launch file for it and print the file's path.
    """
    from ultralytics.utils.dist import generate_ddp_file

    from experiments.fit.ultralytics_ddp import RankTrainer

    overrides = {
        "model": "yolo26n.yaml",
        "data": data_yaml,
        "device": "cpu",
        "project": project,
        "name": "fit",
    }
    overrides.update(epochs=1, imgsz=64, batch=4, optimizer="MuSGD", plots=False, workers=0, verbose=False)
    trainer = RankTrainer(overrides=overrides)
    assert type(trainer) is RankTrainer and trainer._bench is None  # the launcher is plain upstream
    print(generate_ddp_file(trainer))


def run_launch_file_as_rank(launch_file: str, out: str) -> None:
    """In a fresh process set up as rank 0 of 2: run the generated launch file as torch.distributed.run would.

    Its trainer call is replaced by a check of the trainer it built: its class, its bench side, its optimizer.
    """
    import json as _json
    import runpy

    from experiments.fit import ultralytics_ddp

    def check(trainer: Any) -> None:
        model = trainer.get_model(cfg="yolo26n.yaml", weights=None, verbose=False)
        optimizer = trainer.build_optimizer(model, name="MuSGD", lr=0.01, momentum=0.9, decay=5e-4)
        Path(out).write_text(
            _json.dumps(
                {
                    "classes": [f"{c.__module__}.{c.__qualname__}" for c in type(trainer).__mro__[:4]],
                    "device": trainer._bench.device,
                    "optimizer": f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
                    "groups": [g.get("param_group") for g in optimizer.param_groups],
                }
            )
        )

    ultralytics_ddp.RankTrainer.train = check
    runpy.run_path(launch_file, run_name="__main__")


def tiny_screen_rank(payload: dict[str, Any]) -> dict[str, Any]:
    """The distributed screen's rank program on a tiny parameter set; the YOLO26 sets take minutes per step on
    two cores.

    Everything else runs as in `experiments.screen.ranks`.
    """
    from experiments.screen import ranks, trial

    def fresh(self: Any, scale: str, seed: int, dtype: torch.dtype, device: str) -> tuple[list, dict]:
        generator = torch.Generator().manual_seed(seed)
        shapes = [(16, 8, 3, 3), (32, 16, 1, 1), (64, 16), (16, 40)] + [(24, 24)] * 5
        muon = [torch.nn.Parameter(torch.randn(s, generator=generator, dtype=dtype) * 0.02) for s in shapes]
        bias = [torch.nn.Parameter(torch.zeros(16, dtype=dtype))]
        for p in muon + bias:
            p.grad = torch.randn(p.shape, generator=generator, dtype=dtype) * 0.01
        common = {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}
        return [
            {"params": muon, "use_muon": True, **common},
            {"params": bias, "use_muon": False, **common},
        ], {
            "muon": 0.2,
            "sgd": 1.0,
        }

    trial.WorkloadCache.fresh = fresh
    return ranks.measure_in_rank(payload)


def aborts_at_exit(payload: dict[str, Any]) -> dict[str, Any]:
    """A rank whose interpreter aborts while it tears down, after its result is in.

    Torch's gloo teardown did so about one rank exit in five on a loaded two-core runner (SIGABRT, no Python
    frame). An exit handler makes it certain here.
    """
    import atexit

    atexit.register(os.abort)
    return {"rank": int(os.environ["RANK"]), **payload}
