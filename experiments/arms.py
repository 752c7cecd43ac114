"""Naming arms: the one resolver every command uses to turn an arm spec into an optimizer class, and what
each arm's code does on a device.

An arm spec is `baseline` (optimizers.MuSGD), `candidate` (optimizers.BatchedMuSGD), `candidate-cpu`
(``BatchedMuSGDOnCPU``: the candidate with CPU tensors routed through its batched path), `upstream` (the
installed `ultralytics.optim.MuSGD`) or `package.module:Class` for any optimizer with MuSGD's constructor.

On a device where the candidate keeps the baseline's per-parameter step (today every device but CUDA), a
`baseline,candidate` run compares the same code twice: ``same_path_as_baseline`` says so, with the reason,
so the run can be called what it is (an A/A in effect) and its conclusions withheld. ``default_arms`` makes
`candidate-cpu` the candidate where that happens, so the default job still compares two computations.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from typing import Any

import torch

from harness.code_origin import class_fingerprint, run_folder_code
from harness.options import DEFAULT_ARMS, InputError
from harness.protocol import Case
from optimizers import BatchedMuSGD, MuSGD
from optimizers import batched as _batched

ARM_NAMES = ("baseline", "candidate", "candidate-cpu", "upstream")
CPU_DEFAULT_ARMS = "baseline,candidate-cpu"


class ArmError(ValueError):
    """An arm spec that names no usable optimizer class; the message says what to do instead."""


class BatchedMuSGDOnCPU(BatchedMuSGD):
    """The candidate with CPU tensors routed through its batched path (arm `candidate-cpu`).

    ``BatchedMuSGD`` batches Newton-Schulz and dispatches foreach momentum for CUDA tensors only; on the CPU
    it keeps the baseline's per-parameter step, so `baseline,candidate` on a CPU runs one computation twice.
    This class runs each step inside ``optimizers.batched._batched_on_cpu``, so CPU parameters take the
    batched path exactly as CUDA ones do: zero-padded bf16 stacks, one batched Newton-Schulz per stack,
    foreach momentum. That is the candidate's own algorithm (the same plan, the same kernels' CPU versions),
    not a model of it; its CPU timings say what batching costs or saves on a CPU, nothing about a GPU. State,
    checkpoints and results are those of ``BatchedMuSGD``; the switch is restored when each step returns.
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        with _batched._batched_on_cpu(True):
            return super().step(closure)


def resolve_optimizer(spec: str) -> type[torch.optim.Optimizer]:
    """The optimizer class an arm spec names (see the module docstring); ArmError when it cannot."""
    spec = spec.strip()
    if spec == "baseline":
        return MuSGD
    if spec == "candidate":
        return BatchedMuSGD
    if spec == "candidate-cpu":
        return BatchedMuSGDOnCPU
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
            f"arm {spec!r}: cannot import module {module_name!r} ({type(error).__name__}: {why})"
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
    spec: str, option: str = "--arms", import_upstream: bool = True
) -> type[torch.optim.Optimizer] | None:
    """The class an arm spec names, or ``InputError`` (one line, exit 2) naming the option that gave it.

    The class is built once on a tiny parameter set (``check_constructor``), so a constructor that does not fit
    is refused before any schedule. ``import_upstream=False`` only checks that ultralytics is installed for
    ``upstream`` (and returns None):
    a parent that hands trials to workers must not import it, since importing reads its settings and may try
    the network; the worker resolves it.
    """
    if spec.strip() == "upstream" and not import_upstream:
        if importlib.util.find_spec("ultralytics") is None:
            raise InputError(
                f"{option}: arm 'upstream' needs ultralytics; install the extra (pip install -e '.[ultralytics]')"
            )
        return None
    try:
        optimizer_class = resolve_optimizer(spec)
    except ArmError as exc:
        raise InputError(f"{option}: {exc}") from None
    check_constructor(optimizer_class, spec, option)
    return optimizer_class


# MuSGD's constructor as every tier calls it: the trainer's groups (use_muon, decay, param_group) and muon/sgd.
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


def check_constructor(
    optimizer_class: type[torch.optim.Optimizer], spec: str, option: str = "--arms"
) -> None:
    """Build the arm once on a tiny parameter set, before any schedule: a class whose constructor does not take
    what every trial gives it is one line (``InputError``) here, not an error row in every trial."""
    try:
        optimizer_class(tiny_param_groups(), **CONSTRUCTOR_KWARGS)
    except Exception as exc:  # noqa: BLE001 - any complaint of the constructor is the user's to read
        complaint = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise InputError(
            f"{option}: arm '{spec}' cannot be built with MuSGD's constructor (param groups with use_muon, "
            f"muon=0.2, sgd=1.0): {complaint[:300]}"
        ) from None


def make_optimizer(spec: str, groups: list[dict[str, Any]], kwargs: dict[str, Any]) -> torch.optim.Optimizer:
    """Resolve an arm and build it over param groups with the given constructor kwargs (e.g. muon, sgd)."""
    return resolve_optimizer(spec)(groups, **kwargs)


# --- what an arm's code does on a device --------------------------------------------------------------------


def _batches_on(device: str) -> bool:
    """Whether ``BatchedMuSGD`` takes its batched path for tensors on ``device`` (outside any switch)."""
    decide = getattr(_batched, "_batches_on", None)
    kind = torch.device(device)
    return bool(decide(kind)) if decide is not None else kind.type == "cuda"


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _per_parameter_on(cls: type, device: str) -> bool:
    """Whether ``cls`` runs the baseline's per-parameter MuSGD step on ``device``: MuSGD's own step, or
    BatchedMuSGD's step (not overridden) where BatchedMuSGD does not batch."""
    step = getattr(cls, "step", None)
    if step is MuSGD.step:
        return True
    return (
        isinstance(cls, type)
        and issubclass(cls, BatchedMuSGD)
        and step is BatchedMuSGD.step
        and not _batches_on(device)
    )


def _class_or_none(spec: str) -> type | None:
    """The class of a spec without importing ultralytics (a parent must not), None where unknown."""
    if spec.strip() == "upstream":
        return None
    try:
        return resolve_optimizer(spec)
    except ArmError:
        return None


def same_path_as_baseline(spec: str, device: str, baseline: str = "baseline") -> str | None:
    """Why arm ``spec`` runs the same code as the ``baseline`` arm on ``device``, or None where it runs other
    code (or where that cannot be known without importing it, as for ``upstream``)."""
    spec, baseline = spec.strip(), baseline.strip()
    if spec == baseline:
        return f"{spec} is the baseline's own arm"
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
    if spec == "upstream":
        return "the MuSGD of the installed ultralytics (ultralytics.optim.MuSGD)"
    cls = _class_or_none(spec)
    if cls is None:
        return spec
    name = _qualified(cls)
    if issubclass(cls, BatchedMuSGDOnCPU):
        return f"the batched path (batched Newton-Schulz, foreach momentum) with CPU tensors routed through it ({name})"
    if _per_parameter_on(cls, device):
        if issubclass(cls, BatchedMuSGD):
            return f"the per-parameter step, since {name} batches CUDA tensors only"
        return f"the per-parameter MuSGD ({name})"
    if issubclass(cls, BatchedMuSGD):
        return f"batched Newton-Schulz and foreach momentum ({name})"
    return name


def arm_code(cases: Iterable[Case], device: str) -> dict[str, dict[str, Any]]:
    """Per arm label (plan order): its spec, what it runs on ``device`` and, for every arm after a case's
    first, why it runs the baseline's code (None where it does not): what a plan records."""
    out: dict[str, dict[str, Any]] = {}
    for case in cases:
        baseline = case.arms[0].spec
        for position, arm in enumerate(case.arms):
            if arm.label in out:
                continue
            out[arm.label] = {
                "spec": arm.spec,
                "runs": describe_arm(arm.spec, device),
                "same_path_as_baseline": None
                if position == 0
                else same_path_as_baseline(arm.spec, device, baseline),
                "code": class_fingerprint(_class_or_none(arm.spec)),  # a resume checks it
            }
    return out


def default_arms(device: str) -> tuple[str, str]:
    """(arms, why) when ``--arms`` is not given: ``baseline,candidate-cpu`` where the candidate would keep the
    baseline's per-parameter step (on the CPU), else ``baseline,candidate``."""
    if same_path_as_baseline("candidate", device) is None:
        return DEFAULT_ARMS, f"the default on {device}"
    return CPU_DEFAULT_ARMS, (
        f"the default on {device}: there the candidate keeps the baseline's per-parameter step, so candidate-cpu "
        "routes CPU tensors through its batched path; --arms baseline,candidate would compare the same code"
    )
