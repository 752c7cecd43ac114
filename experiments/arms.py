"""Naming arms: the one resolver every command uses to turn an arm spec into an optimizer class.

An arm spec is `baseline` (optimizers.MuSGD), `candidate` (optimizers.BatchedMuSGD), `upstream` (the
installed `ultralytics.optim.MuSGD`) or `package.module:Class` for any optimizer with MuSGD's constructor.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch

from harness.options import InputError
from optimizers import BatchedMuSGD, MuSGD

ARM_NAMES = ("baseline", "candidate", "upstream")


class ArmError(ValueError):
    """An arm spec that names no usable optimizer class; the message says what to do instead."""


def resolve_optimizer(spec: str) -> type[torch.optim.Optimizer]:
    """The optimizer class an arm spec names (see the module docstring); ArmError when it cannot."""
    spec = spec.strip()
    if spec == "baseline":
        return MuSGD
    if spec == "candidate":
        return BatchedMuSGD
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
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ArmError(f"arm {spec!r}: cannot import module {module_name!r} ({error})") from None
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
