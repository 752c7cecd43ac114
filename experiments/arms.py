"""Arms: the resolver from a spec to its optimizer class, what it runs on a device, what a resume checks."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

from harness.codepaths import class_fingerprint, run_folder_code
from harness.errors import InputError, Refusal
from harness.options import parse_arms
from harness.plan import Plan
from harness.protocol_options import DEFAULT_ARMS
from harness.schedule import Case
from optimizers import batched as _batched
from optimizers.batched import BatchedMuSGD
from optimizers.musgd import MuSGD

ARM_NAMES = ("baseline", "candidate", "candidate-cpu", "upstream")
CPU_DEFAULT_ARMS = "baseline,candidate-cpu"


class ArmError(Refusal, ValueError):
    """An arm spec that names no usable optimizer class; the message says what to do instead."""


class BatchedMuSGDOnCPU(BatchedMuSGD):
    """The candidate with CPU tensors routed through its batched path (arm `candidate-cpu`)."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        with _batched.batched_on_cpu(True):
            return super().step(closure)


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """(name, keywords) of an arm spec: ``module:Class(k=v, ...)`` or a named arm with keywords."""
    spec = spec.strip()
    name, paren, rest = spec.partition("(")
    if not paren:
        return spec, {}
    if not rest.endswith(")"):
        raise ArmError(f"arm {spec!r}: its keyword list is not closed; write name(key=value, ...)")
    try:
        call = ast.parse(f"f({rest}", mode="eval").body
    except SyntaxError:
        raise ArmError(f"arm {spec!r}: its keyword list is not closed; write name(key=value, ...)") from None
    if not isinstance(call, ast.Call) or call.args or any(k.arg is None for k in call.keywords):
        raise ArmError(f"arm {spec!r}: give keyword arguments only, as name(key=value, ...)")
    kwargs: dict[str, Any] = {}
    for keyword in call.keywords:
        try:
            kwargs[str(keyword.arg)] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ArmError(
                f"arm {spec!r}: {keyword.arg}: only literals (numbers, strings, True/False/None, tuples, "
                "lists, dicts) are accepted"
            ) from None
    return name.strip(), kwargs


def resolve_optimizer(spec: str) -> type[torch.optim.Optimizer]:
    """The optimizer class an arm spec names (see the module docstring); ArmError when it cannot."""
    spec, _ = parse_spec(spec)
    built_in = {"baseline": MuSGD, "candidate": BatchedMuSGD, "candidate-cpu": BatchedMuSGDOnCPU}
    if spec in built_in:
        return built_in[spec]
    if spec == "upstream":
        try:
            from ultralytics.optim import MuSGD as UpstreamMuSGD
        except ImportError as error:
            raise ArmError(
                "arm 'upstream' needs ultralytics (the MuSGD it ships); install the extra: "
                f"pip install 'musgd-bench[ultralytics]' ({error})"
            ) from None
        return UpstreamMuSGD
    module_name, colon, class_name = spec.partition(":")
    if not colon or not module_name or not class_name:
        raise ArmError(f"unknown arm {spec!r}: use one of {', '.join(ARM_NAMES)} or package.module:Class")
    refused = run_folder_code(module_name)  # found without running it: a folder's code never runs
    if refused:
        raise ArmError(f"arm {spec!r}: {refused}")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - any failure to import is the spec's: one line
        why = str(error) or type(error).__name__
        raise ArmError(
            f"arm {spec!r}: cannot import module {module_name!r}", hint=f"{type(error).__name__}: {why}"
        ) from None
    optimizer_class = module
    for attribute in class_name.split("."):
        optimizer_class = getattr(optimizer_class, attribute, None)
        if optimizer_class is None:
            raise ArmError(f"arm {spec!r}: module {module_name!r} has no attribute {class_name!r}")
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise ArmError(f"arm {spec!r}: {class_name} is not a torch.optim.Optimizer subclass")
    return optimizer_class


def checked_optimizer(
    spec: str,
    option: str = "--arms",
    import_upstream: bool = True,
    tier_kwargs: dict[str, Any] | None = None,
) -> type[torch.optim.Optimizer] | None:
    """The class an arm spec names, or ``InputError`` (one line, exit 2) naming the option that gave it."""
    if parse_spec(spec)[0] == "upstream" and not import_upstream:
        if importlib.util.find_spec("ultralytics") is None:
            raise InputError(
                f"{option}: arm 'upstream' needs ultralytics; install the extra (pip install -e '.[ultralytics]')"
            )
        return None
    try:
        optimizer_class = resolve_optimizer(spec)
    except ArmError as exc:
        raise InputError(f"{option}: {exc}", hint=exc.hint) from None
    check_constructor(spec, option, CONSTRUCTOR_KWARGS if tier_kwargs is None else tier_kwargs)
    return optimizer_class


# MuSGD's constructor keywords as the screen and probe tiers pass them (their workloads' optimizer_kwargs).
CONSTRUCTOR_KWARGS: dict[str, Any] = {"muon": 0.2, "sgd": 1.0}


def tiny_param_groups() -> list[dict[str, Any]]:
    """Two groups of tiny parameters in the form every tier gives an arm: a Muon conv weight, an SGD bias."""
    common = {"lr": 0.01, "momentum": 0.9, "nesterov": True}
    weight = torch.nn.Parameter(torch.zeros(4, 2, 3, 3))
    bias = torch.nn.Parameter(torch.zeros(4))
    return [
        {"params": [weight], **common, "weight_decay": 5e-4, "use_muon": True, "param_group": "muon"},
        {"params": [bias], **common, "weight_decay": 0.0, "use_muon": False, "param_group": "bias"},
    ]


def check_constructor(spec: str, option: str, tier_kwargs: dict[str, Any]) -> None:
    """Build the arm once on a tiny parameter set, as its tier will (``make_optimizer``)."""
    try:
        make_optimizer(spec, tiny_param_groups(), tier_kwargs)
    except Exception as exc:  # noqa: BLE001 - any complaint of the constructor is the user's to read
        complaint = " ".join(f"{type(exc).__name__}: {exc}".split())
        given = ", ".join(
            sorted(constructor_kwargs(resolve_optimizer(spec), tier_kwargs, parse_spec(spec)[1]))
        )
        raise InputError(
            f"{option}: arm '{spec}' cannot be built as the tier builds it (param groups with lr, momentum, "
            f"weight_decay, nesterov, use_muon; keywords: {given or 'none'}): {complaint[:300]}"
        ) from None


def constructor_kwargs(
    optimizer_class: type, tier_kwargs: dict[str, Any], arm_kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The keywords an arm's constructor receives: the tier's it names (all where it takes ``**kwargs``), then
    the arm's own (all of them)."""
    try:
        parameters = inspect.signature(optimizer_class).parameters.values()
    except (TypeError, ValueError):
        return {**tier_kwargs, **arm_kwargs}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return {**tier_kwargs, **arm_kwargs}
    accepted = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {**{k: v for k, v in tier_kwargs.items() if k in accepted}, **arm_kwargs}


def make_optimizer(spec: str, groups: list[dict[str, Any]], kwargs: dict[str, Any]) -> torch.optim.Optimizer:
    """Build arm ``spec`` over the tier's param groups with the tier's constructor ``kwargs``."""
    optimizer_class = resolve_optimizer(spec)
    arm_kwargs = parse_spec(spec)[1]
    group_keys = {key for group in groups for key in group if key != "params"}
    overrides = {k: v for k, v in arm_kwargs.items() if k in group_keys}
    if overrides:
        groups = [{**group, **overrides} for group in groups]
    return optimizer_class(groups, **constructor_kwargs(optimizer_class, kwargs, arm_kwargs))


# --- what an arm's code does on a device --------------------------------------------------------------------


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# What any class body holds, with or without code of its own (Python 3.10-3.13 add the last ones).
_PLAIN_NAMES = frozenset(
    "__module__ __qualname__ __doc__ __dict__ __weakref__ __annotations__"
    " __orig_bases__ __parameters__ __firstlineno__ __static_attributes__ __annotate__ __annotate_func__".split()
)


def adds_nothing(cls: type, base: type) -> bool:
    """Whether ``cls`` is ``base`` or a subclass that defines no attribute of its own."""
    if not (isinstance(cls, type) and issubclass(cls, base)):
        return False
    own = cls.__mro__[: cls.__mro__.index(base)]
    return all(set(vars(ancestor)) <= _PLAIN_NAMES for ancestor in own)


def _per_parameter_on(cls: type, device: str) -> bool:
    """Whether ``cls`` runs the baseline's per-parameter MuSGD step on ``device``, adding nothing to it."""
    if adds_nothing(cls, MuSGD):
        return True
    return adds_nothing(cls, BatchedMuSGD) and not _batched.batches_on(torch.device(device))


def _class_or_none(spec: str) -> type | None:
    """The class of a spec without importing ultralytics (a parent must not), None where unknown."""
    try:
        if parse_spec(spec)[0] == "upstream":
            return None
        return resolve_optimizer(spec)
    except ArmError:
        return None


def same_path_as_baseline(spec: str, device: str, baseline: str = "baseline") -> str | None:
    """Why arm ``spec`` runs the same code as the ``baseline`` arm on ``device``."""
    spec, baseline = spec.strip(), baseline.strip()
    if spec == baseline:
        return f"{spec} is the baseline's own arm"
    try:
        if parse_spec(spec)[1] != parse_spec(baseline)[1]:
            return None
    except ArmError:
        return None
    mine, theirs = _class_or_none(spec), _class_or_none(baseline)
    if mine is None or theirs is None:
        return None
    if mine is theirs:
        return f"{spec} names the baseline's class ({_qualified(mine)})"
    if _per_parameter_on(mine, device) and _per_parameter_on(theirs, device):
        return (
            f"{spec} ({_qualified(mine)}) keeps the per-parameter step on {device}, as BatchedMuSGD batches "
            "CUDA tensors only"
        )
    return None


def describe_arm(spec: str, device: str) -> str:
    """What arm ``spec`` runs on ``device``, in a few words (for the first line of a console, claim, report)."""
    spec = spec.strip()
    kwargs = _kwargs_or_none(spec)
    given = f" with {', '.join(f'{k}={v!r}' for k, v in kwargs.items())}" if kwargs else ""
    if kwargs is not None and parse_spec(spec)[0] == "upstream":
        return f"the MuSGD of the installed ultralytics (ultralytics.optim.MuSGD){given}"
    cls = _class_or_none(spec)
    if cls is None:
        return spec
    return _describe_class(cls, device) + given


def _describe_class(cls: type, device: str) -> str:
    name = _qualified(cls)
    if issubclass(cls, BatchedMuSGDOnCPU):
        return f"the batched path with CPU tensors routed through it ({name})"
    if _per_parameter_on(cls, device):
        if issubclass(cls, BatchedMuSGD):
            return f"the per-parameter step, since {name} batches CUDA tensors only"
        return f"the per-parameter MuSGD ({name})"
    if issubclass(cls, BatchedMuSGD) and _batched.batches_on(torch.device(device)):
        return f"batched Newton-Schulz and foreach momentum ({name})"
    if issubclass(cls, MuSGD):
        return f"{name}, with code of its own over {_qualified(cls.__mro__[1])}"
    return name


def arm_code(cases: Iterable[Case], device: str) -> dict[str, dict[str, Any]]:
    """Per arm label (plan order): its spec, what it runs on ``device``, why it runs the baseline's code."""
    out: dict[str, dict[str, Any]] = {}
    for case in cases:
        baseline = case.arms[0].spec
        for position, arm in enumerate(case.arms):
            if arm.label in out:
                continue
            out[arm.label] = {
                "spec": arm.spec,
                "kwargs": _kwargs_or_none(arm.spec),
                "file": _source_file(arm.spec),
                "runs": describe_arm(arm.spec, device),
                "same_path_as_baseline": None
                if position == 0 or arm.role == "calibration"  # the baseline again by design, as a control
                else same_path_as_baseline(arm.spec, device, baseline),
                "code": class_fingerprint(_class_or_none(arm.spec)),  # a resume checks it
            }
    return out


def _source_file(spec: str) -> str | None:
    """The file of the module that defines an arm's class (None for a built-in arm or where unknown)."""
    if parse_spec(spec)[0] in ARM_NAMES:
        return None
    cls = _class_or_none(spec)
    module = sys.modules.get(cls.__module__) if cls is not None else None
    return getattr(module, "__file__", None)


def _kwargs_or_none(spec: str) -> dict[str, Any] | None:
    try:
        return parse_spec(spec)[1]
    except ArmError:
        return None


def arm_files(arms: str) -> list[str]:
    """The files of the modules an ``--arms`` list names (``bench env --arms``); ``InputError`` on a bad spec."""
    files = []
    for arm in parse_arms(arms, control=True):
        checked_optimizer(arm.spec, import_upstream=False)
        files.append(_source_file(arm.spec))
    return [file for file in files if file]


def default_arms(device: str) -> tuple[str, str]:
    """(arms, why) when ``--arms`` is not given: ``baseline,candidate-cpu`` or ``baseline,candidate``."""
    if same_path_as_baseline("candidate", device) is None:
        return DEFAULT_ARMS, f"the default on {device}"
    return CPU_DEFAULT_ARMS, (
        f"the default on {device}: there the candidate keeps the baseline's per-parameter step, so candidate-cpu "
        "routes CPU tensors through its batched path; --arms baseline,candidate would compare the same code"
    )


# --- what a resume checks: the start's own check, and the code fingerprint the plan recorded ------------------


def plan_specs(plan: Plan) -> dict[str, str]:
    """Every arm spec a plan names, by the option that gives it (an arm label, or a parity setting)."""
    specs = {arm.label: arm.spec for arm in plan.protocol.arms}
    specs.update({arm.label: arm.spec for case in plan.cases for arm in case.arms})
    for option in ("baseline", "candidate"):
        if isinstance(plan.settings.get(option), str):
            specs[f"--{option}"] = plan.settings[option]
    return specs


def arms_resume_problem(plan: Plan) -> str | None:
    """Why a resume cannot run a plan's arms (None where it can)."""
    for label, spec in plan_specs(plan).items():
        try:
            found = checked_optimizer(spec, option="its arms", import_upstream=False)
        except InputError as exc:
            return str(exc)
        recorded = (plan.arm_code.get(label) or {}).get("code")
        now = class_fingerprint(found)
        if recorded is not None and recorded != now:
            return (
                f"arm '{label}' ({spec}): its code changed since the run started ({_difference(recorded, now)}); "
                "a resume runs the code its rows came from: start a new run"
            )
    return None


def _difference(recorded: Any, now: dict[str, Any] | None) -> str:
    if not isinstance(recorded, dict) or now is None:
        return "the plan's record is not a fingerprint"
    if recorded.get("class") != now["class"]:
        return f"the class was {recorded.get('class')}, now {now['class']}"
    return f"{now['class']}'s source file differs"
