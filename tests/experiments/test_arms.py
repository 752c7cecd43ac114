"""The arm resolver: names and package.module:Class specs to optimizer classes, with clear errors."""

from __future__ import annotations

import builtins
import re
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from experiments.arms import (
    ARM_NAMES,
    ArmError,
    BatchedMuSGDOnCPU,
    arm_code,
    default_arms,
    describe_arm,
    make_optimizer,
    resolve_optimizer,
    same_path_as_baseline,
)
from experiments.workloads import build_param_groups
from harness.schedule import Arm, Case
from optimizers import BatchedMuSGD, MuSGD
from optimizers import batched as batched_module
from tests.optimizers.groups import CONV_SHAPES, conv_groups

# The conv-like shapes, with (8, 8, 3, 3) twice.
SHAPES = [*CONV_SHAPES, (8, 8, 3, 3)]


def test_named_arms() -> None:
    assert ARM_NAMES == ("baseline", "candidate", "candidate-cpu", "upstream")
    assert resolve_optimizer("baseline") is MuSGD
    assert resolve_optimizer(" candidate ") is BatchedMuSGD
    assert resolve_optimizer("candidate-cpu") is BatchedMuSGDOnCPU
    assert issubclass(BatchedMuSGDOnCPU, BatchedMuSGD)


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
        ("fastest", "unknown arm 'fastest'.*baseline, candidate, candidate-cpu, upstream"),
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


@pytest.mark.parametrize(
    ("source", "spec"),
    [
        (None, ".relative:Opt"),
        ("raise RuntimeError('broken at import')\n", "arm_breaks_at_import:Opt"),
        ("def (:\n", "arm_has_a_syntax_error:Opt"),
        ("import sys\nsys.exit(3)\n", "arm_exits_at_import:Opt"),
    ],
)
def test_a_module_that_cannot_be_imported_is_an_arm_error(tmp_path, monkeypatch, source, spec: str) -> None:
    """A relative module path, or a module raising anything while it imports (or exiting), is an ArmError
    naming the module.
    """
    module = spec.partition(":")[0]
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ArmError, match=f"cannot import module '{re.escape(module)}'"):
        resolve_optimizer(spec)


@pytest.mark.parametrize("spec", ["baseline", "candidate", "candidate-cpu"])
def test_make_optimizer_builds_over_workload_groups(spec: str) -> None:
    groups, kwargs = build_param_groups("n")
    optimizer = make_optimizer(spec, groups, kwargs)
    assert isinstance(optimizer, resolve_optimizer(spec))
    assert (optimizer.muon, optimizer.sgd) == (0.2, 1.0)
    assert [g["param_group"] for g in optimizer.param_groups] == [g["param_group"] for g in groups]


# --- what an arm's code does on a device --------------------------------------------------------------------


class RecordedOps(TorchDispatchMode):
    """The names of the aten operators a block dispatches (what code actually ran, whatever the Python)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def one_step(spec: str) -> tuple[torch.optim.Optimizer, set[str]]:
    groups, kwargs = conv_groups(SHAPES)
    optimizer = make_optimizer(spec, groups, kwargs)
    with RecordedOps() as ops:
        optimizer.step()
    return optimizer, ops.names


def test_candidate_cpu_runs_the_batched_path_on_cpu_tensors_and_candidate_does_not() -> None:
    baseline, baseline_ops = one_step("baseline")
    candidate, candidate_ops = one_step("candidate")
    routed, routed_ops = one_step("candidate-cpu")
    batched = {"bmm", "_foreach_lerp_"}  # (SGD momentum's multiply is one flat mul_ now)
    assert not batched & baseline_ops and not batched & candidate_ops  # the per-parameter step, twice
    assert batched <= routed_ops  # batched Newton-Schulz and foreach momentum
    assert not batched_module.batches_on(torch.device("cpu"))  # the switch is restored after the step
    # The candidate's algorithm, not another one: the Muon momentum (computed before any update) is bit for bit
    # the baseline's (how far the updates may differ is the batched-path tests' calibrated bound).
    for p_base, p_routed in zip(
        (p for g in baseline.param_groups for p in g["params"]),
        (p for g in routed.param_groups for p in g["params"]),
        strict=True,
    ):
        assert torch.equal(
            baseline.state[p_base]["momentum_buffer"], routed.state[p_routed]["momentum_buffer"]
        )


def test_candidate_cpu_restores_the_switch_when_a_step_raises() -> None:
    groups, kwargs = conv_groups(SHAPES)
    optimizer = make_optimizer("candidate-cpu", groups, kwargs)

    def closure() -> None:
        raise RuntimeError("closure failed")

    with pytest.raises(RuntimeError, match="closure failed"):
        optimizer.step(closure)
    assert not batched_module.batches_on(torch.device("cpu"))


def test_a_guarded_candidate_cpu_still_routes_cpu_tensors() -> None:
    guarded = BatchedMuSGDOnCPU.with_pad_guard(0)
    assert issubclass(guarded, BatchedMuSGDOnCPU) and guarded.pad_guard == 0
    groups, kwargs = conv_groups(SHAPES)
    with RecordedOps() as ops:
        guarded(groups, **kwargs).step()
    assert "_foreach_lerp_" in ops.names


@pytest.mark.parametrize(
    ("spec", "device", "baseline", "expected"),
    [
        ("candidate", "cpu", "baseline", "candidate .*keeps the per-parameter step on cpu"),
        ("candidate", "cuda", "baseline", None),
        ("candidate-cpu", "cpu", "baseline", None),
        ("candidate-cpu", "cuda", "baseline", None),
        (
            "optimizers.musgd:MuSGD",
            "cuda",
            "baseline",
            r"names the baseline's class \(optimizers.musgd.MuSGD\)",
        ),
        ("baseline", "cpu", "baseline", "is the baseline's own arm"),
        ("upstream", "cpu", "baseline", None),  # not importable in a parent: never presumed the same
        ("torch.optim:SGD", "cpu", "baseline", None),
        ("candidate", "cpu", "candidate-cpu", None),
    ],
)
def test_same_path_as_baseline(spec: str, device: str, baseline: str, expected: str | None) -> None:
    reason = same_path_as_baseline(spec, device, baseline)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and re.search(expected, reason), reason


def test_what_each_arm_runs_is_said_in_words_and_recorded_per_label() -> None:
    assert "per-parameter MuSGD (optimizers.musgd.MuSGD)" in describe_arm("baseline", "cpu")
    assert "per-parameter step" in describe_arm("candidate", "cpu")
    assert "batched Newton-Schulz" in describe_arm("candidate", "cuda")
    assert "CPU tensors routed through it" in describe_arm("candidate-cpu", "cpu")
    assert "ultralytics" in describe_arm("upstream", "cpu")
    arms = (
        Arm("baseline", "baseline", "baseline"),
        Arm("candidate@g0", "candidate", "candidate", {"guard": "0"}),
        Arm("candidate-cpu", "candidate", "candidate-cpu"),
    )
    code = arm_code([Case("n", {}, arms), Case("s", {}, arms)], "cpu")
    assert list(code) == ["baseline", "candidate@g0", "candidate-cpu"]
    assert code["baseline"]["same_path_as_baseline"] is None
    assert "per-parameter" in code["candidate@g0"]["same_path_as_baseline"]
    assert code["candidate-cpu"]["same_path_as_baseline"] is None
    assert code["candidate-cpu"]["spec"] == "candidate-cpu"


def test_default_arms_compare_two_computations_on_every_device() -> None:
    arms, why = default_arms("cpu")
    assert arms == "baseline,candidate-cpu" and "per-parameter" in why
    assert default_arms("cuda")[0] == "baseline,candidate"
    for device in ("cpu", "cuda"):
        baseline, candidate = default_arms(device)[0].split(",")
        assert same_path_as_baseline(candidate, device, baseline) is None
