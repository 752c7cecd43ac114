"""The screen's settings and plan: one case per YOLO26 scale, each arm once per padding guard it has."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch

from experiments import workloads
from experiments.arms import arm_code, checked_optimizer
from harness.errors import InputError
from harness.options import split_list
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import Arm, Case
from harness.schema import MAX_COUNT, check_at_most, check_fields, option
from harness.validation import settings_problem

GUARD_ATTRIBUTE = "pad_guard"  # an optimizer class with this attribute has a padding guard (None = no limit)
NO_LIMIT = "none"
NO_GUARD = "no-guard"  # the arm's class has no guard (not "n/a": pandas reads that as NaN)
DEFAULT_GUARD = "default"  # the first arm of a guarded class runs at its class default
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Steps (timed, warm-up or replayed) inside one trial: at the baseline's ~100 ms per YOLO26 step on the H200,
# 100 000 steps are hours per trial, far past any window a screen needs.
MAX_WINDOW_STEPS = 100_000
FLOOR_WARMUP_STEPS = 2  # steps on the capture stream before capture (the state already exists by then)


def parse_guard(text: str) -> int | None:
    """``'256'`` → 256, ``'none'`` → None (no limit); ``InputError`` for anything else."""
    if text.strip().lower() == NO_LIMIT:
        return None
    if not (text.strip().isascii() and text.strip().isdigit()):  # '²' is a digit to str.isdigit, not to int()
        raise InputError(
            f"--guards: '{text}' is not a guard; use whole numbers ≥ 0 or 'none', e.g. 0,256,512,none"
        )
    return int(check_at_most("--guards", int(text), MAX_COUNT))


def guard_name(guard: int | None) -> str:
    return NO_LIMIT if guard is None else str(guard)


def guard_label(spec: str, guard: int | None) -> str:
    """The arm label of ``spec`` at one guard: ``candidate@g256``, ``candidate@gnone``."""
    return f"{spec}@g{guard_name(guard)}"


def has_guard(optimizer_class: type) -> bool:
    return hasattr(optimizer_class, GUARD_ATTRIBUTE)


def parse_scales(text: str) -> list[str]:
    return workloads.parse_scales("--scales", text)


def parse_guards(text: str) -> list[int | None]:
    guards = [parse_guard(item) for item in split_list("--guards", text)]
    if len(set(guards)) != len(guards):
        raise InputError(f"--guards '{text}' names a guard twice; name each once")
    return guards


@dataclass(frozen=True)
class ScreenSettings:
    """The screen's own options, each declared once (``harness.schema``)."""

    scales: str = option("n,s,m,l,x", "Comma-separated YOLO26 scales: n, s, m, l, x.", check=parse_scales)
    guards: str = option(
        "0,256,512,none",
        "Padding guards for arms that have one: whole numbers (0 = exact shapes) or none.",
        check=parse_guards,
    )
    steps: int = option(10, "Timed optimizer steps per trial (the window).", low=1, high=MAX_WINDOW_STEPS)
    warmup_steps: int = option(
        2, "Untimed warm-up steps inside each trial, before the window.", low=0, high=MAX_WINDOW_STEPS
    )
    floor_replays: int = option(
        20, "CUDA-graph replays timed for the launch floor.", low=1, high=MAX_WINDOW_STEPS
    )
    dtype: str = option("float32", "Parameter dtype: float32, bfloat16 or float16.", choices=tuple(DTYPES))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def build_cases(
    scales: list[str], guards: list[int | None], arms: tuple[Arm, ...], guarded: set[str]
) -> list[Case]:
    """One case per scale: the first arm as given, then each other arm, once per guard if it has one."""
    first = arms[0]
    guard = DEFAULT_GUARD if first.spec in guarded else NO_GUARD
    case_arms = [Arm(first.label, "baseline", first.spec, {"guard": guard})]
    for arm in arms[1:]:
        if arm.spec in guarded:
            case_arms += [
                Arm(guard_label(arm.spec, g), "candidate", arm.spec, {"guard": guard_name(g)}) for g in guards
            ]
        else:
            case_arms.append(Arm(arm.label, "candidate", arm.spec, {"guard": NO_GUARD}))
    return [Case(scale, {"scale": scale, "model": f"yolo26{scale}"}, tuple(case_arms)) for scale in scales]


# What a screen's plan records: its options parsed, and what its report reads of the arms' classes.
RECORDED_SHAPE = {
    "scales": list[str],
    "guards": list[str],
    "steps": int,
    "warmup_steps": int,
    "floor_replays": int,
    "dtype": str,
    "arm_specs": list[str],
    "guarded_specs": list[str],
    "default_guards": dict[str, str],
}


def recorded_settings_problem(plan: Plan) -> str | None:
    """What is wrong with a screen plan's recorded settings (an edited plan.json), or None."""
    problem = settings_problem(plan.settings, RECORDED_SHAPE)
    if problem:
        return problem
    s = plan.settings
    given = {f.name: s[f.name] for f in fields(ScreenSettings)}
    given |= {"scales": ",".join(s["scales"]), "guards": ",".join(s["guards"])}
    try:
        check_fields(ScreenSettings(**given))
    except InputError as exc:
        return f"settings: {exc}"
    cases = [case.label for case in plan.cases]
    if s["scales"] != cases:
        return f"settings.scales is {s['scales']}, but the plan's cases are {cases} (one case per scale)"
    return _arms_problem(plan)


def _arms_problem(plan: Plan) -> str | None:
    """What is wrong with the plan's record of its arms' classes (specs, guards, defaults), or None.

    The report reads each case's arms by them: the cases must be the ones ``build_cases`` makes."""
    s, given = plan.settings, {}
    for arm in plan.protocol.arms:
        given.setdefault(arm.spec, arm)
    # One spec per arm (an A/A arm repeats the first's); a plan of the first format listed each guard's arm in
    # the protocol and each spec once here.
    arms = (
        plan.protocol.arms
        if s["arm_specs"] == [a.spec for a in plan.protocol.arms]
        else tuple(given.values())
    )
    specs = [a.spec for a in arms]
    if s["arm_specs"] != specs:
        return f"settings.arm_specs is {s['arm_specs']}, but the run's arms are {specs}"
    guarded = s["guarded_specs"]
    if guarded != sorted(set(guarded) & set(specs)):
        return f"settings.guarded_specs is {guarded}, not the run's arms' specs {specs}, each once and sorted"
    if sorted(s["default_guards"]) != guarded:
        return f"settings.default_guards names {sorted(s['default_guards'])}, not the guarded specs {guarded}"
    for spec, guard in s["default_guards"].items():
        try:
            parse_guard(guard)
        except InputError:
            return (
                f"settings.default_guards['{spec}'] is {guard!r}, not a guard (a whole number ≥ 0 or 'none')"
            )
    guards = [parse_guard(g) for g in s["guards"]]
    expected = build_cases(s["scales"], guards, arms, set(guarded))
    for i, (case, built) in enumerate(zip(plan.cases, expected, strict=True)):
        if case != built:
            return f"cases[{i}] ('{case.label}') is not the case its scale, guards and arms make"
    return None


def make_plan(protocol: ProtocolOptions, settings: ScreenSettings, command: str = "") -> Plan:
    """The screen's plan from its checked settings; ``InputError`` where they do not fit the protocol."""
    if protocol.budget is not None:
        raise InputError(
            "--budget: the screen measures the step's own extra peak, not a budget; drop --budget"
        )
    scales, guards = parse_scales(settings.scales), parse_guards(settings.guards)
    kwargs = workloads.load_workload(scales[0])["optimizer_kwargs"]
    classes = {arm.spec: checked_optimizer(arm.spec, tier_kwargs=kwargs) for arm in protocol.arms}
    defaults = {spec: guard_name(getattr(c, GUARD_ATTRIBUTE)) for spec, c in classes.items() if has_guard(c)}
    cases = build_cases(scales, guards, protocol.arms, set(defaults))
    resolved = {
        **asdict(settings),
        "scales": scales,
        "guards": [guard_name(g) for g in guards],
        "arm_specs": [a.spec for a in protocol.arms],
        "guarded_specs": sorted(defaults),
        "default_guards": defaults,
        "floor_warmup_steps": FLOOR_WARMUP_STEPS,
    }
    ranks = protocol.gpus
    window = f"{settings.steps} optimizer.step() calls after {settings.warmup_steps} untimed warm-up steps"
    words = {
        "metric": "optimizer step time (window total / steps)",
        "isolation": "in-process; a fresh optimizer on fresh parameters and gradients (seeded by the round) per trial",
        "timed_region": f"{window}, in one synchronized bracket (no synchronization inside); the launch floor "
        "(CUDA-graph replay) is measured after it, outside",
    }
    if ranks > 1:
        resolved["ranks"] = ranks
        devices = ", ".join(protocol.rank_devices)
        words = {
            "metric": f"optimizer step time under a process group of {ranks} ranks (the slowest rank's window / steps)",
            "isolation": f"{ranks} fresh ranks per trial (torch.distributed.run, {protocol.backend}, devices "
            f"{devices}); each builds the same parameters and gradients and a fresh optimizer; the parent "
            "schedules and never touches the GPU",
            "timed_region": f"on every rank, {window} and a barrier, in one synchronized bracket (no synchronization "
            "inside; an arm's own collectives are inside); the collective's share from one untimed diagnostic step "
            "after it, whose collectives are bracketed by synchronizations; no launch floor",
        }
    code = {} if ranks > 1 else arm_code(cases, protocol.device)
    return Plan(
        tier="screen",
        protocol=protocol,
        cases=cases,
        arm_code=code,
        unit="ms/step",
        settings=resolved,
        command=command,
        in_process=ranks == 1,
        **words,
    )
