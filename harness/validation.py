"""One check of a run folder's plan and log before anything reads them; a fault is one ``CorruptRunFolder`` line."""

from __future__ import annotations

import datetime as _dt
import math
import numbers
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import fields, is_dataclass
from typing import Any

from harness import telemetry
from harness.env import ENV_SHAPE
from harness.errors import InputError
from harness.folder_format import (
    ENV,
    FIGURE_LIMIT,
    LOG,
    OOM_FIELDS,
    PLAN,
    TRIAL_COLUMNS,
    TRIAL_SECONDS_LIMIT,
    UINT64_MAX,
    RowField,
)
from harness.limits import MAX_PAIRS
from harness.plan import Plan
from harness.protocol_options import check_protocol
from harness.schedule import ScheduledTrial
from harness.schema import OptionError
from harness.tables import CorruptRunFolder, RunFolder

ROLES = ("baseline", "candidate", "calibration")
PHASES = ("warmup", "measured")
STATUSES = ("ok", "error", "resource_failure")


def load_plan(folder: RunFolder) -> Plan:
    """The folder's plan, checked; ``CorruptRunFolder`` (one line) for anything a plan cannot be."""
    where = folder.file(PLAN)
    data = folder.read_json(PLAN)
    if not isinstance(data, dict):
        raise CorruptRunFolder(f"{where} holds {_kind(data)}, not a plan (a JSON object)")
    if isinstance(data.get("schedule"), list) and not data["schedule"]:
        raise CorruptRunFolder(f"{where}: the schedule is empty (a plan saves every scheduled trial)")
    try:
        plan = Plan.from_json(data)
    except KeyError as exc:
        raise CorruptRunFolder(f"{where}: not a plan: missing key {exc}") from None
    except (TypeError, ValueError, AttributeError, InputError) as exc:
        raise CorruptRunFolder(f"{where}: not a plan: {exc}") from None
    problem = type_problem(plan, Plan, "plan") or _plan_problem(plan)
    if problem:
        raise CorruptRunFolder(f"{where}: {problem}")
    return plan


def load_env(folder: RunFolder) -> dict[str, Any]:
    """The folder's environment record (empty when absent), checked against ``ENV_SHAPE``."""
    record = folder.read_json(ENV)
    if record is None:
        return {}
    if not isinstance(record, dict):
        raise CorruptRunFolder(f"{folder.file(ENV)} holds {_kind(record)}, not an environment record")
    problem = shape_problem(record, ENV_SHAPE, "env")
    if problem:
        raise CorruptRunFolder(f"{folder.file(ENV)}: {problem}")
    return record


def shape_problem(record: dict[str, Any], shape: dict[str, Any], where: str) -> str | None:
    """What is wrong with a record's fields present in ``shape`` (name → type, shape or ``[shape]``), or None."""
    return _first(
        type_problem(record[key], hint, f"{where}.{key}") for key, hint in shape.items() if key in record
    )


def _first(problems: Iterable[str | None]) -> str | None:
    """The first problem of a lazy sequence, or None."""
    return next((problem for problem in problems if problem), None)


def settings_problem(
    record: dict[str, Any], shape: dict[str, Any], where: str = "settings", what: str = "a plan of this tier"
) -> str | None:
    """What is wrong with a record against ``shape`` (name → type): a field missing, or one not of its type."""
    missing = [key for key in shape if key not in record]
    if missing:
        return f"{where} has no {', '.join(missing)} (what {what} records)"
    return shape_problem(record, shape, where)


def check_log(
    plan: Plan, folder: RunFolder, tier_row_problem: Callable[[dict[str, Any]], str | None] | None = None
) -> list[dict[str, Any]]:
    """The log's rows, each checked against the plan's schedule; ``CorruptRunFolder`` names the first bad one."""
    rows = []
    scheduled = {t.index: t for t in plan.schedule}
    by_ratio = {c.label for c in plan.cases if plan.compared_by_ratio(c.label)}
    first_line: dict[int, int] = {}
    for number, row in folder.numbered_rows():
        problem = _row_problem(plan, scheduled, by_ratio, row)
        if problem is None and tier_row_problem is not None:  # what the row's own tier reads of it
            problem = tier_row_problem(row)
        if problem is None and row["index"] in first_line:  # the protocol never runs a logged trial again
            problem = (
                f"trial {row['index']} is logged twice (first on line {first_line[row['index']]}); "
                f"python -m harness.repair_log {folder.path} moves the later rows aside"
            )
        if problem:
            raise CorruptRunFolder(f"{folder.file(LOG)}: line {number}: {problem}")
        first_line[row["index"]] = number
        rows.append(row)
    return rows


# A plain type's test and its word: a whole number within 64 bits (every count, byte size and seed recorded
# here is); a float finite, and an integer past float's range is none; a Real may be NaN (nvidia-smi prints it).
_PLAIN: dict[Any, tuple[Callable[[Any], bool], str]] = {
    type(None): (lambda v: v is None, "null"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: _whole(v) and abs(v) < 2**64, "a whole number"),
    float: (lambda v: _number(v) is not None, "a finite number"),
    numbers.Real: (lambda v: _number(v, nan=True) is not None, "a number"),
    str: (lambda v: isinstance(v, str), "text"),
}


def type_problem(value: Any, hint: Any, where: str) -> str | None:
    """What is wrong with ``value`` as a ``hint`` (a dataclass, shape, list, dict, union or plain type), or None."""
    if hint is Any:
        return None
    if isinstance(hint, dict):  # a record's shape
        return (
            shape_problem(value, hint, where)
            if isinstance(value, dict)
            else f"{where} is {_show(value)}, not an object"
        )
    if isinstance(hint, list):  # [shape]: a list of such records, or null
        return None if value is None else type_problem(value, list[hint[0]], where)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if any(type_problem(value, option, where) is None for option in args):
            return None
        return f"{where} is {_show(value)}, not {' or '.join(_name(a) for a in args)}"
    if is_dataclass(hint):
        if not isinstance(value, hint):
            return f"{where} is {_show(value)}, not an object"
        hints = typing.get_type_hints(hint)
        return _first(
            type_problem(getattr(value, f.name), hints[f.name], f"{where}.{f.name}") for f in fields(hint)
        )
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            return f"{where} is {_show(value)}, not a list"
        item = args[0] if args else Any
        return _first(type_problem(element, item, f"{where}[{i}]") for i, element in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            return f"{where} is {_show(value)}, not an object"
        return None
    if hint in _PLAIN:
        accepts, word = _PLAIN[hint]
        return None if accepts(value) else f"{where} is {_show(value)}, not {word}"
    return None if isinstance(value, hint) else f"{where} is {_show(value)}, not {_name(hint)}"


def _plan_problem(plan: Plan) -> str | None:
    """What is wrong with a well-typed plan's values and references, or None."""
    p = plan.protocol
    if not plan.tier:
        return "tier is empty"
    if not p.arms:
        return "protocol.arms is empty"
    for i, arm in enumerate(p.arms):
        if arm.role not in ROLES:
            return f"protocol.arms[{i}] has role '{arm.role}', not one of {', '.join(ROLES)}"
    try:  # the one check of the options, as when the run started: a resume acts on these values
        check_protocol(p)
    except OptionError as exc:
        return f"protocol.{exc.field} is {_show(getattr(p, exc.field))}, which no run can have"
    except InputError as exc:
        return f"protocol: {exc}"
    if not plan.cases:
        return "cases is empty"
    cases = {}
    for i, case in enumerate(plan.cases):
        if case.label in cases:
            return f"cases[{i}] repeats the label '{case.label}'"
        labels = [arm.label for arm in case.arms]
        if not labels or len(set(labels)) != len(labels):
            return f"cases[{i}] ('{case.label}') has no arms or repeats one"
        for arm in case.arms:
            if arm.role not in ROLES:
                return f"cases[{i}] has an arm of role '{arm.role}', not one of {', '.join(ROLES)}"
        cases[case.label] = {arm.label: arm.role for arm in case.arms}
    seen: set[int] = set()
    for i, trial in enumerate(plan.schedule):
        if trial.index < 0 or trial.index in seen:
            return f"schedule[{i}].index is {trial.index}, which is negative or an earlier trial's"
        seen.add(trial.index)
        if trial.case not in cases:
            return f"schedule[{i}] names case '{trial.case}', which the plan does not have"
        if cases[trial.case].get(trial.arm) != trial.role:
            return f"schedule[{i}] names arm '{trial.arm}' ({trial.role}), which case '{trial.case}' does not have"
        if trial.phase not in PHASES:
            return f"schedule[{i}].phase is '{trial.phase}', not one of {', '.join(PHASES)}"
        if trial.round < 0 or trial.slot < 0:
            return f"schedule[{i}] has a negative round or slot"
    return _looks_problem(plan, set(cases))


# One look of the stopping rule (``--pairs auto``), as a resume and the report read it back.
LOOK_SHAPE = {"case": str, "rounds": int, "stop": bool, "reason": str, "claims": dict[str, Any]}


def _looks_problem(plan: Plan, cases: set[str]) -> str | None:
    """What is wrong with the plan's looks, or None."""
    for i, look in enumerate(plan.looks):
        where = f"looks[{i}]"
        problem = settings_problem(look, LOOK_SHAPE, where, "each look of the stopping rule")
        if problem:
            return problem
        if look["case"] not in cases:
            return f"{where}.case is {_show(look['case'])}, which the plan does not have"
        if not 0 <= look["rounds"] <= MAX_PAIRS:
            return f"{where}.rounds is {look['rounds']}, not a number of pairs from 0 to {MAX_PAIRS}"
    return None


def _row_problem(
    plan: Plan, scheduled: dict[int, ScheduledTrial], by_ratio: set[str], row: dict[str, Any]
) -> str | None:
    index = row["index"]  # a whole number ≥ 0, checked by the log reader
    trial = scheduled.get(index)
    if trial is None:
        if row.get("phase") != "warmup" or not isinstance(row.get("warmup_reason"), str):
            return f"trial {index} is not in the plan (its schedule has {len(plan.schedule)} trials)"
        arms = {(t.case, t.arm) for t in plan.schedule}
        if (row.get("case"), row.get("arm")) not in arms:
            return f"trial {index} is a warm-up outside the schedule of arm {_show(row.get('arm'))}, not a planned one"
        return _status_problem(index, row, row["case"] in by_ratio)
    for key in ("case", "phase", "round", "slot", "arm", "role"):
        if row.get(key) != getattr(trial, key):
            return (
                f"trial {index}'s {key} is {_show(row.get(key))}, the plan says {_show(getattr(trial, key))}"
            )
    return _status_problem(index, row, trial.case in by_ratio)


# No machine's load, core count, clock (MHz), temperature (°C) or power (W) comes near a million.
MACHINE_COUNT_LIMIT = 1e6
# A process's CPU seconds over one trial: every core of the largest machine, the longest trial through.
CPU_SECONDS_LIMIT = MACHINE_COUNT_LIMIT * TRIAL_SECONDS_LIMIT

# (part of a telemetry field's name, its range): the first that matches; a GPU's field by its name after gpu<i>_.
TELEMETRY_RANGES: tuple[tuple[str, tuple[float, float]], ...] = (
    ("share", (0.0, 1.0)),
    ("switches", (0, UINT64_MAX)),
    ("throttle_mask", (0, UINT64_MAX)),
    ("worker_", (0.0, CPU_SECONDS_LIMIT)),
    ("temperature", (-273.15, MACHINE_COUNT_LIMIT)),
    ("cpu_logical", (1.0, MACHINE_COUNT_LIMIT)),
    ("energy", (0.0, FIGURE_LIMIT)),
    ("seconds", (0.0, TRIAL_SECONDS_LIMIT)),
    ("violation", (0.0, TRIAL_SECONDS_LIMIT)),
    ("", (0.0, MACHINE_COUNT_LIMIT)),  # loads, core and GPU counts, clocks (MHz), power (W)
)
# Row fields the harness reads besides telemetry, as ``TRIAL_COLUMNS`` declares them.
ROW_FIELDS: dict[str, RowField] = {
    name: rule
    for column, rule in TRIAL_COLUMNS.items()
    if isinstance(rule, RowField)
    for name in (OOM_FIELDS if column == "oom_*" else (column,))
}


def _number(value: Any, nan: bool = False) -> float | None:
    """``value`` as a finite float (or NaN, with ``nan``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) or (nan and math.isnan(number)) else None


def _status_problem(index: int, row: dict[str, Any], by_ratio: bool) -> str | None:
    status, value = row.get("status"), row.get("value")
    if status not in STATUSES:
        return f"trial {index} has status {_show(status)}, not one of {', '.join(STATUSES)}"
    if status == "ok" and value is None:
        return f"trial {index} is 'ok' with no value"
    problem = _field_problem("value", value, RowField(float, -FIGURE_LIMIT, FIGURE_LIMIT))
    if problem:
        return f"trial {index}'s {problem}"
    if status == "ok" and by_ratio and not value >= 1 / FIGURE_LIMIT:
        return (
            f"trial {index}'s value is {_show(value)}, not a positive figure from {1 / FIGURE_LIMIT:g} on "
            "(the arms are compared by ratio)"
        )
    if not isinstance(row.get("message", ""), str):
        return f"trial {index}'s message is {_show(row['message'])}, not text"
    return _fields_problem(index, row)


def _fields_problem(index: int, row: dict[str, Any]) -> str | None:
    """What is wrong with a row's start time and telemetry fields, or None."""
    started = row.get("started")
    if started is not None and _start(started) is None:
        return (
            f"trial {index}'s started is {_show(started)}, not an ISO 8601 time with a time zone from "
            f"{FIRST_YEAR} to {LAST_YEAR} (e.g. 2026-12-02T02:01:27.000+00:00) or null"
        )
    rules = ((key, value, ROW_FIELDS.get(key) or _telemetry_rule(key)) for key, value in row.items())
    problem = _first(_field_problem(key, value, rule) for key, value, rule in rules if rule is not None)
    return f"trial {index}'s {problem}" if problem else None


def row_fields_problem(row: dict[str, Any], row_fields: dict[str, RowField]) -> str | None:
    """What is wrong with the fields a tier's report reads of a (structurally valid) row, or None."""
    index = row["index"]
    for key, rule in row_fields.items():
        if row.get(key) is None:
            if rule.needed and row.get("status") == "ok":
                return f"trial {index} is 'ok' with no {key} (its tier's report reads it of every finished trial)"
            continue
        problem = _field_problem(key, row[key], rule)
        if problem:
            return f"trial {index}'s {problem}"
    return None


# A trial's start: from 1970, and early enough that its end is still a date.
FIRST_YEAR, LAST_YEAR = 1970, 9998


def _start(value: Any) -> _dt.datetime | None:
    """``value`` as a start time (ISO 8601 with a time zone, in the years allowed), else None."""
    try:
        time = _dt.datetime.fromisoformat(value if isinstance(value, str) else "")
    except ValueError:
        return None
    if time.tzinfo is None or time.utcoffset() is None or not FIRST_YEAR <= time.year <= LAST_YEAR:
        return None
    return time


def _telemetry_rule(key: str) -> RowField | None:
    """The rule of a telemetry field (``harness.telemetry.field_type``), None for a key that is not one."""
    kind = telemetry.field_type(key)
    if kind is None:
        return None
    if kind is not int and kind is not float:
        return RowField(kind)
    name = key.split("_", 1)[1] if key.startswith("gpu") and key[3:4].isdigit() else key
    low, high = next(limits for part, limits in TELEMETRY_RANGES if part in name)
    return RowField(kind, low, high)


def _field_problem(key: str, value: Any, rule: RowField) -> str | None:
    """What is wrong with a row field's ``value`` under ``rule``, or None (null passes)."""
    if value is None:
        return None
    if rule.kind is str:
        return None if isinstance(value, str) else f"{key} is {_show(value)}, not text or null"
    if rule.kind is bool:
        return None if isinstance(value, bool) else f"{key} is {_show(value)}, not true, false or null"
    whole = rule.kind is int
    accepted = (
        f"{'a list of numbers' if rule.kind is list else 'a whole number' if whole else 'a number'} from "
        f"{_bound(rule.low)} to {_bound(rule.high)}" + ("" if rule.needed else " or null")
    )
    if rule.kind is list and not isinstance(value, list):
        return f"{key} is {_show(value)}, not {accepted}"
    for item in value if rule.kind is list else [value]:
        if item is None and rule.kind is list:  # one entry unrecorded (a rank that did not say)
            continue
        number = _number(item)
        exact = item if _whole(item) else number  # an integer compared exactly: 2⁶⁴ is no 64-bit mask
        if number is None or (whole and not _whole(item)) or not rule.low <= exact <= rule.high:
            return f"{key} is {_show(value)}, not {accepted}"
    return None


def _bound(limit: float) -> str:
    return "2⁶⁴−1" if limit == UINT64_MAX else f"{limit:g}"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, numbers.Number):
        return "a number"
    return {list: "a list", str: "text", type(None): "null"}.get(type(value), "an object")


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str | int | float | bool) or value is None else _kind(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _name(hint: Any) -> str:
    return _PLAIN[hint][1] if hint in _PLAIN else getattr(hint, "__name__", str(hint))
