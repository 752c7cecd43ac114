"""The parity tier (``bench parity``): its plan, its trials, the ranks comparison and the verdict."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from experiments.arms import checked_optimizer, same_path_as_baseline
from experiments.parity_steps import (
    RANKS,
    STEP_FIELDS,
    ULP_SENSITIVITY_FACTOR,
    Comparison,
    ParityResult,
    ParitySettings,
    Trajectory,
    Workload,
    bound_fields,
    compare_tensors,
    divergence_table,
    figure_text,
    other_arm,
    parity_section,
    prepare,
    run_parity,
    ulp_sensitivity,
)
from experiments.ranks import gather_records, init_group, rank_device
from experiments.resume_check import arms_resume_problem
from harness.errors import InputError
from harness.folder_format import FIGURE_LIMIT, UINT64_MAX, RowField
from harness.isolation import run_in_ranks
from harness.limits import MAX_PAIRS
from harness.options import parse_arms
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import Arm, Case, ScheduledTrial
from harness.schema import check_fields
from harness.tier import BaseTier, Caveat, Run
from harness.trial import TrialContext, TrialFunction
from harness.validation import row_fields_problem, settings_problem

__all__ = [
    "STEP_FIELDS",
    "ULP_SENSITIVITY_FACTOR",
    "ParityResult",
    "ParitySettings",
    "run_parity",
    "ulp_sensitivity",
]

DIVERGENCE_CSV = "divergence.csv"


# What a parity plan records: its options as given (``ParitySettings``).
RECORDED_SHAPE = {"scale": str, "steps": int, "fit": bool, "candidate": str, "baseline": str}


def recorded_settings_problem(plan: Plan) -> str | None:
    """What is wrong with a parity plan's recorded settings (an edited plan.json), or None."""
    problem = settings_problem(plan.settings, RECORDED_SHAPE)
    if problem:
        return problem
    unknown = sorted(set(plan.settings) - set(RECORDED_SHAPE))
    if unknown:  # the settings are read back whole, as ParitySettings
        return f"settings has {', '.join(unknown)}, which a parity plan does not record"
    try:
        check_fields(ParitySettings(**plan.settings))
    except InputError as exc:
        return f"settings: {exc}"
    return None


# What the parity report reads of a finished step's row (``ParityResult.from_rows``): the comparison and step
# it is (needed), its counts and differences (needed; a relative difference against a parameter of zero can
# pass 10³⁰, so any finite number), the loss figures of a fit, the bound's ratio (null: past any bound).
COUNT = RowField(int, 0, UINT64_MAX, needed=True)
DIFFERENCE = RowField(float, 0.0, FIGURE_LIMIT, needed=True)
ROW_FIELDS = {
    "comparison": RowField(str, needed=True),
    "step": RowField(int, 1, MAX_PAIRS, needed=True),
    "buffers_equal": COUNT,
    "buffers_total": COUNT,
    "params_equal": COUNT,
    "params_total": COUNT,
    "max_abs_diff": DIFFERENCE,
    "max_rel_diff": RowField(float, 0.0, sys.float_info.max, needed=True),
    "loss_reference": RowField(float),
    "loss_other": RowField(float),
    "loss_bytes_equal": RowField(bool),
    "ranks_agree": RowField(bool),
    "ranks": RowField(int, 1, 2**31 - 1),
    "sharing_text": RowField(str),
    "bound_worst_ratio": RowField(float, 0.0, sys.float_info.max),
    "bound_largest": RowField(float, 0.0, FIGURE_LIMIT),
    "within_bound": RowField(bool),
}


def recorded_row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with the fields the parity report reads of a log row (``ROW_FIELDS``), or None.

    A step is its comparison's round + 1 and names that comparison: the step table and the contract read them."""
    problem = row_fields_problem(row, ROW_FIELDS)
    if problem:
        return problem
    index, step, round_ = row["index"], row.get("step"), row.get("round")
    if step is not None and isinstance(round_, int) and step != round_ + 1:
        return f"trial {index}'s step is {step}, but its round is {round_} (each step is its round + 1)"
    if row.get("comparison") is not None and row["comparison"] != row.get("case"):
        return f"trial {index}'s comparison is not {row.get('case')!r}, its case (each step names its comparison)"
    return None


def arms_of(arms: str | None, candidate: str | None) -> tuple[str, str]:
    """(baseline, candidate) specs from ``--arms`` (two arms, baseline first) or the deprecated ``--candidate``."""
    if arms is not None and candidate is not None:
        raise InputError("--candidate is --arms baseline,X; give --arms alone")
    if arms is None:
        return ParitySettings.baseline, candidate or ParitySettings.candidate
    parsed = parse_arms(arms, control=False)
    if len(parsed) != 2:
        raise InputError(
            f"--arms '{arms}': parity follows two arms, baseline first (e.g. baseline,candidate)"
        )
    return parsed[0].spec, parsed[1].spec


def make_plan(protocol: ProtocolOptions, settings: ParitySettings, command: str = "") -> Plan:
    """Check the parity options and describe the run: each comparison's steps, one trial per step."""
    check_fields(settings)
    if settings.candidate == settings.baseline:  # its case would hold one arm twice
        raise InputError(
            f"--candidate {settings.candidate} is the baseline: parity follows a candidate against it (the "
            "baseline against itself is the built-in control comparison); give another arm, e.g. --candidate "
            "candidate"
        )
    checked_optimizer(settings.candidate, option="--candidate")
    checked_optimizer(settings.baseline, option="--baseline")
    base, candidate, ranks = settings.baseline, settings.candidate, protocol.gpus
    reference = Arm(base, "baseline", base)
    control = Arm(f"{base}-control", "candidate", base)
    cases = [
        Case("control", {"comparison": "control"}, (reference, control)),
        Case("candidate", {"comparison": "candidate"}, (reference, Arm(candidate, "candidate", candidate))),
    ]
    if ranks > 1:
        one, many = (
            Arm(candidate, "baseline", candidate),
            Arm(f"{candidate}@{ranks}ranks", "candidate", candidate),
        )
        cases.append(Case(RANKS, {"comparison": RANKS, "ranks": ranks}, (one, many)))
    schedule = [
        ScheduledTrial(
            i * settings.steps + k, case.label, "measured", k, 0, "", case.arms[1].label, "candidate"
        )
        for i, case in enumerate(cases)
        for k in range(settings.steps)
    ]
    ranks_words = (
        f"; ranks: the candidate on {ranks} fresh ranks ({protocol.backend}, torch.distributed.run) against the "
        "one-rank candidate here"
    )
    return Plan(
        tier="parity",
        protocol=protocol,
        cases=cases,
        unit="",
        metric="largest parameter difference after the step",
        settings=asdict(settings),
        command=command,
        isolation="in-process; both trajectories of a comparison from identical state on identical inputs"
        + (ranks_words if ranks > 1 else ""),
        timed_region="nothing is timed: each trial is one step of both trajectories, compared after it",
        schedule=schedule,
    )


def trial_function(plan: Plan) -> TrialFunction:
    """One step of one comparison per trial; a comparison resumed mid-way replays its earlier steps unlogged."""
    settings = ParitySettings(**plan.settings)
    device, seed = plan.protocol.device, plan.protocol.seed
    prepare(settings, device)
    workload = Workload(settings, device, seed)
    comparisons: dict[str, Comparison] = {}
    ranks = RanksComparison(plan, workload) if plan.protocol.gpus > 1 else None

    def trial(ctx: TrialContext) -> dict[str, Any]:
        name, step = ctx.case.label, ctx.trial.round + 1
        if name == RANKS and ranks is not None:
            row = ranks.step(step, ctx.run_dir)
            return {"value": row["max_abs_diff"], **row}
        comparison = comparisons.get(name)
        if comparison is None or comparison.steps_done >= step:
            comparison = comparisons[name] = Comparison(
                name, workload, settings.baseline, other_arm(settings, name)
            )
        while comparison.steps_done < step - 1:
            comparison.step()
        row = comparison.step()
        return {"value": row["max_abs_diff"], **row}

    return trial


RANKS_TARGET = "experiments.parity:trajectory_in_rank"
RANKS_TIMEOUT_S = 3600


def _snapshot(mine: Trajectory) -> dict[str, Any]:
    """A trajectory's parameters and tensor state, copied to the CPU."""
    return {
        "params": [p.detach().cpu().clone() for p in mine.params],
        "state": [_cpu_tensors(state, clone=True) for state in mine.buffers()],
    }


def _cpu_tensors(state: dict[str, Any], clone: bool = False) -> dict[str, torch.Tensor]:
    """The tensors of one parameter's optimizer state, on the CPU."""
    return {
        k: v.detach().cpu().clone() if clone else v.cpu()
        for k, v in state.items()
        if isinstance(v, torch.Tensor)
    }


def _digest(params: list[torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def trajectory_in_rank(payload: dict[str, Any]) -> dict[str, Any]:
    """One rank of the ranks comparison: the candidate for every step on the workload's inputs.

    From step ``first`` on, rank 0 saves its parameters and state, and each rank's digest is compared with rank 0's.
    """
    rank, _, device = rank_device(payload["devices"])
    settings = ParitySettings(**payload["settings"])
    torch.set_num_threads(int(payload["threads"]))  # the one-rank side's: CPU kernels round by thread count
    prepare(settings, device)
    init_group(device)
    try:
        workload = Workload(settings, device, int(payload["seed"]))
        mine = Trajectory(workload, settings.candidate)
        agree: dict[int, bool] = {}
        for step in range(1, settings.steps + 1):
            workload.backward(mine.state, step)
            mine.optimizer.step()
            if step < int(payload["first"]):
                continue
            digests = gather_records({"rank": rank, "digest": _digest(mine.params)})
            agree[step] = len({d["digest"] for d in digests}) == 1
            if rank == 0:
                torch.save(_snapshot(mine), f"{payload['out']}/step{step}.pt")
        sharing = dict(getattr(mine.optimizer, "sharing", None) or {})
    finally:
        dist.destroy_process_group()
    return {"agree": agree, "sharing": sharing}


class RanksComparison:
    """The one-rank candidate here, step by step, against the candidate's steps on N ranks (saved by rank 0)."""

    def __init__(self, plan: Plan, workload: Workload) -> None:
        self.plan, self.workload = plan, workload
        self.settings = ParitySettings(**plan.settings)
        self.ranks = plan.protocol.gpus
        self.mine: Trajectory | None = None
        self.steps_done = 0
        self.launched: dict[str, Any] | None = None

    def _launch(self, first: int, folder: Path) -> None:
        """The ranks' whole trajectory, saving every step from ``first`` on."""
        folder.mkdir(parents=True, exist_ok=True)
        payload = {
            "settings": asdict(self.settings),
            "seed": self.plan.protocol.seed,
            "devices": list(self.plan.protocol.rank_devices),
            "first": first,
            "out": str(folder),
            "threads": torch.get_num_threads(),
        }
        logs = folder.parent / "trials"
        logs.mkdir(exist_ok=True)
        self.launched = run_in_ranks(
            RANKS_TARGET,
            payload,
            self.ranks,
            timeout_s=RANKS_TIMEOUT_S,
            log_path=logs / f"ranks-from-step{first}.log",
        )

    def step(self, step: int, run_dir: Path) -> dict[str, Any]:
        folder = run_dir / "ranks-steps"
        saved = folder / f"step{step}.pt"
        if not saved.is_file() or self.launched is None:
            self._launch(step, folder)
        if self.mine is None or self.steps_done >= step:
            self.mine, self.steps_done = Trajectory(self.workload, self.settings.candidate), 0
        mine, bounds = self.mine, None
        while self.steps_done < step:
            self.workload.backward(mine.state, self.steps_done + 1)
            if self.steps_done + 1 == 1:
                bounds = self.workload.step_one_bounds(mine.optimizer, mine.groups)
            mine.optimizer.step()
            self.steps_done += 1
        other = torch.load(saved, weights_only=True)
        saved.unlink()
        states = [
            (_cpu_tensors(here), there) for here, there in zip(mine.buffers(), other["state"], strict=True)
        ]
        here = [p.detach().cpu() for p in mine.params]
        figures, per_param = compare_tensors(RANKS, step, here, other["params"], states)
        row = asdict(figures)
        agree = self.launched["agree"]
        row["ranks_agree"] = bool(agree.get(str(step), agree.get(step, False)))
        row["ranks"] = self.ranks
        sharing = self.launched["sharing"]
        row["sharing_text"] = (
            f"rank 0 of {sharing.get('world')} orthogonalized {sharing.get('matrices_here')} of "
            f"{sharing.get('matrices')} Newton-Schulz matrices"
            + (f" ({sharing['note']})" if sharing.get("note") else "")
            if sharing
            else f"`{self.settings.candidate}` reports no sharing"
        )
        if bounds is not None:
            row.update(bound_fields(per_param, bounds))
        return row


def result_of(run: Run) -> ParityResult:
    """The parity result recorded in a run's log."""
    settings = ParitySettings(**run.plan.settings)
    rows = sorted((r for r in run.folder.rows() if r.get("status") == "ok"), key=lambda r: r["index"])
    workload = Workload.describe(settings)
    return ParityResult.from_rows(settings, workload, rows)


def contract_text(run: Run) -> str:
    """The parity run's claim: whether the one-step contract holds, and the largest bound."""
    result = result_of(run)
    if not result.contract:
        return "One-step contract: not judged (step one has not run for both comparisons).\n"
    broken = [clause for clause, ok in result.contract.items() if not ok]
    verdict = "holds" if not broken else "BROKEN (" + "; ".join(broken) + ")"
    first = next(f for f in result.steps if f.step == 1 and f.comparison == "candidate")
    return (
        f"One-step contract: {verdict}; the candidate's largest difference {figure_text(first.max_abs_diff)}, its "
        f"largest bound {figure_text(result.bound_largest)} (worst tensor at {figure_text(result.bound_worst_ratio['candidate'])} "
        "of its own bound; 1 or less holds).\n"
    )


class ParityTier(BaseTier):
    """Parity's rows are steps of two comparisons, not paired trials: its section reads them."""

    def __init__(self) -> None:
        super().__init__(
            "parity",
            make_plan=make_plan,
            trial_function=trial_function,
            settings_problem=recorded_settings_problem,
            resume_problem=arms_resume_problem,
            row_problem=recorded_row_problem,
            tables=lambda run: {DIVERGENCE_CSV: divergence_table(result_of(run))},
            section=lambda run: parity_section(
                result_of(run), run.plan.protocol.device, run.plan.protocol.seed
            ),
            claim=contract_text,
            paired=False,
        )

    def caveats(self, run: Run) -> list[Caveat]:
        settings = ParitySettings(**run.plan.settings)
        device = run.plan.protocol.device
        if same_path_as_baseline(settings.candidate, device, settings.baseline) is None:
            return []
        return [
            Caveat(
                f"device {device}: the candidate keeps the baseline's per-parameter path there.",
                "This parity run checks the plumbing; the batched path is exercised on CUDA, or on the CPU with "
                "`--candidate candidate-cpu`.",
            )
        ]


TIER = ParityTier()
