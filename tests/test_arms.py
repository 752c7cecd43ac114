"""The arm resolver: names and package.module:Class specs to optimizer classes, with clear errors."""

from __future__ import annotations

import builtins
from typing import Any

import pytest
import torch

from experiments.arms import ARM_NAMES, ArmError, make_optimizer, resolve_optimizer
from experiments.workloads import build_param_groups
from optimizers import BatchedMuSGD, MuSGD


def test_named_arms() -> None:
    assert ARM_NAMES == ("baseline", "candidate", "upstream")
    assert resolve_optimizer("baseline") is MuSGD
    assert resolve_optimizer(" candidate ") is BatchedMuSGD


def test_upstream_is_the_installed_ultralytics_musgd() -> None:
    muon = pytest.importorskip("ultralytics.optim.muon")
    assert resolve_optimizer("upstream") is muon.MuSGD


def test_upstream_without_ultralytics_says_to_install_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def without_ultralytics(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("ultralytics"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_ultralytics)
    with pytest.raises(ArmError, match=r"install the extra.*musgd-bench\[ultralytics\]") as error:
        resolve_optimizer("upstream")
    assert "\n" not in str(error.value)


def test_any_optimizer_class_by_module_path() -> None:
    assert resolve_optimizer("torch.optim:SGD") is torch.optim.SGD
    assert resolve_optimizer("optimizers.batched:BatchedMuSGD") is BatchedMuSGD


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fastest", "unknown arm 'fastest'.*baseline, candidate, upstream"),
        ("no_such_module_xyz:Opt", "cannot import module 'no_such_module_xyz'"),
        ("torch.optim:NoSuchOptimizer", "has no attribute 'NoSuchOptimizer'"),
        ("collections:OrderedDict", "not a torch.optim.Optimizer subclass"),
        ("torch.optim:", "unknown arm"),
    ],
)
def test_bad_specs_raise_arm_errors(spec: str, message: str) -> None:
    with pytest.raises(ArmError, match=message):
        resolve_optimizer(spec)
    assert issubclass(ArmError, ValueError)


@pytest.mark.parametrize("spec", ["baseline", "candidate"])
def test_make_optimizer_builds_over_workload_groups(spec: str) -> None:
    groups, kwargs = build_param_groups("n")
    optimizer = make_optimizer(spec, groups, kwargs)
    assert isinstance(optimizer, resolve_optimizer(spec))
    assert (optimizer.muon, optimizer.sgd) == (0.2, 1.0)
    assert [g["param_group"] for g in optimizer.param_groups] == [g["param_group"] for g in groups]
