"""The parity tier and its ``bench parity`` command: the plan, the trials, the ranks comparison, the verdict."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from experiments.arms import arms_resume_problem, checked_optimizer, same_path_as_baseline
from experiments.parity_steps import (
    COMPARISONS,
    RANKS,
    ULP_SENSITIVITY_FACTOR,
    Comparison,
    ParityResult,
    ParitySettings,
    StepFigures,
    Trajectory,
    Workload,
    prepare,
)
from experiments.ranks import gather_records, init_group, rank_device
from harness.errors import InputError
from harness.folder_format import FIGURE_LIMIT, UINT64_MAX, RowField
from harness.isolation import run_in_ranks
from harness.limits import MAX_PAIRS
from harness.options import check_gpus, parse_arms, resolve_device, split_device_list
from harness.plan import Plan
from harness.present.model import Section, Table
from harness.protocol_options import ProtocolOptions, check_protocol
from harness.schedule import Arm, Case, ScheduledTrial
from harness.schema import check_fields
from harness.tier import BaseTier, Caveat, CommandSpec, Run, Start
from harness.trial import TrialContext, TrialFunction
from harness.validation import row_fields_problem, settings_problem

if TYPE_CHECKING:
    import pandas as pd

RANKS_TARGET = "experiments.parity:trajectory_in_rank"
RANKS_TIMEOUT_S = 3600
TITLE = "Parity: candidate against baseline"
PLUMBING = (
    "This parity run checks the plumbing; the batched path is exercised on CUDA, or on the CPU with "
    "`--candidate candidate-cpu`."
)

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


# What the parity report reads of a step's row: a relative difference against a parameter of zero can pass
# 10³⁰, so any finite number; a bound's ratio is null past any bound.
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
    """The run from the checked parity options: each comparison's steps, one trial per step."""
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
    cases = [
        Case("control", {"comparison": "control"}, (reference, Arm(f"{base}-control", "candidate", base))),
        Case("candidate", {"comparison": "candidate"}, (reference, Arm(candidate, "candidate", candidate))),
    ]
    isolation = "in-process; both trajectories of a comparison from identical state on identical inputs"
    if ranks > 1:
        one, many = (
            Arm(candidate, "baseline", candidate),
            Arm(f"{candidate}@{ranks}ranks", "candidate", candidate),
        )
        cases.append(Case(RANKS, {"comparison": RANKS, "ranks": ranks}, (one, many)))
        isolation += (
            f"; ranks: the candidate on {ranks} fresh ranks ({protocol.backend}, torch.distributed.run) against "
            "the one-rank candidate here"
        )
    schedule = [
        ScheduledTrial(
            i * settings.steps + k, case.label, "measured", k, 0, "", case.arms[1].label, "candidate"
        )
        for i, case in enumerate(cases)
        for k in range(settings.steps)
    ]
    return Plan(
        tier="parity",
        protocol=protocol,
        cases=cases,
        unit="",
        metric="largest parameter difference after the step",
        settings=asdict(settings),
        command=command,
        isolation=isolation,
        timed_region="nothing is timed: each trial is one step of both trajectories, compared after it",
        schedule=schedule,
    )


def trial_function(plan: Plan) -> TrialFunction:
    """One step of one comparison per trial; a comparison resumed mid-way replays its earlier steps unlogged."""
    settings = ParitySettings(**plan.settings)
    prepare(settings, plan.protocol.device)
    workload = Workload(settings, plan.protocol.device, plan.protocol.seed)
    comparisons: dict[str, Comparison] = {}
    launched: dict[str, Any] = {}  # the ranks' run: each rank's digest agreement per step, and the sharing

    def trial(ctx: TrialContext) -> dict[str, Any]:
        name, step = ctx.case.label, ctx.trial.round + 1
        comparison = comparisons.get(name)
        if comparison is None or comparison.steps_done >= step:
            comparison = comparisons[name] = Comparison(name, workload, settings)
        while comparison.steps_done < step - 1:
            comparison.advance()
        row = comparison.step() if name != RANKS else ranks_step(plan, comparison, ctx.run_dir, launched)
        return {"value": row["max_abs_diff"], **row}

    return trial


def _cpu_state(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of one parameter's optimizer state, copied to the CPU."""
    return {k: v.detach().cpu().clone() for k, v in state.items() if isinstance(v, torch.Tensor)}


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
            digest = hashlib.sha256()
            for p in mine.params:
                digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            digests = gather_records({"rank": rank, "digest": digest.hexdigest()})
            agree[step] = len({d["digest"] for d in digests}) == 1
            if rank == 0:
                params = [p.detach().cpu().clone() for p in mine.params]
                snapshot = {"params": params, "state": [_cpu_state(s) for s in mine.buffers()]}
                torch.save(snapshot, f"{payload['out']}/step{step}.pt")
        sharing = dict(getattr(mine.optimizer, "sharing", None) or {})
    finally:
        dist.destroy_process_group()
    return {"agree": agree, "sharing": sharing}


def ranks_step(plan: Plan, comparison: Comparison, run_dir: Path, launched: dict[str, Any]) -> dict[str, Any]:
    """The one-rank candidate's next step against the ranks' (launched from this step where not saved)."""
    step, folder = comparison.steps_done + 1, run_dir / "ranks-steps"
    saved = folder / f"step{step}.pt"
    if not saved.is_file() or not launched:
        folder.mkdir(parents=True, exist_ok=True)
        (run_dir / "trials").mkdir(exist_ok=True)
        payload = {
            "settings": plan.settings,
            "seed": plan.protocol.seed,
            "devices": list(plan.protocol.rank_devices),
            "first": step,
            "out": str(folder),
            "threads": torch.get_num_threads(),
        }
        log = run_dir / "trials" / f"ranks-from-step{step}.log"
        launched.update(
            run_in_ranks(RANKS_TARGET, payload, plan.protocol.gpus, timeout_s=RANKS_TIMEOUT_S, log_path=log)
        )
    other = torch.load(saved, weights_only=True)
    saved.unlink()
    row = comparison.step((other["params"], other["state"]))
    agree, sharing = launched["agree"], launched["sharing"]
    row["ranks_agree"] = bool(agree.get(str(step), agree.get(step, False)))
    row["ranks"] = plan.protocol.gpus
    row["sharing_text"] = (
        f"rank 0 of {sharing.get('world')} orthogonalized {sharing.get('matrices_here')} of "
        f"{sharing.get('matrices')} Newton-Schulz matrices"
        + (f" ({sharing['note']})" if sharing.get("note") else "")
        if sharing
        else f"`{plan.settings['candidate']}` reports no sharing"
    )
    return row


def result_of(run: Run) -> ParityResult:
    """The parity result recorded in a run's log."""
    settings = ParitySettings(**run.plan.settings)
    rows = sorted((r for r in run.folder.rows() if r.get("status") == "ok"), key=lambda r: r["index"])
    return ParityResult.from_rows(settings, Workload.describe(settings), rows)


def divergence_table(run: Run) -> dict[str, pd.DataFrame]:
    import pandas as pd  # here, not at the top: a parity rank imports this module and needs no pandas

    return {"divergence.csv": pd.DataFrame([asdict(f) for f in result_of(run).steps])}


def figure_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def contract_text(run: Run) -> str:
    """The parity run's claim: whether the one-step contract holds, and the largest bound."""
    result = result_of(run)
    if not result.contract:
        return "One-step contract: not judged (step one has not run for both comparisons).\n"
    broken = [clause for clause, ok in result.contract.items() if not ok]
    verdict = "holds" if not broken else "BROKEN (" + "; ".join(broken) + ")"
    first = next(f for f in result.steps if f.step == 1 and f.comparison == "candidate")
    worst = figure_text(result.bound_worst_ratio["candidate"])
    return (
        f"One-step contract: {verdict}; the candidate's largest difference {figure_text(first.max_abs_diff)}, "
        f"its largest bound {figure_text(result.bound_largest)} (worst tensor at {worst} of its own bound; 1 "
        "or less holds).\n"
    )


def parity_section(run: Run) -> Section:
    """The parity section: verdict, one-step figures, the bound and the divergence table."""
    result, device, text = result_of(run), run.plan.protocol.device, figure_text
    s, first = result.settings, {f.comparison: f for f in result.steps if f.step == 1}
    lines: list[Any] = [
        f"Workload: {result.workload}; device `{device}`; seed {run.plan.protocol.seed}; {s.steps} step(s). "
        f"Baseline arm `{s.baseline}`, candidate arm `{s.candidate}`.",
        "",
    ]
    if not set(COMPARISONS) <= set(first):
        return Section.of_lines(TITLE, lines + ["Step one has not run for both comparisons yet: no verdict."])
    judged = [first[n] for n in (*COMPARISONS, RANKS) if n in first and n in result.bound_worst_ratio]
    one_step = {
        "comparison": lambda f: f.comparison,
        "buffers bit-equal": lambda f: f"{f.buffers_equal} of {f.buffers_total}",
        "parameters identical": lambda f: f"{f.params_equal} of {f.params_total}",
        "largest abs diff": lambda f: text(f.max_abs_diff),
        "largest rel diff": lambda f: text(f.max_rel_diff),
        "diff / bound": lambda f: text(result.bound_worst_ratio[f.comparison]),
        "loss bytes equal": lambda f: (
            "n/a" if f.loss_bytes_equal is None else "yes" if f.loss_bytes_equal else "no"
        ),
    }
    clauses = [(clause, "yes" if ok else "**no**") for clause, ok in result.contract.items()]
    lines += [
        f"**One-step contract: {'holds' if result.holds else 'BROKEN'}.**",
        "",
        Table(["clause", "holds"], clauses),
        "",
        "#### After one step from identical state",
        "",
        Table.of(one_step, judged),
        "",
        "Each tensor's bound is lr·muon times the bf16 rounding of the baseline's Muon update. That rounding is "
        f"the larger of one ulp of its largest entry and {ULP_SENSITIVITY_FACTOR:g}× the output's spread under "
        "±1-ulp perturbations of its bf16 input (0 without a Muon part). The largest bound here is "
        f"{text(result.bound_largest)}; 'diff / bound' is the worst tensor's ratio (≤ 1 holds).",
    ]
    if RANKS in first:
        f = first[RANKS]
        verdict = (
            "bit for bit"
            if f.params_equal == f.params_total
            else f"within {text(result.bound_worst_ratio.get(RANKS))} of the bound (largest difference "
            f"{text(f.max_abs_diff)})"
        )
        lines += [
            "",
            f"ranks: the candidate on {result.ranks} ranks against the one-rank candidate here, from identical "
            f"state and inputs; after one step they agree {verdict}; "
            f"{result.ranks_sharing or 'no sharing recorded'}.",
        ]
    if s.steps > 1:
        lines += [
            "",
            f"#### Divergence over {s.steps} steps (reported, not claimed)",
            "",
            _divergence(result),
        ]
    lines += ["", "Not claimed: identical multi-step training."]
    same = same_path_as_baseline(s.candidate, device, s.baseline)
    if same:
        lines[-1] += f" Here {same}. {PLUMBING}"
    return Section.of_lines(TITLE, lines)


def _divergence(result: ParityResult) -> Table:
    """Each step's largest differences, per comparison, as a markdown table."""
    ranked = any(f.comparison == RANKS and f.step == 1 for f in result.steps)
    by_step: dict[int, dict[str, StepFigures]] = {}
    for f in result.steps:
        by_step.setdefault(f.step, {})[f.comparison] = f
    rows = [
        [step, figure_text(pair["control"].max_abs_diff), figure_text(pair["candidate"].max_abs_diff)]
        + [f"{pair['candidate'].buffers_equal} of {pair['candidate'].buffers_total}"]
        + ([figure_text(pair[RANKS].max_abs_diff) if RANKS in pair else "n/a"] if ranked else [])
        for step, pair in sorted(by_step.items())
        if set(COMPARISONS) <= set(pair)
    ]
    headers = ["step", "control max abs diff", "candidate max abs diff", "candidate buffers bit-equal"]
    return Table(headers + (["ranks max abs diff"] if ranked else []), rows)


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
            tables=divergence_table,
            section=parity_section,
            claim=contract_text,
            paired=False,
        )

    def caveats(self, run: Run) -> list[Caveat]:
        settings, device = ParitySettings(**run.plan.settings), run.plan.protocol.device
        if same_path_as_baseline(settings.candidate, device, settings.baseline) is None:
            return []
        return [
            Caveat(f"device {device}: the candidate keeps the baseline's per-parameter path there.", PLUMBING)
        ]


TIER = ParityTier()


def _prepare(start: Start) -> Start:
    """The two arms into the settings; a new run's protocol built here: one trial per step, no warm-up."""
    baseline, candidate = arms_of(start.protocol["arms"], start.settings.candidate)
    start = replace(start, settings=replace(start.settings, candidate=candidate, baseline=baseline))
    if start.resume is not None:
        return replace(start, protocol=None)
    first, gpus = split_device_list(start.protocol["device"], start.protocol["gpus"])
    device, why = resolve_device(first)
    start.say(f"device: {device} ({why})")
    arms = (Arm(baseline, "baseline", baseline), Arm(candidate, "candidate", candidate))
    options = ProtocolOptions(
        arms, warmup=0, pairs=start.settings.steps, seed=start.protocol["seed"], device=device, gpus=gpus
    )
    check_gpus(check_protocol(options).gpus, device)
    return replace(start, protocol=options)


def _finish(result: Any, start: Start) -> str | None:
    if result_of(result).holds:
        return None
    where = "see the report" if start.report else f"bench report {result.folder.path} writes the report"
    return f"the one-step contract is broken ({where})"


COMMAND = CommandSpec(
    "parity",
    "The numerical contract of candidate against baseline, as a run folder (exit 1 when it breaks).",
    tiers=(TIER,),
    settings=ParitySettings,
    protocol=("arms", "seed", "device", "gpus"),
    helps={
        "arms": "baseline,candidate (default baseline,candidate); each built with muon, sgd and its own "
        "keywords.",
        "seed": "Seed for the parameters, gradients and data.",
        "gpus": "Also follow the candidate on N ranks (fresh processes; gloo on the CPU) against the "
        "one-rank candidate.",
    },
    prepare=_prepare,
    finish=_finish,
)
