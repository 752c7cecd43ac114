"""YOLO26 parameter sets built from the shipped data."""

from __future__ import annotations

import pytest
import torch

from experiments.workloads import SCALES, build_param_groups, fill_synthetic_grads, load_workload

GROUP_KEYS = {"params", "lr", "momentum", "nesterov", "weight_decay", "use_muon", "param_group"}


@pytest.mark.parametrize("scale", SCALES)
def test_every_scale_loads_with_the_documented_schema(scale: str) -> None:
    workload = load_workload(scale)
    assert workload["scale"] == scale and workload["optimizer_kwargs"] == {"muon": 0.2, "sgd": 1.0}
    assert len(workload["groups"]) == 8 and workload["params"]
    assert {"order", "shape", "group", "use_muon", "requires_grad"} <= set(workload["params"][0])


def test_an_unknown_scale_names_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="n, s, m, l, x"):
        load_workload("xl")


def test_groups_follow_the_data_in_optimizer_order() -> None:
    workload = load_workload("n")
    groups, kwargs = build_param_groups("n")
    assert kwargs == {"muon": 0.2, "sgd": 1.0}
    nonempty = [g for g in workload["groups"] if g["num_params"]]
    assert len(groups) == len(nonempty) == 6  # the two plain-weight groups are empty for YOLO26
    entries = sorted(workload["params"], key=lambda e: e["order"])
    by_group = [e for spec in nonempty for e in entries if e["group"] == spec["index"]]
    params = [p for g in groups for p in g["params"]]
    assert [list(p.shape) for p in params] == [e["shape"] for e in by_group]
    for group, spec in zip(groups, nonempty, strict=True):
        assert set(group) == GROUP_KEYS
        assert all(group[key] == spec[key] for key in GROUP_KEYS - {"params"})
        assert all(isinstance(p, torch.nn.Parameter) and p.dtype == torch.float32 for p in group["params"])
    assert all(p.ndim == 4 for g in groups if g["use_muon"] for p in g["params"])


def test_parameters_are_seeded_small_and_take_dtype_and_device() -> None:
    first, _ = build_param_groups("n", seed=3)
    again, _ = build_param_groups("n", seed=3, dtype=torch.bfloat16)
    other, _ = build_param_groups("n", seed=4)
    a, b, c = (
        torch.cat([p.detach().flatten().float() for g in groups for p in g["params"]])
        for groups in (first, again, other)
    )
    assert torch.equal(a.bfloat16().float(), b) and not torch.equal(a, c)
    assert 0.01 < a.std().item() < 0.03


def test_synthetic_gradients_are_seeded_and_reuse_existing_gradient_memory() -> None:
    groups, _ = build_param_groups("n")
    fill_synthetic_grads(groups, seed=1)
    params = [p for g in groups for p in g["params"]]
    first = [p.grad.clone() for p in params]
    addresses = [p.grad.data_ptr() for p in params]
    fill_synthetic_grads(groups, seed=2)
    assert not torch.equal(first[0], params[0].grad)
    fill_synthetic_grads(groups, seed=1)
    assert all(torch.equal(a, p.grad) for a, p in zip(first, params, strict=True))
    assert [p.grad.data_ptr() for p in params] == addresses
    assert all(p.grad.dtype == p.dtype and p.grad.shape == p.shape for p in params)


def test_frozen_parameters_get_no_gradient() -> None:
    groups, _ = build_param_groups("n")
    groups[-1]["params"][0].requires_grad_(False)
    fill_synthetic_grads(groups, seed=0)
    assert groups[-1]["params"][0].grad is None and groups[-1]["params"][1].grad is not None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_values_do_not_depend_on_the_device() -> None:
    cpu_groups, _ = build_param_groups("n", seed=5)
    cuda_groups, _ = build_param_groups("n", device="cuda", seed=5)
    fill_synthetic_grads(cpu_groups, seed=6)
    fill_synthetic_grads(cuda_groups, seed=6)
    for a, b in zip(
        (p for g in cpu_groups for p in g["params"]),
        (p for g in cuda_groups for p in g["params"]),
        strict=True,
    ):
        assert b.is_cuda and torch.equal(a, b.cpu()) and torch.equal(a.grad, b.grad.cpu())
