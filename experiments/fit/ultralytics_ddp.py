"""The real trainer on several GPUs, through Ultralytics' own DDP launch (worker side only)."""

from __future__ import annotations

import json
import os
import subprocess
import traceback
from pathlib import Path
from typing import Any

import torch
from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.utils import RANK

from experiments.fit import ultralytics_fit, worker
from experiments.fit.plan import FitSettings
from experiments.fit.stages import stage_figures
from experiments.ranks import gather_records
from harness.isolation import WorkerDied, WorkerError, die_with_parent, guard_rank
from harness.timing import StageClock, apply_budget, is_out_of_memory, reset_peaks

TRIAL_ENV = "BENCH_DDP_TRIAL"


class RankSide:
    """A rank's share of the trial: its arm, clock, host stamps, bracket and where its record goes."""

    def __init__(self, trial: dict[str, Any], rank: int, local_rank: int) -> None:
        self.trial, self.rank = trial, rank
        self.device = trial["devices"][local_rank]
        self.make_optimizer = worker.arm_optimizer_factory(trial["arm_spec"])
        self.clock = StageClock(self.device, enabled=trial["stages"] and rank == 0)
        self.stamps: list[float] = []
        self.epoch_starts: list[float] = []
        self.bracket = worker.RankBracket(self.device, self.clock)

    def record(self, record: dict[str, Any]) -> None:
        path = Path(self.trial["records"]) / f"rank{self.rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)


class RankTrainer(DetectionTrainer):
    """Upstream's trainer in the launching worker; in a rank, the arm's trainer inside one bracket."""

    _bench: RankSide | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> RankTrainer:
        if cls is not RankTrainer or RANK == -1:
            return super().__new__(cls)
        guard_rank()  # first: die with the launcher and the trial's worker, write to this rank's log

        side = RankSide(
            json.loads(Path(os.environ[TRIAL_ENV]).read_text()), RANK, int(os.environ["LOCAL_RANK"])
        )
        arm_class = ultralytics_fit.make_trainer_class(
            side.make_optimizer, side.clock, side.stamps, side.epoch_starts, RankTrainer
        )
        trainer = super().__new__(arm_class)
        trainer._bench = side
        return trainer

    def _setup_ddp(self) -> None:
        super()._setup_ddp()
        side = self._bench
        if side is None:
            return
        apply_budget(side.trial.get("budget"), side.device)
        worker.import_ahead()
        reset_peaks(side.device)
        side.bracket.__enter__()

    def _do_train(self) -> None:
        side = self._bench
        if side is None:
            return super()._do_train()
        try:
            super()._do_train()
            side.bracket.__exit__(None, None, None)
            if self.batch_size != side.trial["batch"]:
                raise RuntimeError(
                    f"the trainer ran batch {self.batch_size}, not the {side.trial['batch']} asked"
                )
            sharing = getattr(self.optimizer, "sharing", None)
            records = gather_records(
                worker.rank_record(side.rank, side.bracket.seconds, side.device, sharing)
            )
            # rank 0 checks its model and figures here: modules do not travel in the record
            result = (
                worker.finite_checked(ultralytics_fit.fit_result(self, side.stamps, side.epoch_starts))
                if side.rank == 0
                else {}
            )
        except Exception as exc:
            traceback.print_exc()
            failure = {
                "type": type(exc).__name__,
                "message": str(exc),
                "out_of_memory": is_out_of_memory(exc),
            }
            side.record({"rank": side.rank, "exception": failure})
            raise
        stages = {}
        if side.clock.enabled:
            stages = stage_figures(side.clock, side.bracket.seconds, len(self.train_loader))
        side.record(
            dict(rank=side.rank, seconds=side.bracket.seconds, records=records, result=result, stages=stages)
        )


def write_trial(payload: dict[str, Any], settings: FitSettings, trial_dir: Path) -> Path:
    """The JSON every rank reads (named by ``BENCH_DDP_TRIAL``), and the folder of their records, made fresh."""
    records = trial_dir / "ranks"
    records.mkdir(parents=True)
    trial = {
        "arm_spec": payload["arm_spec"],
        "stages": settings.stages,
        "devices": payload["devices"],
        "budget": payload.get("budget"),
        "batch": settings.batch,
        "records": str(records),
    }
    path = trial_dir / "ddp-trial.json"
    path.write_text(json.dumps(trial))
    return path


def launch_fit(payload: dict[str, Any]) -> dict[str, Any]:
    """The trial worker's target: one data-parallel fit of the real trainer; rank 0's figures with every rank's."""
    die_with_parent(payload.get("parent_pid"))
    settings = FitSettings.from_dict(payload["settings"])
    trial_dir = worker.fresh_trial_dir(payload)
    os.environ[TRIAL_ENV] = str(write_trial(payload, settings, trial_dir))
    ultralytics_fit.configure_ultralytics()
    model = YOLO(settings.model, task="detect")
    arguments = ultralytics_fit.train_arguments(
        settings,
        payload["data_yaml"],
        ",".join(map(ultralytics_fit.device_argument, payload["devices"])),
        int(payload["seed"]),
        trial_dir,
    )
    try:
        model.train(trainer=RankTrainer, **arguments)
        launch_error = None
    except subprocess.CalledProcessError as exc:
        launch_error = exc
    records = {int(p.stem[4:]): json.loads(p.read_text()) for p in (trial_dir / "ranks").glob("rank*.json")}
    failed = sorted((r for r in records.values() if "exception" in r), key=lambda r: r["rank"])
    if failed:
        failure = failed[0]["exception"]
        message = f"{failure['type']} in rank {failed[0]['rank']}: {failure['message']}"
        if failure["out_of_memory"]:
            raise torch.OutOfMemoryError(message)
        raise WorkerError(message)
    if launch_error is not None or 0 not in records:
        missing = sorted(set(range(len(payload["devices"]))) - set(records))
        raise WorkerDied(
            f"Ultralytics' DDP launch ended without rank 0's record (ranks without one: {missing}; {launch_error})"
        )
    first = records[0]
    figures = worker.fit_figures(
        settings, first["result"], first["seconds"], None, None, StageClock(enabled=False)
    )
    figures.update(worker.rank_columns(first["records"]))
    figures.update(first["stages"])
    figures["backend"] = "nccl"
    return figures
