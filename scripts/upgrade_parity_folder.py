"""Turn a parity folder of the first format (``parity.json`` + ``divergence.csv``, written before parity was a
tier) into a run folder of today's (``plan.json`` + ``trials.jsonl``), losing nothing, so ``bench report``
regenerates it like every other run. The figures are copied as they were logged; nothing is recomputed.

    python scripts/upgrade_parity_folder.py reports/archive/h200-2026-11-29/parity-yolo26n-60-steps
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from experiments.parity import make_plan
from experiments.parity_steps import ParitySettings
from experiments.tiers import TIERS
from harness.folder_format import ENV, LOG, PLAN
from harness.protocol_options import ProtocolOptions
from harness.run import Runner
from harness.schedule import Arm
from harness.tables import RunFolder
from harness.trial import row_head

INTEGERS = ("step", "buffers_equal", "buffers_total", "params_equal", "params_total")
FLOATS = ("max_abs_diff", "max_rel_diff", "loss_reference", "loss_other")


def _cell(name: str, text: str) -> object:
    if text == "":
        return None
    if name in INTEGERS:
        return int(text)
    if name in FLOATS:
        return float(text)
    if name == "loss_bytes_equal":
        return text == "True"
    return text


def upgrade(path: Path) -> None:
    folder = RunFolder(path)
    if folder.file(PLAN).exists():
        raise SystemExit(f"{path} already has a {PLAN}")
    old = folder.read_json("parity.json")
    given = old["settings"]
    settings = ParitySettings(
        given["scale"], given["steps"], given["fit"], given["candidate"], given["baseline"]
    )
    arms = (
        Arm(settings.baseline, "baseline", settings.baseline),
        Arm(settings.candidate, "candidate", settings.candidate),
    )
    protocol = ProtocolOptions(
        arms, warmup=0, pairs=settings.steps, seed=given["seed"], device=given["device"]
    )
    plan = make_plan(protocol, settings, old["command"])
    plan.created = (folder.read_json(ENV) or {}).get("recorded", "")
    with open(folder.file("divergence.csv"), newline="", encoding="utf-8") as handle:
        logged = [{k: _cell(k, v) for k, v in row.items()} for row in csv.DictReader(handle)]
    by_key = {(row["comparison"], row["step"]): row for row in logged}
    folder.write_json(PLAN, plan.to_json())
    for trial in plan.schedule:
        figures = by_key[(trial.case, trial.round + 1)]
        row = {
            **row_head(plan, trial),
            "status": "ok",
            "message": "",
            "value": figures["max_abs_diff"],
            **figures,
        }
        if figures["step"] == 1:
            ratio = old["bound_worst_ratio"][trial.case]
            row.update(bound_worst_ratio=ratio, bound_largest=old["bound_largest"], within_bound=ratio <= 1.0)
            if not math.isfinite(ratio):
                row["bound_worst_ratio"] = None
        folder.append_row(row)
    folder.file("parity.json").unlink()
    Runner(TIERS).finish(folder)  # the tables and claim.txt, derived from the log as for any run
    print(f"{path}: {len(plan.schedule)} rows in {LOG}; now `bench report {path}`")


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        upgrade(Path(argument))
