"""The candidate BatchedMuSGD against the per-parameter baseline: every rule of GUIDE §5 and the §6 contract.

CPU tests force the batched path (`batched_on_cpu`), so batching, padding, planning and the foreach calls
run in CI; CUDA tests check what only CUDA can show (foreach fast paths, cuBLAS batched rounding).
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.dlpack import from_dlpack, to_dlpack

from experiments.parity_steps import ULP_SENSITIVITY_FACTOR, ulp_sensitivity
from experiments.workloads import build_param_groups, fill_synthetic_grads
from optimizers import BatchedMuSGD, MuSGD, newton_schulz
from optimizers import batched as batched_module
from optimizers.batched import batched_on_cpu, batches_on
from optimizers.batched import planning as planning_module
from optimizers.batched.plan import _classes, _Plan
from optimizers.batched.planning import (
    _overlapping,
    _span_index,
    _spans_meet,
    _union_ends,
)
from optimizers.batched.stacks import (
    _allocate_stack,
    _Batch,
    _Member,
    _orthogonalize_stacks,
    _runs,
    _split_by_cost,
)
from optimizers.concurrent import newton_schulz_flops
from optimizers.dispatch import count_dispatched_ops
from tests.optimizers.groups import HYPER, fill_grads, params_of, scaled_params

cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[cuda, needs_cuda])]

# The tolerance of every bf16 agreement check: ULP_SENSITIVITY_FACTOR times the baseline's own measured
# response to ±1-ulp input perturbations (experiments.parity, where `bench parity` uses the same rule).


pytestmark = pytest.mark.usefixtures("batched_cpu_one_thread")


def _muon_group(params: list[torch.Tensor], **overrides: Any) -> dict[str, Any]:
    return {"params": params, **HYPER, "use_muon": True, "param_group": "muon", **overrides}


def _sgd_group(params: list[torch.Tensor], **overrides: Any) -> dict[str, Any]:
    return {"params": params, **HYPER, "use_muon": False, "param_group": "bn", **overrides}


def _make_params(
    shapes: list[tuple[int, ...]], seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> list[torch.nn.Parameter]:
    return scaled_params(shapes, torch.Generator().manual_seed(seed), device, dtype)


def _clone_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same groups over independent copies of their parameters (same class, values, dtype, device, layout)."""
    clones = []
    for group in groups:
        params = [
            type(p)(p.detach().clone(memory_format=torch.preserve_format), requires_grad=p.requires_grad)
            for p in group["params"]
        ]
        clones.append({**group, "params": params})
    return clones


def _run_both(
    groups: list[dict[str, Any]],
    steps: int,
    set_grads: Callable[[list[dict[str, Any]], int], None],
    kwargs: dict[str, Any] | None = None,
    candidate_class: type[BatchedMuSGD] = BatchedMuSGD,
) -> tuple[MuSGD, list[dict[str, Any]], BatchedMuSGD, list[dict[str, Any]]]:
    """Step the baseline and the candidate on identical copies with identical gradients."""
    kwargs = kwargs if kwargs is not None else {"muon": 0.2, "sgd": 1.0}
    base_groups, cand_groups = _clone_groups(groups), _clone_groups(groups)
    baseline, candidate = MuSGD(base_groups, **kwargs), candidate_class(cand_groups, **kwargs)
    for step in range(steps):
        for optimizer, optimizer_groups in ((baseline, base_groups), (candidate, cand_groups)):
            set_grads(optimizer_groups, step)
            optimizer.step()
    return baseline, base_groups, candidate, cand_groups


def _grads_by_seed(groups: list[dict[str, Any]], step: int) -> None:
    fill_grads([p for p in params_of(groups) if p.requires_grad], seed=100 + step)


def _plan(optimizer: BatchedMuSGD) -> _Plan:
    assert optimizer._plan is not None
    return optimizer._plan


def _batch_of(optimizer: BatchedMuSGD, p: torch.Tensor) -> str | None:
    for batch in _plan(optimizer).batches:
        if any(member.param is p for member in batch.members):
            return batch.kind
    return None


def _ids(params: list[torch.Tensor]) -> list[int]:
    """Identities, for comparing lists of tensors (== on tensors compares values)."""
    return [id(p) for p in params]


def _in_order(optimizer: BatchedMuSGD) -> list[int]:
    """Ids of the parameters stepped one by one, in order."""
    return [id(p) for group_plan in _plan(optimizer).groups for p in group_plan.in_order]


def _in_buckets(optimizer: BatchedMuSGD) -> list[int]:
    """Ids of the parameters whose SGD momentum runs as foreach lists."""
    return [
        id(p)
        for group_plan in _plan(optimizer).groups
        for bucket in group_plan.buckets
        for p in bucket.params
    ]


def _muon_matrices(optimizer: MuSGD, groups: list[dict[str, Any]]) -> list[torch.Tensor]:
    """The baseline's Newton-Schulz input of the last step (Nesterov groups), one per distinct matrix shape
    and dtype.

    That is enough to measure the 1-ulp sensitivity at every size without paying for every matrix.
    """
    matrices: dict[tuple[Any, ...], torch.Tensor] = {}
    for group in groups:
        if group["use_muon"]:
            for p in group["params"]:
                if p.grad is not None:
                    update = p.grad.lerp(optimizer.state[p]["momentum_buffer"], group["momentum"])
                    matrix = update.reshape(len(update), -1)
                    matrices.setdefault((*matrix.shape, matrix.dtype), matrix)
    return list(matrices.values())


def _assert_contract(
    baseline: MuSGD,
    base_groups: list[dict[str, Any]],
    candidate: BatchedMuSGD,
    cand_groups: list[dict[str, Any]],
    muon_tolerance: float,
) -> None:
    """One step from identical state: momentum buffers bit-equal, parameters within lr*muon*tolerance.

    `momentum_buffer_SGD` of a decayed Muon group reads p after the Muon update. So it may differ by the decay
    times the parameter difference. Everything else that depends only on gradients is exact.
    """
    for base_group, cand_group in zip(base_groups, cand_groups, strict=True):
        lr, wd = base_group["lr"], base_group["weight_decay"]
        for pb, pc in zip(base_group["params"], cand_group["params"], strict=True):
            assert pc.dtype == pb.dtype and pc.stride() == pb.stride()
            if pb.grad is None:
                assert torch.equal(pb, pc)
                continue
            own_rounding = 4 * torch.finfo(pb.dtype).eps * pb.abs().max().item()
            bound = lr * candidate.muon * muon_tolerance * (1 + lr * candidate.sgd * 2 * wd) + own_rounding
            difference = (pb.double() - pc.double()).abs().max().item()
            if base_group["use_muon"]:
                assert difference <= bound, (tuple(pb.shape), difference, bound)
            else:
                assert difference == 0, tuple(pb.shape)
            for key, buffer in baseline.state[pb].items():
                other = candidate.state[pc][key]
                if key == "momentum_buffer_SGD" and wd != 0:
                    slack = wd * bound + 4 * torch.finfo(buffer.dtype).eps * buffer.abs().max().item()
                    assert (buffer.double() - other.double()).abs().max().item() <= slack
                else:
                    assert torch.equal(buffer, other), (key, tuple(pb.shape))


# ---------------------------------------------------------------------------------------------- oracle


def test_yolo26n_matches_the_per_matrix_baseline() -> None:
    """The real YOLO26n parameter set: padded, exact-shape and single batches against the baseline."""
    groups, kwargs = build_param_groups("n", seed=0)
    baseline, base_groups, candidate, cand_groups = _run_both(
        groups, 1, lambda g, step: fill_synthetic_grads(g, seed=1 + step), kwargs
    )
    kinds = {batch.kind for batch in _plan(candidate).batches}
    assert kinds == {"padded", "uniform", "single"}
    tolerance = ULP_SENSITIVITY_FACTOR * max(
        ulp_sensitivity(m, trials=2) for m in _muon_matrices(baseline, base_groups)
    )
    _assert_contract(baseline, base_groups, candidate, cand_groups, tolerance)


# ---------------------------------------------------------------------------------------------- padding

MIXED_SMALL_16 = [(16, 8, 3, 3), (32, 16, 1, 1), (16, 16, 3, 3), (64, 16), (16, 40), (16, 16)]


def _single_padded_batch(
    shapes: list[tuple[int, ...]], device: str = "cpu"
) -> tuple[Any, list[torch.Tensor]]:
    params = _make_params(shapes, seed=3, device=device)
    fill_grads(params, seed=4)
    optimizer = BatchedMuSGD([_muon_group(params)])
    plan = optimizer._current_plan()
    (batch,) = plan.batches
    assert batch.kind == "padded" and len(batch.members) == len(shapes)
    return batch, [member.param.grad for member in batch.members]


def _orthogonalize(batch: _Batch, inputs: list[torch.Tensor], compute_dtype: torch.dtype = torch.bfloat16):
    """One batch's updates from its members' inputs, on a fresh stack in `compute_dtype`."""
    entry = _allocate_stack(batch, compute_dtype)
    torch._foreach_copy_(entry.slots, inputs)
    return _orthogonalize_stacks([entry])[0]


def test_padding_is_exact_in_float64() -> None:
    """Zero extension changes the batch, not the quintic: padded float64 equals per-matrix float64."""
    batch, updates = _single_padded_batch(MIXED_SMALL_16)
    padded = _orthogonalize(batch, updates, compute_dtype=torch.float64)
    for member, update, result in zip(batch.members, updates, padded, strict=True):
        exact = newton_schulz(update.reshape(len(update), -1), compute_dtype=torch.float64) * member.scale
        assert result.shape == member.param.shape
        assert (result.reshape(exact.shape) - exact).abs().max().item() < 1e-12


@pytest.mark.parametrize("device", DEVICES)
def test_padded_bf16_agrees_within_the_baselines_own_ulp_sensitivity(device: str) -> None:
    batch, updates = _single_padded_batch(MIXED_SMALL_16, device=device)
    padded = _orthogonalize(batch, updates)
    differences, sensitivities = [], []
    for member, update, result in zip(batch.members, updates, padded, strict=True):
        matrix = update.reshape(len(update), -1)
        exact = newton_schulz(matrix) * member.scale
        differences.append((result.reshape(exact.shape).float() - exact.float()).abs().max().item())
        sensitivities.append(ulp_sensitivity(matrix) * member.scale)
    tolerance = ULP_SENSITIVITY_FACTOR * max(sensitivities)
    print(f"\n{device}: padded-vs-exact max {max(differences):.3g}, 1-ulp spread {max(sensitivities):.3g}")
    assert max(differences) <= tolerance


@pytest.mark.parametrize("price", [None, BatchedMuSGD.pad_chain_flops], ids=["budget-rule", "priced"])
def test_padded_stacks_stay_within_their_own_param_and_grad_bytes(price: float | None) -> None:
    optimizer_class = type("Priced", (BatchedMuSGD,), {"pad_chain_flops": price})
    groups, kwargs = build_param_groups("n", seed=0)
    fill_synthetic_grads(groups, seed=1)
    optimizer = optimizer_class(groups, **kwargs)
    plan = optimizer._current_plan()
    padded = [batch for batch in plan.batches if batch.kind == "padded"]
    assert padded
    for batch in padded:
        stack_bytes = torch.Size(batch.stack_shape).numel() * 2  # bf16
        assert stack_bytes <= sum(member.nbytes for member in batch.members)
        assert all(member.small <= BatchedMuSGD.pad_guard for member in batch.members)

    # One wide fp32 matrix with many tiny ones of the same smaller dimension: the wide one brings 8 bytes
    # per element (param + grad), a bf16 slot costs 2, so under the budget rule exactly three tiny ones fit
    # in its stack (padding all ten to 4096 columns would cost 2.5 times the budget) and the other seven run
    # as an exact-shape batch. A chain price sees the same two chains cost less arithmetic with no tiny one
    # padded: the wide matrix alone, the ten tiny ones as one exact-shape batch.
    params = _make_params([(8, 4096)] + [(8, 8)] * 10)
    fill_grads(params, seed=2)
    optimizer = optimizer_class([_muon_group(params)])
    kinds = sorted((batch.kind, len(batch.members)) for batch in optimizer._current_plan().batches)
    assert kinds == ([("padded", 4), ("uniform", 7)] if price is None else [("single", 1), ("uniform", 10)])


@pytest.mark.parametrize(("guard", "expect_padded"), [(0, False), (8, False), (16, True), (None, True)])
def test_pad_guard_is_an_internal_knob(guard: int | None, expect_padded: bool) -> None:
    params = _make_params(MIXED_SMALL_16)
    fill_grads(params, seed=5)
    optimizer = BatchedMuSGD.with_pad_guard(guard)([_muon_group(params)])
    assert issubclass(type(optimizer), BatchedMuSGD) and optimizer.pad_guard == guard
    kinds = {batch.kind for batch in optimizer._current_plan().batches}
    assert ("padded" in kinds) == expect_padded


def _run_cost(run: list[_Member], chain_flops: float) -> float:
    return chain_flops + len(run) * newton_schulz_flops(run[0].small, max(m.large for m in run))


def _fits_budget(run: list[_Member]) -> bool:
    return len(run) * run[0].small * max(m.large for m in run) * 2 <= sum(m.nbytes for m in run)


def _partitions(items: list[_Member]) -> Iterator[list[list[_Member]]]:
    """Every set partition of `items` (Bell(n) of them: keep n small)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in _partitions(rest):
        yield [[first], *partition]
        for index in range(len(partition)):
            yield [*partition[:index], [first, *partition[index]], *partition[index + 1 :]]


def _contiguous_partitions(items: list[_Member]) -> Iterator[list[list[_Member]]]:
    """Every partition of `items` into runs that keep their order (2^(n-1) of them)."""
    for cuts in range(2 ** max(len(items) - 1, 0)):
        runs, start = [], 0
        for index in range(1, len(items)):
            if cuts >> (index - 1) & 1:
                runs.append(items[start:index])
                start = index
        yield [*runs, items[start:]]


@settings(max_examples=60, deadline=None)
@given(
    small=st.integers(1, 64),
    extras=st.lists(st.integers(0, 4096), min_size=1, max_size=6),
    element_sizes=st.lists(st.sampled_from([2, 4]), min_size=6, max_size=6),
    chain_flops=st.sampled_from([0.0, 1e4, 1e6, 1e8, 1e10, 1e30]),
    roomy=st.booleans(),
)
def test_the_cost_rule_finds_the_cheapest_runs_within_the_budget(
    small: int, extras: list[int], element_sizes: list[int], chain_flops: float, roomy: bool
) -> None:
    """Every run the prefix table makes fits its members' own bytes, and its runs cost the least of the
    fitting partitions.

    Those partitions are into runs of the width order. Where the budget never binds (`roomy`), the runs cost
    the least of every set partition. Where it binds, a partition out of order can be cheaper. Widths 23, 8,
    5, 1, 1 of bf16 parameters fit as {23, 1} and {8, 5, 1}. In order they fit only as {23, 8, 5} and {1, 1}.
    """
    members = [
        _Member(
            torch.empty(0),
            {},
            order,
            False,
            small,
            small + extra,
            1.0,
            10**18 if roomy else 2 * small * (small + extra) * size,
        )
        for order, (extra, size) in enumerate(zip(extras, element_sizes, strict=False))
    ]
    members.sort(key=lambda m: (-m.large, m.order))
    runs = _split_by_cost(members, 2, chain_flops)
    assert sorted(m.order for run in runs for m in run) == sorted(m.order for m in members)
    assert all(_fits_budget(run) for run in runs)
    candidates = _partitions(members) if roomy else _contiguous_partitions(members)
    best_cost = min(
        sum(_run_cost(run, chain_flops) for run in p) for p in candidates if all(map(_fits_budget, p))
    )
    assert sum(_run_cost(run, chain_flops) for run in runs) <= best_cost * (1 + 1e-12)


@pytest.mark.parametrize("price", [-1.0, float("inf"), float("nan")])
def test_the_chain_price_must_be_a_finite_number(price: float) -> None:
    params = _make_params(MIXED_SMALL_16)
    fill_grads(params, seed=5)
    optimizer = type("Priced", (BatchedMuSGD,), {"pad_chain_flops": price})([_muon_group(params)])
    with pytest.raises(ValueError, match="pad_chain_flops must be a finite number"):
        optimizer._current_plan()


def test_the_cost_rule_cuts_wasteful_padding_and_keeps_the_contract() -> None:
    """YOLO26x's groups: priced at what a chain is worth, the padded arithmetic falls; at zero it is exactly
    the matrices' own.

    The priced plan still computes the baseline's step, buffers bit-equal and parameters within the bound. It
    does so on a mixed set whose long and short members the rule splits.
    """

    def plan_flops(chain_flops: float | None) -> tuple[int, int, int]:
        groups, kwargs = build_param_groups("x", seed=0)
        fill_synthetic_grads(groups, seed=1)
        candidate_class = type("Priced", (BatchedMuSGD,), {"pad_chain_flops": chain_flops})
        plan = candidate_class(groups, **kwargs)._current_plan()
        padded = sum(batch.flops for batch in plan.batches)
        exact = sum(newton_schulz_flops(m.small, m.large) for b in plan.batches for m in b.members)
        return padded, exact, len(plan.batches)

    budget_only, exact, budget_chains = plan_flops(None)
    priced, _, priced_chains = plan_flops(5e9)
    free, _, free_chains = plan_flops(0.0)
    print(
        f"\nYOLO26x Newton-Schulz GFLOP: exact {exact / 1e9:.1f}, budget rule {budget_only / 1e9:.1f} "
        f"({budget_chains} chains), priced at 5 GFLOP {priced / 1e9:.1f} ({priced_chains}), free {free / 1e9:.1f}"
    )
    assert free == exact < priced < budget_only
    assert budget_chains < priced_chains <= free_chains

    shapes = [(16, 1024), (16, 1000), (16, 40), (16, 32, 1, 1), (16, 16, 3, 3)]
    groups = [_muon_group(_make_params(shapes, seed=7))]
    fill_grads(params_of(groups), seed=8)
    # Priced at 2 MFLOP a chain: 1000 pads to 1024 (waste 0.12 MFLOP), 144, 40 and 32 would waste 4.5 MFLOP
    # each there, but padding 40 and 32 to 144 (1.1 MFLOP) is cheaper than a chain of their own.
    priced_class = type("Priced", (BatchedMuSGD,), {"pad_chain_flops": 2e6})
    baseline, base_groups, candidate, cand_groups = _run_both(
        groups, 1, _grads_by_seed, candidate_class=priced_class
    )
    stacks = sorted(batch.stack_shape for batch in _plan(candidate).batches)
    assert stacks == [(2, 16, 1024), (3, 16, 144)], stacks
    tolerance = ULP_SENSITIVITY_FACTOR * max(
        ulp_sensitivity(m, trials=2) for m in _muon_matrices(baseline, base_groups)
    )
    _assert_contract(baseline, base_groups, candidate, cand_groups, tolerance)


# ---------------------------------------------------------------------------------------------- memory rules


def test_a_parameter_viewing_another_keeps_exact_shapes_and_order() -> None:
    """Aliases: exact-shape batches, scalar momentum, applied in order; equal to the baseline bit for bit.

    Order matters here: decay reads the owner after its alias's update only if the alias came first.
    """

    def aliased_params(values: torch.Tensor) -> list[torch.nn.Parameter]:
        owner = torch.nn.Parameter(values)
        alias = torch.nn.Parameter(values[4:12])  # a view of the parameter above
        return [owner, alias, *_make_params([(16, 72), (32, 16)], seed=6)]

    base = torch.randn(16, 32) * 0.02
    candidate_params, baseline_params = aliased_params(base.clone()), aliased_params(base.clone())
    candidate, baseline = BatchedMuSGD([_muon_group(candidate_params)]), MuSGD([_muon_group(baseline_params)])
    for step in range(2):
        for optimizer, params in ((candidate, candidate_params), (baseline, baseline_params)):
            fill_grads(params, seed=10 + step)
            optimizer.step()
    owner, alias = candidate_params[:2]
    assert _batch_of(candidate, owner) == "single" and _batch_of(candidate, alias) == "single"
    assert _in_order(candidate) == _ids([owner, alias])
    assert _in_buckets(candidate) == _ids(candidate_params[2:])
    assert torch.equal(owner, baseline_params[0]) and torch.equal(alias, baseline_params[1])


def test_dlpack_views_over_one_buffer_overlap_although_their_storages_differ() -> None:
    buffer = torch.randn(1024) * 0.02
    first = from_dlpack(to_dlpack(buffer[: 16 * 32])).view(16, 32)
    second = from_dlpack(to_dlpack(buffer[256 : 256 + 16 * 24])).view(16, 24)
    assert first.untyped_storage()._cdata != second.untyped_storage()._cdata  # different storage objects
    params = [torch.nn.Parameter(first), torch.nn.Parameter(second), *_make_params([(16, 40)], seed=7)]
    fill_grads(params, seed=8)
    optimizer = BatchedMuSGD([_muon_group(params)])
    optimizer.step()
    assert _in_order(optimizer) == _ids(params[:2])
    assert _batch_of(optimizer, params[0]) == "single" and _batch_of(optimizer, params[1]) == "single"
    assert _in_buckets(optimizer) == _ids(params[2:])


class OpaqueParameter(torch.nn.Parameter):
    """A parameter subclass that refuses storage inspection (as some wrapper subclasses do)."""

    def data_ptr(self) -> int:
        raise RuntimeError("opaque parameter: no data_ptr")

    def untyped_storage(self) -> torch.UntypedStorage:
        raise RuntimeError("opaque parameter: no storage")


@pytest.mark.parametrize("mixed", [False, True])
def test_opaque_parameters_keep_exact_shapes_and_scalar_momentum(mixed: bool) -> None:
    """Alone or mixed with ordinary parameters, the whole group keeps exact shapes, scalar momentum, order."""
    shapes = [(16, 72), (16, 72), (32, 16)]
    opaque = [OpaqueParameter(p.detach()) for p in _make_params(shapes, seed=9)]
    ordinary = _make_params([(16, 40)], seed=10) if mixed else []
    sgd_params = _make_params([(16,)], seed=11)
    groups = [_muon_group(opaque + ordinary), _sgd_group(sgd_params)]
    baseline, base_groups, candidate, cand_groups = _run_both(groups, 2, _grads_by_seed)
    group_plan = _plan(candidate).groups[0]
    assert group_plan.buckets == [] and len(group_plan.in_order) == len(opaque + ordinary)
    assert all(batch.kind != "padded" for batch in _plan(candidate).batches)
    assert _in_buckets(candidate) == _ids(cand_groups[1]["params"])  # other groups stay batched
    assert {type(p) for p in cand_groups[0]["params"][: len(opaque)]} == {OpaqueParameter}
    for pb, pc in zip(params_of(base_groups), params_of(cand_groups), strict=True):
        for key in baseline.state[pb]:
            if key == "momentum_buffer":
                assert torch.equal(baseline.state[pb][key], candidate.state[pc][key])
    for pb, pc in zip(params_of(base_groups), params_of(cand_groups), strict=True):
        if _batch_of(candidate, pc) == "single":
            assert torch.equal(pb, pc)  # a lone matrix runs exactly the baseline's computation


def test_shared_gradient_storage_and_odd_restored_state_take_the_scalar_path() -> None:
    shared, odd_state, ordinary = _make_params([(8,), (8,), (8,)], seed=12)
    muon_odd, muon_ok = _make_params([(16, 40), (16, 72)], seed=13)
    groups = [_sgd_group([shared, odd_state, ordinary]), _muon_group([muon_odd, muon_ok])]
    optimizer = BatchedMuSGD(groups)
    fill_grads(params_of(groups), seed=14)
    optimizer.step()
    shared.grad = shared.detach()  # gradient storage shared with its own parameter
    optimizer.state[odd_state]["momentum_buffer"] = optimizer.state[odd_state]["momentum_buffer"].double()
    optimizer.state[muon_odd]["momentum_buffer_SGD"] = optimizer.state[muon_odd][
        "momentum_buffer_SGD"
    ].bfloat16()
    reference = {
        id(p): (p.detach().clone(), {k: v.clone() for k, v in optimizer.state[p].items()})
        for p in params_of(groups)
    }
    optimizer._plan = None  # hand edits of state are not watched; a checkpoint load would reset the plan
    optimizer.step()
    assert set(_in_order(optimizer)) == {id(shared), id(odd_state), id(muon_odd)}
    # The scalar path is the baseline's per-parameter step, state dtype and all.
    for p in (shared, odd_state, muon_odd):
        before, state = reference[id(p)]
        expected = torch.nn.Parameter(before.clone())
        expected.grad = expected.detach() if p is shared else p.grad.clone()
        group = next(g for g in groups if any(q is p for q in g["params"]))
        check = MuSGD([{**group, "params": [expected]}])
        check.state[expected] = state
        check.step()
        assert torch.equal(expected, p)
        assert all(torch.equal(check.state[expected][k], optimizer.state[p][k]) for k in state)
    assert optimizer.state[odd_state]["momentum_buffer"].dtype == torch.float64


# ---------------------------------------------------------------------------------------------- dtypes, grads


def test_fp32_bf16_fp16_parameters_in_one_group_keep_independent_buckets() -> None:
    shapes = [(16, 72), (16, 40), (32, 16)]
    params = [
        p
        for i, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16))
        for p in _make_params(shapes, seed=20 + i, dtype=dtype)
    ]
    sgd_params = [
        p
        for dtype in (torch.float32, torch.bfloat16, torch.float16)
        for p in _make_params([(16,)], seed=30, dtype=dtype)
    ]
    groups = [_muon_group(params), _sgd_group(sgd_params)]
    baseline, base_groups, candidate, cand_groups = _run_both(groups, 1, _grads_by_seed)
    for group_plan in _plan(candidate).groups:
        dtypes = [bucket.params[0].dtype for bucket in group_plan.buckets]
        assert sorted(map(str, dtypes)) == sorted(map(str, {torch.float32, torch.bfloat16, torch.float16}))
        assert all(len({p.dtype for p in bucket.params}) == 1 for bucket in group_plan.buckets)
    assert all(len({m.param.dtype for m in batch.members}) == 1 for batch in _plan(candidate).batches)
    tolerance = ULP_SENSITIVITY_FACTOR * max(
        ulp_sensitivity(m) for m in _muon_matrices(baseline, base_groups)
    )
    _assert_contract(baseline, base_groups, candidate, cand_groups, tolerance)


def test_none_gradients_and_parameters_frozen_then_unfrozen() -> None:
    shapes = [(16, 72), (16, 40), (32, 16), (16, 16)]
    params = _make_params(shapes, seed=40)
    groups = [_muon_group(params), _sgd_group(_make_params([(16,), (8,)], seed=41))]
    frozen_at = {0: {1}, 1: {1, 2}, 2: set(), 3: {0}}  # step -> indices (into every param) without grads

    def grads(groups: list[dict[str, Any]], step: int) -> None:
        every = params_of(groups)
        fill_grads(every, seed=50 + step)
        for index in frozen_at[step]:
            every[index].grad = None

    steps = len(frozen_at)
    baseline, base_groups, candidate, cand_groups = _run_both(groups, steps, grads)
    # Muon inputs depend on gradients only, so each step's Newton-Schulz difference is bounded on its own;
    # parameter differences add up over the steps (decay feeds back only a 1e-5 fraction of them).
    tolerance = ULP_SENSITIVITY_FACTOR * max(
        ulp_sensitivity(m) for m in _muon_matrices(baseline, base_groups)
    )
    for pb, pc in zip(params_of(base_groups), params_of(cand_groups), strict=True):
        assert set(baseline.state[pb]) == set(candidate.state[pc])
        for key in baseline.state[pb]:
            if key == "momentum_buffer":
                assert torch.equal(baseline.state[pb][key], candidate.state[pc][key])
        bound = steps * 0.02 * candidate.muon * tolerance * 1.01 + 4 * torch.finfo(pb.dtype).eps
        assert (pb - pc).abs().max().item() <= bound


def test_all_zero_gradients_give_no_nan() -> None:
    """A zero matrix normalizes to zero (norm + 1e-7), padded or not: no NaN anywhere."""
    shapes = [*MIXED_SMALL_16, (260, 260), (260, 260), (300, 300)]
    groups = [_muon_group(_make_params(shapes, seed=15)), _sgd_group(_make_params([(16,)], seed=16))]
    optimizer = BatchedMuSGD(groups)
    for p in params_of(groups):
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert {batch.kind for batch in _plan(optimizer).batches} == {"padded", "uniform", "single"}
    assert all(torch.isfinite(p).all() for p in params_of(groups))


@pytest.mark.parametrize("device", DEVICES)
def test_updates_are_written_into_parameters_in_place_and_layouts_stay(device: str) -> None:
    shapes = [(16, 8, 3, 3), (32, 16, 1, 1), (16, 16, 3, 3), (64, 16), (260, 260), (260, 260), (300, 300)]
    contiguous = _make_params(shapes, seed=60, device=device)
    channels_last = [
        torch.nn.Parameter(p.detach().clone().to(memory_format=torch.channels_last))
        if p.ndim == 4
        else torch.nn.Parameter(p.detach().clone())
        for p in contiguous
    ]
    results = []
    for params in (contiguous, channels_last):
        layouts = [(p.data_ptr(), p.stride()) for p in params]
        optimizer = BatchedMuSGD([_muon_group(params)])
        for step in range(2):
            fill_grads(params, seed=61 + step)
            for p in params:
                p.grad = p.grad.contiguous(memory_format=torch.preserve_format)
                if p.ndim == 4 and params is channels_last:
                    p.grad = p.grad.contiguous(memory_format=torch.channels_last)
            optimizer.step()
        assert {batch.kind for batch in _plan(optimizer).batches} == {"padded", "uniform", "single"}
        assert [(p.data_ptr(), p.stride()) for p in params] == layouts
        results.append([p.detach().clone() for p in params])
    for a, b in zip(*results, strict=True):
        assert torch.equal(
            a, b
        )  # the stacks are built row-major either way, so channels_last changes nothing


# ---------------------------------------------------------------------------------------------- checkpoints


def test_checkpoint_resume_both_ways_equals_an_uninterrupted_run() -> None:
    """baseline -> candidate -> baseline through state_dicts equals never stopping, bit for bit.

    Distinct shapes keep every matrix a lone one, the baseline's exact computation, so bit-equality is the
    right bar. The state_dicts carry no field the other class would not know.
    """
    shapes = [(16, 8, 3, 3), (32, 72), (24, 40)]
    params = _make_params(shapes, seed=70)
    sgd_params = _make_params([(16,), (32,)], seed=71)
    groups = [_muon_group(params), _sgd_group(sgd_params)]

    uninterrupted = _clone_groups(groups)
    optimizer = MuSGD(uninterrupted)
    for step in range(6):
        _grads_by_seed(uninterrupted, step)
        optimizer.step()

    resumed = _clone_groups(groups)
    arms = [MuSGD, BatchedMuSGD, MuSGD]
    state: dict[str, Any] | None = None
    for leg, arm in enumerate(arms):
        optimizer = arm(resumed, muon=0.2, sgd=1.0)
        if state is not None:
            optimizer.load_state_dict(state)
        for step in range(2 * leg, 2 * leg + 2):
            _grads_by_seed(resumed, step)
            optimizer.step()
        state = copy.deepcopy(optimizer.state_dict())
        assert state["param_groups"][0]["param_group"] == "muon"
        assert {key for entry in state["state"].values() for key in entry} == {
            "momentum_buffer",
            "momentum_buffer_SGD",
        }
    for a, b in zip(params_of(uninterrupted), params_of(resumed), strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------- plan cache


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Grows by one each time a batched optimizer builds its step plan."""
    built: list[int] = []
    original = batched_module._build_plan
    monkeypatch.setattr(batched_module, "_build_plan", lambda *a: built.append(1) or original(*a))
    return built


def test_the_plan_is_reused_until_the_parameter_set_changes(builds: list[int]) -> None:
    params = _make_params([(16, 72), (16, 40), (8,)], seed=80)
    optimizer = BatchedMuSGD([_muon_group(params[:2]), _sgd_group(params[2:])])

    for step in range(3):  # fresh gradient tensors every step (as zero_grad(set_to_none=True) gives)
        fill_grads(params, seed=81 + step)
        optimizer.step()
    assert len(builds) == 1

    params[1].grad = None  # grad presence changes
    optimizer.step()
    assert len(builds) == 2
    fill_grads(params, seed=90)
    optimizer.step()
    assert len(builds) == 3

    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))  # new state object
    optimizer.step()
    assert len(builds) == 4

    with torch.no_grad():
        params[0].data = params[0].data.to(torch.float64)  # dtype (and memory) change
    optimizer.state[params[0]] = {k: v.double() for k, v in optimizer.state[params[0]].items()}
    params[0].grad = torch.zeros_like(params[0])
    optimizer.step()
    assert len(builds) == 5


def test_cpu_keeps_the_baseline_path_unless_forced() -> None:
    groups = [_muon_group(_make_params(MIXED_SMALL_16, seed=95)), _sgd_group(_make_params([(8,)], seed=96))]
    with batched_on_cpu(False):
        baseline, base_groups, candidate, cand_groups = _run_both(groups, 2, _grads_by_seed)
    assert _plan(candidate).batches == [] and _in_buckets(candidate) == []
    for pb, pc in zip(params_of(base_groups), params_of(cand_groups), strict=True):
        assert torch.equal(pb, pc)


def test_the_public_cpu_switch_routes_cpu_tensors_and_restores_itself() -> None:
    """`batched_on_cpu` is the documented switch: batched inside the block, the baseline's path after it."""
    cpu = torch.device("cpu")
    with batched_on_cpu(False):
        assert not batches_on(cpu) and batches_on(torch.device("cuda"))
        with pytest.raises(RuntimeError, match="inside"), batched_on_cpu():
            assert batches_on(cpu)
            params = _make_params([(8, 16), (8, 24)], seed=97)
            optimizer = BatchedMuSGD([_muon_group(params)])
            fill_grads(params, seed=98)
            optimizer.step()
            assert {b.kind for b in _plan(optimizer).batches} == {"padded"}
            raise RuntimeError("inside")
        assert not batches_on(cpu)


# ---------------------------------------------------------------------------------------------- CUDA


@cuda
@needs_cuda
def test_cuda_foreach_momentum_recurrence_is_bit_equal_to_the_scalar_path() -> None:
    """Twelve steps on YOLO26n: every momentum buffer bit-equal to the baseline's, step after step.

    Muon groups run without weight decay here, so their SGD buffers read only gradients. One SGD group gets
    decay, covering the foreach decay path too. That path reads p, updated by foreach adds.
    """
    groups, kwargs = build_param_groups("n", device="cuda", seed=0)
    for group in groups:
        group["weight_decay"] = 0.0 if group["use_muon"] else group["weight_decay"]
    groups[0]["weight_decay"] = 5e-4
    base_groups, cand_groups = _clone_groups(groups), _clone_groups(groups)
    baseline, candidate = MuSGD(base_groups, **kwargs), BatchedMuSGD(cand_groups, **kwargs)
    for step in range(12):
        fill_synthetic_grads(base_groups, seed=step)
        fill_synthetic_grads(cand_groups, seed=step)
        baseline.step()
        candidate.step()
        for pb, pc in zip(params_of(base_groups), params_of(cand_groups), strict=True):
            for key, buffer in baseline.state[pb].items():
                assert torch.equal(buffer, candidate.state[pc][key]), (step, key, tuple(pb.shape))
    assert _in_order(candidate) == []  # every parameter took the foreach path
    for base_group, cand_group in zip(base_groups, cand_groups, strict=True):
        if not base_group["use_muon"]:
            assert all(
                torch.equal(a, b) for a, b in zip(base_group["params"], cand_group["params"], strict=True)
            )


@cuda
@needs_cuda
def test_cuda_one_step_contract_on_yolo26n() -> None:
    groups, kwargs = build_param_groups("n", device="cuda", seed=0)
    baseline, base_groups, candidate, cand_groups = _run_both(
        groups, 1, lambda g, step: fill_synthetic_grads(g, seed=1 + step), kwargs
    )
    tolerance = ULP_SENSITIVITY_FACTOR * max(
        ulp_sensitivity(m, trials=2) for m in _muon_matrices(baseline, base_groups)
    )
    _assert_contract(baseline, base_groups, candidate, cand_groups, tolerance)


@cuda
@needs_cuda
def test_cuda_device_and_dtype_buckets_in_one_group() -> None:
    """CUDA fp32/bf16 and CPU fp32 parameters in one group: separate buckets, CPU on the baseline path."""
    with batched_on_cpu(False):
        cuda_params = _make_params([(16, 72), (16, 40)], seed=110, device="cuda") + _make_params(
            [(16, 72), (16, 40)], seed=111, dtype=torch.bfloat16, device="cuda"
        )
        cpu_params = _make_params([(16, 72)], seed=112)
        groups = [
            _muon_group(cuda_params + cpu_params),
            _sgd_group(_make_params([(16,)], seed=113, device="cuda")),
        ]
        baseline, base_groups, candidate, cand_groups = _run_both(groups, 2, _grads_by_seed)
        buckets = _plan(candidate).groups[0].buckets
        assert sorted((str(b.params[0].device), str(b.params[0].dtype)) for b in buckets) == [
            ("cuda:0", "torch.bfloat16"),
            ("cuda:0", "torch.float32"),
        ]
        assert _in_order(candidate) == _ids(cand_groups[0]["params"][-1:])
        for pb, pc in zip(params_of(base_groups), params_of(cand_groups), strict=True):
            assert torch.equal(baseline.state[pb]["momentum_buffer"], candidate.state[pc]["momentum_buffer"])
        assert torch.equal(base_groups[0]["params"][-1], cand_groups[0]["params"][-1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_momentum_buffers_stay_bit_equal_over_steps(dtype: torch.dtype) -> None:
    """bf16/fp16 buffers: every step's buf*m rounds as the baseline's `mul_` does, the scalar kept in float.

    Three steps, so the multiply sees non-zero buffers. The Muon group has no weight decay, so every buffer
    depends on gradients alone and must be bit-equal. The SGD groups' parameters then are too.
    """
    muon_params = _make_params([(16, 72), (16, 40), (32, 16), (16, 16), (16, 16)], seed=120, dtype=dtype)
    sgd_params = _make_params([(16,), (32,), (8, 4)], seed=121, dtype=dtype)
    groups = [_muon_group(muon_params, weight_decay=0.0), _sgd_group(sgd_params)]
    baseline, base_groups, candidate, cand_groups = _run_both(groups, 3, _grads_by_seed)
    assert _in_order(candidate) == []
    for pb, pc in zip(params_of(base_groups), params_of(cand_groups), strict=True):
        for key, buffer in baseline.state[pb].items():
            assert torch.equal(buffer, candidate.state[pc][key]), (key, tuple(pb.shape))
    for pb, pc in zip(base_groups[1]["params"], cand_groups[1]["params"], strict=True):
        assert torch.equal(pb, pc)


def test_the_plan_allocates_its_stacks_and_scratch_once_and_says_how_big_they_are() -> None:
    params = _make_params(MIXED_SMALL_16 + [(260, 260), (260, 260), (300, 300)], seed=130)
    optimizer = BatchedMuSGD([_muon_group(params)])
    addresses = []
    for step in range(3):
        fill_grads(params, seed=131 + step)
        optimizer.step()
        plan = _plan(optimizer)
        addresses.append(
            [entry.stack.tensor.data_ptr() for entry in plan.stacks] + [t.data_ptr() for t in plan.scratch]
        )
    assert addresses[0] == addresses[1] == addresses[2]
    assert {entry.batch.kind for entry in _plan(optimizer).stacks} == {"padded", "uniform", "single"}
    stacks = sum(entry.stack.tensor.numel() * 2 for entry in _plan(optimizer).stacks)
    scratch = sum(p.numel() * p.element_size() for p in params)  # one parameter-like view each
    assert optimizer.plan_bytes == stacks + scratch > scratch > 0


def test_padding_recovers_after_a_nan_once_the_state_is_reset() -> None:
    """A NaN gradient poisons its matrix's padding; the step zeroes padding, so a reset member recovers.

    Both optimizers see a NaN gradient for one padded member. That member's parameter and buffers are then
    reset by hand to the same finite values. The next step must agree within the usual bound.
    """
    groups = [_muon_group(_make_params(MIXED_SMALL_16, seed=140))]

    def grads(groups: list[dict[str, Any]], step: int) -> None:
        _grads_by_seed(groups, step)
        if step == 0:
            groups[0]["params"][0].grad[0, 0] = float("nan")

    baseline, base_groups, candidate, cand_groups = _run_both(groups, 1, grads)
    assert _batch_of(candidate, cand_groups[0]["params"][0]) == "padded"
    for optimizer, optimizer_groups in ((baseline, base_groups), (candidate, cand_groups)):
        poisoned = optimizer_groups[0]["params"][0]
        with torch.no_grad():
            poisoned.copy_(groups[0]["params"][0])
        for buffer in optimizer.state[poisoned].values():
            buffer.zero_()
        _grads_by_seed(optimizer_groups, 1)
        optimizer.step()
    tolerance = ULP_SENSITIVITY_FACTOR * max(
        ulp_sensitivity(m) for m in _muon_matrices(baseline, base_groups)
    )
    assert all(torch.isfinite(p).all() for p in params_of(cand_groups))
    for pb, pc in zip(params_of(base_groups), params_of(cand_groups), strict=True):
        assert (pb - pc).abs().max().item() <= 2 * 0.02 * candidate.muon * tolerance * 1.01 + 1e-6


def test_the_cpu_path_never_tries_to_capture() -> None:
    """Forced onto the batched path or not, a CPU step counts 'not on CUDA' and never touches CUDA."""
    cuda_was_initialized = torch.cuda.is_initialized()
    groups = [_muon_group(_make_params(MIXED_SMALL_16, seed=150)), _sgd_group(_make_params([(8,)], seed=151))]
    optimizer = BatchedMuSGD(groups)
    for step in range(3):
        _grads_by_seed(groups, step)
        optimizer.step()
    assert optimizer.graph_stats == {"eager: not on CUDA": 3}
    assert torch.cuda.is_initialized() == cuda_was_initialized


# ---------------------------------------------------------------------------------------------- host work


def _six_groups(seed: int, device: str = "cpu") -> list[dict[str, Any]]:
    """Two Muon and four SGD groups (as the YOLO26 trainer makes them), small shapes, all scalars shared."""
    muon_shapes = [[(16, 8, 3, 3), (16, 40)], [(32, 16, 1, 1), (16, 16), (16, 40)]]
    groups = [
        _muon_group(_make_params(shapes, seed=seed + i, device=device))
        for i, shapes in enumerate(muon_shapes)
    ]
    for i, shapes in enumerate([[(16,), (8,)], [(32,)], [(16,), (16,), (4,)], [(8,)]]):
        groups.append(_sgd_group(_make_params(shapes, seed=seed + 10 + i, device=device), weight_decay=0.0))
    return groups


def _one_list_per_group(values: list[Any]) -> tuple[int, ...]:
    """`_classes` that never merges: every group keeps its own foreach calls (the unmerged reference)."""
    return tuple(range(len(values)))


LR_SCHEDULE = [  # per step, the lr of each of the six groups: all equal, two classes, all distinct, equal again
    [0.02] * 6,
    [0.03, 0.01, 0.03, 0.01, 0.03, 0.01],
    [0.01, 0.02, 0.03, 0.04, 0.05, 0.06],
    [0.02] * 6,
]


def _step_with_schedule(optimizer: MuSGD, groups: list[dict[str, Any]], step: int) -> None:
    for group, lr in zip(optimizer.param_groups, LR_SCHEDULE[step], strict=True):
        group["lr"] = lr
    _grads_by_seed(groups, step)
    optimizer.step()


def test_merged_foreach_lists_change_no_bit_and_follow_the_scalar_pattern(
    monkeypatch: pytest.MonkeyPatch, builds: list[int]
) -> None:
    """Groups whose scalars are equal share foreach calls, bit for bit what one list per group computes.

    The schedule's lr pattern changes, making new merged lists under one plan.
    """
    merged_groups, alone_groups = _six_groups(seed=300), _clone_groups(_six_groups(seed=300))
    base_groups = _clone_groups(_six_groups(seed=300))
    merged, alone = (
        BatchedMuSGD(merged_groups, muon=0.2, sgd=1.0),
        BatchedMuSGD(alone_groups, muon=0.2, sgd=1.0),
    )
    baseline = MuSGD(base_groups, muon=0.2, sgd=1.0)
    for step in range(len(LR_SCHEDULE)):
        _step_with_schedule(merged, merged_groups, step)
        with monkeypatch.context() as patch:
            patch.setattr("optimizers.batched.plan._classes", _one_list_per_group)
            _step_with_schedule(alone, alone_groups, step)
        _step_with_schedule(baseline, base_groups, step)
        for pm, pa in zip(params_of(merged_groups), params_of(alone_groups), strict=True):
            assert torch.equal(pm, pa), (step, tuple(pm.shape))
            for key, buffer in merged.state[pm].items():
                assert torch.equal(buffer, alone.state[pa][key]), (step, key)
        # What depends on gradients and scalars only is the baseline's, bit for bit (each group's own lr).
        for group_m, group_b in zip(merged_groups, base_groups, strict=True):
            for pm, pb in zip(group_m["params"], group_b["params"], strict=True):
                assert torch.equal(merged.state[pm]["momentum_buffer"], baseline.state[pb]["momentum_buffer"])
                if not group_m["use_muon"]:
                    assert torch.equal(pm, pb), (step, tuple(pm.shape))
    assert builds == [1, 1]  # one plan each: scalar changes only pick other merged lists
    layouts = _plan(merged).layouts
    assert len(layouts) == 3  # all equal (seen twice), two classes, all distinct
    all_equal = layouts[next(iter(layouts))]
    assert len(all_equal.momentum) == 1  # both Muon groups' momentum in one pass
    assert [len(apply.pieces) for apply in all_equal.muon_apply] == [2]  # both groups' updates, one call
    assert len(all_equal.sgd) == 2 and len(all_equal.sgd_apply) == 1  # decayed Muon groups, the rest


def test_every_nesterov_and_decay_combination_matches_the_baseline_as_nesterov_flips() -> None:
    """Every Nesterov and decay combination matches the baseline bit for bit, with no gradient touched.

    The in-place forms in scratch are the Nesterov inputs, the decayed gradient and the Nesterov SGD update.
    Without Nesterov the buffers are read directly. Muon and SGD groups run with and without decay. The
    schedule moves momentum and lr, and flips one Muon group's Nesterov flag: another fill of the stacks.
    Batches have exact shapes (guard 0).
    """
    shapes = [(16, 8, 3, 3), (24, 40), (32, 16)]
    groups = []
    for i, (nesterov, decay) in enumerate([(True, 5e-4), (False, 5e-4), (True, 0.0), (False, 0.0)]):
        groups.append(_muon_group(_make_params(shapes, seed=400 + i), nesterov=nesterov, weight_decay=decay))
        groups.append(
            _sgd_group(_make_params([(16,), (8,)], seed=410 + i), nesterov=nesterov, weight_decay=decay)
        )
    base_groups, cand_groups = _clone_groups(groups), _clone_groups(groups)
    baseline = MuSGD(base_groups, muon=0.2, sgd=1.0)
    candidate = BatchedMuSGD.with_pad_guard(0)(cand_groups, muon=0.2, sgd=1.0)
    for step in range(6):
        for optimizer, optimizer_groups in ((baseline, base_groups), (candidate, cand_groups)):
            for group in optimizer.param_groups:
                group["lr"], group["momentum"] = 0.02 * (step + 1), 0.85 + 0.01 * step
            optimizer.param_groups[0]["nesterov"] = step % 3 != 2  # off at steps 2 and 5
            _grads_by_seed(optimizer_groups, step)
            grads = [p.grad.clone() for p in params_of(optimizer_groups)]
            optimizer.step()
            after = [p.grad for p in params_of(optimizer_groups)]
            assert all(map(torch.equal, after, grads)), step  # the step reads gradients, never writes them
        for base_group, cand_group in zip(base_groups, cand_groups, strict=True):
            for pb, pc in zip(base_group["params"], cand_group["params"], strict=True):
                where = (step, base_group["nesterov"], base_group["weight_decay"], tuple(pb.shape))
                assert torch.equal(pb, pc), where
                for key, buffer in baseline.state[pb].items():
                    assert torch.equal(buffer, candidate.state[pc][key]), (*where, key)
    assert {b.kind for b in _plan(candidate).batches} == {"uniform"}  # exact shapes: no padding
    # One fill whatever Nesterov does: the core reads every input from scratch (a Nesterov input, or a copy of
    # the momentum buffer).
    scratch = {t.untyped_storage().data_ptr() for t in _plan(candidate).scratch}
    sources = _plan(candidate).core_fill.sources
    assert sources and {t.untyped_storage().data_ptr() for t in sources} <= scratch


def test_equal_scalars_keep_the_step_s_operation_count_whatever_the_group_count() -> None:
    """Six groups with equal scalars dispatch what their parameters in two groups (Muon, SGD) dispatch."""
    six = _six_groups(seed=320)
    for group in six:
        group["weight_decay"] = 5e-4
    two = [
        _muon_group(_clone_groups(six)[0]["params"] + _clone_groups(six)[1]["params"]),
        _sgd_group([p for group in _clone_groups(six)[2:] for p in group["params"]]),
    ]
    counts = []
    for groups in (six, two):
        optimizer = BatchedMuSGD(groups, muon=0.2, sgd=1.0)
        _grads_by_seed(groups, 0)
        optimizer.step()
        counts.append(count_dispatched_ops(optimizer.step).total)
    assert counts[0] == counts[1]


def test_scalars_merge_only_where_they_are_interchangeable_kernel_arguments() -> None:
    nan = float("nan")
    lr = torch.tensor(0.01)
    values = [0.01, -0.0, 0.0, 0.01, nan, nan, 1, 1.0, True, 1, lr, lr, 0.0]
    # -0.0 and 0.0 differ in bits; NaN and tensors never merge; int, float and bool are kept apart.
    assert _classes(values) == (0, 1, 2, 0, 4, 5, 6, 7, 8, 6, 10, 11, 2)


def test_the_step_keeps_no_gradient_alive() -> None:
    import gc
    import weakref

    groups = _six_groups(seed=330)
    optimizer = BatchedMuSGD(groups, muon=0.2, sgd=1.0)
    _grads_by_seed(groups, 0)
    optimizer.step()
    watched = [weakref.ref(p.grad) for p in params_of(groups)]
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    assert optimizer._step_grads == [] and all(ref() is None for ref in watched)


def test_the_plan_is_rebuilt_when_data_moves_a_group_is_added_or_a_moved_gradient_overlaps(
    builds: list[int],
) -> None:
    params = _make_params([(16, 72), (16, 40), (8,)], seed=340)
    optimizer = BatchedMuSGD([_muon_group(params[:2]), _sgd_group(params[2:])])
    fill_grads(params, seed=341)
    optimizer.step()
    assert len(builds) == 1

    with torch.no_grad():
        params[1].data = params[1].data.clone()  # same shape and dtype, new memory
    optimizer.step()
    assert len(builds) == 2

    extra = _make_params([(16, 24)], seed=342)
    fill_grads(extra, seed=343)
    optimizer.add_param_group(_muon_group(extra))
    optimizer.step()
    assert len(builds) == 3 and _batch_of(optimizer, extra[0]) is not None

    params[0].grad = torch.randn_like(params[0])  # moved, overlapping nothing: the plan holds
    optimizer.step()
    assert len(builds) == 3
    params[2].grad = params[0].grad.view(-1)[: params[2].numel()]  # moved onto another gradient's memory
    optimizer.step()
    assert len(builds) == 4
    assert id(params[0]) not in _in_buckets(optimizer) and id(params[2]) not in _in_buckets(optimizer)


_SPANS = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)), max_size=12)


def _searched_per_gradient(
    static: list[tuple[int, int]], moved: list[tuple[int, int]]
) -> tuple[list[int], list[int], list[tuple[int, int]], bool]:
    """The reference the per-step checks replace, a binary search each.

    It indexes the static spans (starts, running ends) and the moved spans. It asks whether a moved span
    reaches into an indexed span or another moved one.
    """
    index = _span_index([("cpu", start, start + size, i) for i, (start, size) in enumerate(static)])
    starts, reach = index.get("cpu", ([], []))
    spans = [(start, start + size) for start, size in moved]
    expected = any(
        (below := bisect.bisect_left(starts, end)) and reach[below - 1] > start for start, end in spans
    ) or bool(_overlapping([("cpu", start, end, i) for i, (start, end) in enumerate(spans)]))
    return starts, reach, spans, expected


@settings(max_examples=600, deadline=None, derandomize=True)
@given(static=_SPANS, moved=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 12)), max_size=12))
def test_the_gradient_check_answers_as_a_search_per_gradient(
    static: list[tuple[int, int]], moved: list[tuple[int, int]]
) -> None:
    """`_spans_meet` over `_union_ends`, the per-step check when gradients moved, answers as the reference it
    replaces.

    Moved spans are nonempty; the static spans may be empty, touch or overlap.
    """
    starts, reach, spans, expected = _searched_per_gradient(static, moved)
    union = _union_ends(starts, reach)
    parts = sorted(union.items())  # disjoint, not touching
    assert all(end < start for (_, end), (start, _) in itertools.pairwise(parts))
    assert _spans_meet([s for s, _ in spans], [e for _, e in spans], union) == expected


_VIEW_SHAPES = [(2, 3), (3, 2), (2, 3, 1, 1)]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    entries=st.lists(
        st.tuples(st.sampled_from(range(len(_VIEW_SHAPES))), st.booleans(), st.integers(-8, 4)),
        max_size=10,
    )
)
def test_a_copy_over_merged_runs_writes_what_a_copy_per_entry_writes(
    entries: list[tuple[int, bool, int]],
) -> None:
    """`_runs` writes what one copy per entry, in order, writes.

    The views are of a few shapes, row-major or transposed, as a padded stack's wide and tall slots are. Their
    offsets step by their size plus a gap. A negative gap overlaps the neighbour, which must never join a run.
    The sources sit densely in another buffer.
    """
    destination, source = torch.arange(400.0), torch.arange(1000.0, 1400.0)
    dst_views, src_views = [], []
    offset, src_offset = 8 * 10, 0
    for shape_index, transposed, gap in entries:
        shape = _VIEW_SHAPES[shape_index]
        rows, cols = shape[0], math.prod(shape[1:])
        strides = (1, rows) if transposed else (cols, 1)
        dst_views.append(destination.as_strided(shape, (*strides, *[1] * (len(shape) - 2)), offset))
        src_views.append(source.as_strided(shape, torch.empty(shape).stride(), src_offset))
        offset, src_offset = offset + rows * cols + gap, src_offset + rows * cols
    (merged_dst, merged_src), _ = _runs([dst_views, src_views])
    expected = destination.clone()
    for dst, src in zip(dst_views, src_views, strict=True):
        expected.as_strided(dst.shape, dst.stride(), dst.storage_offset()).copy_(src)
    for dst, src in zip(merged_dst, merged_src, strict=True):
        dst.copy_(src)
    assert torch.equal(destination, expected)
    assert len(merged_dst) <= len(dst_views)
    if entries and all(entry == entries[0] for entry in entries) and entries[0][2] >= 0:
        assert len(merged_dst) == 1  # a regular layout is one run


def test_the_moved_gradient_check_dispatches_no_tensor_operation() -> None:
    """A step whose gradients moved dispatches no tensor operation for the check: it is arithmetic on Python
    integers.

    In a fit on the H200 (`logs/2026-12-03-1056/fit-profile`) gradients moved in 127 of 128 steps. Their check
    took 1.37 ms of the step's 3.41 ms of host time.
    """
    groups, kwargs = build_param_groups("n", seed=0)
    fill_synthetic_grads(groups, seed=1)
    optimizer = BatchedMuSGD(groups, **kwargs)
    optimizer.step()
    plan = _plan(optimizer)
    fill_grads([p for p in params_of(groups) if p.requires_grad], seed=2)  # fresh gradients
    count = count_dispatched_ops(optimizer._current_plan)
    assert count.total == 0, count.by_operation
    assert optimizer._current_plan() is plan


def test_a_step_whose_gradients_moved_reads_each_address_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check reads the addresses the step's signature already read, and no data_ptr again.

    Inside a fit on the H200 the check took 1.10 ms of a 3.32 ms step's host time
    (`logs/2026-12-03-1154/fit-profile`).
    """
    groups, kwargs = build_param_groups("n", seed=0)
    fill_synthetic_grads(groups, seed=1)
    optimizer = BatchedMuSGD(groups, **kwargs)
    optimizer.step()
    plan = _plan(optimizer)
    params = params_of(groups)
    fill_grads([p for p in params if p.requires_grad], seed=2)  # fresh gradients
    reads: list[int] = []
    data_ptr = torch.Tensor.data_ptr
    monkeypatch.setattr(planning_module, "_DATA_PTR", lambda t: reads.append(1) or data_ptr(t))
    assert optimizer._current_plan() is plan
    with_grad = sum(p.grad is not None for p in params)
    assert len(reads) == len(params) + with_grad  # the signature's pass over parameters, one over gradients


def test_moved_strided_gradients_sharing_memory_rebuild_the_plan() -> None:
    """Strided gradients take the per-gradient check.

    Two that share memory with each other, and nothing else, rebuild the plan; both parameters take the
    baseline's whole step.
    """
    params = _make_params([(16, 72), (16, 40), (8,)], seed=350)
    optimizer = BatchedMuSGD([_muon_group(params[:2]), _sgd_group(params[2:])])
    fill_grads(params, seed=351)
    optimizer.step()
    assert {id(params[0]), id(params[1])} <= set(_in_buckets(optimizer))
    shared = torch.randn(72, 16, generator=torch.Generator().manual_seed(352)) * 0.01
    params[0].grad, params[1].grad = shared.t(), shared[:40].t()  # transposed views of one buffer
    params[2].grad = params[2].grad.clone()  # moved too
    optimizer.step()
    assert {id(params[0]), id(params[1])} <= set(_in_order(optimizer))
    assert {id(params[0]), id(params[1])}.isdisjoint(_in_buckets(optimizer))


def test_moved_gradients_are_checked_at_once_and_one_onto_a_buffer_or_a_strided_view_rebuilds(
    monkeypatch: pytest.MonkeyPatch, builds: list[int]
) -> None:
    """Fresh contiguous gradients, a trainer's every step, take the vectorized check and keep the plan.

    A moved gradient onto a momentum buffer, or a strided one onto a parameter, still rebuilds it.
    """
    params = _make_params([(16, 72), (16, 40), (8,)], seed=345)
    optimizer = BatchedMuSGD([_muon_group(params[:2]), _sgd_group(params[2:])])
    one_by_one = []
    each = planning_module._grads_overlap_each
    monkeypatch.setattr(planning_module, "_grads_overlap_each", lambda *a: one_by_one.append(1) or each(*a))
    fill_grads(params, seed=346)
    optimizer.step()
    for seed in (347, 348):
        for p in params:
            p.grad = None
        fill_grads(params, seed=seed)  # fresh allocations, as after zero_grad(set_to_none=True)
        optimizer.step()
    assert len(builds) == 1 and one_by_one == []

    params[1].grad = optimizer.state[params[1]]["momentum_buffer"].clone().copy_(params[1].grad)
    optimizer.step()
    assert len(builds) == 1  # a copy of a buffer shares nothing
    params[1].grad = (
        optimizer.state[params[0]]["momentum_buffer_SGD"].view(-1)[: params[1].numel()].view(16, 40)
    )
    optimizer.step()
    assert len(builds) == 2 and one_by_one == []
    assert id(params[0]) not in _in_buckets(optimizer) and id(params[1]) not in _in_buckets(optimizer)

    fill_grads(params, seed=349)
    optimizer.step()
    assert len(builds) == 3
    column = params[0].detach()[:8, 0]  # a strided (non-contiguous) view of parameter 0's memory
    params[2].grad = column.clone()  # a copy: shares nothing
    optimizer.step()
    assert len(builds) == 3
    params[2].grad = column  # strided onto parameter 0's memory
    optimizer.step()
    assert len(builds) == 4 and one_by_one == [1]


def test_gradients_a_closure_replaces_are_the_ones_the_step_reads() -> None:
    """The step reads the gradients after the closure has run (fresh tensors), as the baseline does."""
    groups = _six_groups(seed=350)
    base_groups, cand_groups = _clone_groups(groups), _clone_groups(groups)
    baseline, candidate = MuSGD(base_groups, muon=0.2, sgd=1.0), BatchedMuSGD(cand_groups, muon=0.2, sgd=1.0)
    for step in range(2):
        for optimizer, optimizer_groups in ((baseline, base_groups), (candidate, cand_groups)):
            _grads_by_seed(optimizer_groups, 0)  # stale gradients, replaced by the closure

            def closure(optimizer_groups: list[dict[str, Any]] = optimizer_groups, step: int = step) -> float:
                for p in params_of(optimizer_groups):
                    p.grad = None
                _grads_by_seed(optimizer_groups, 10 + step)
                return 0.0

            optimizer.step(closure)
    for group_b, group_c in zip(base_groups[2:], cand_groups[2:], strict=True):  # the SGD groups: exact
        for pb, pc in zip(group_b["params"], group_c["params"], strict=True):
            assert torch.equal(pb, pc)
            assert torch.equal(baseline.state[pb]["momentum_buffer"], candidate.state[pc]["momentum_buffer"])


def test_scalars_are_reread_when_a_schedule_assigns_them_or_a_tensor_changes_in_place() -> None:
    """The step reuses last step's scalars only while they are the same plain-number objects."""
    groups = _six_groups(seed=360)
    lr = torch.tensor(0.02, dtype=torch.float64)
    groups[3]["lr"] = lr  # a 0-dim tensor lr, changed in place below (same object, new value)
    base_groups, cand_groups = _clone_groups(groups), _clone_groups(groups)
    baseline, candidate = MuSGD(base_groups, muon=0.2, sgd=1.0), BatchedMuSGD(cand_groups, muon=0.2, sgd=1.0)
    for step, (value, first_lr) in enumerate([(0.02, 0.02), (0.005, 0.02), (0.005, 0.03)]):
        lr.fill_(value)
        for optimizer, optimizer_groups in ((baseline, base_groups), (candidate, cand_groups)):
            optimizer.param_groups[2]["lr"] = first_lr  # a plain float, assigned anew
            _grads_by_seed(optimizer_groups, step)
            optimizer.step()
        for group_b, group_c in zip(base_groups[2:], cand_groups[2:], strict=True):
            for pb, pc in zip(group_b["params"], group_c["params"], strict=True):
                assert torch.equal(pb, pc), step


# --- SGD buffers laid out like scratch ----------------------------------------------------------------------


def _sgd_buffer(optimizer: MuSGD, group: dict[str, Any], p: torch.Tensor) -> torch.Tensor:
    return optimizer.state[p]["momentum_buffer_SGD" if group["use_muon"] else "momentum_buffer"]


def test_sgd_buffers_live_in_one_tensor_laid_out_like_scratch_and_each_run_steps_flat() -> None:
    """YOLO26n's clean SGD buffers are views of one tensor per dtype, at their scratch views' offsets and
    strides.

    So each SGD run of its layout, decayed or not, tiles one stretch and steps it with one operation each.
    Parameters and every buffer stay bit-equal to the baseline's over steps with moved gradients.
    """
    groups, kwargs = build_param_groups("n", seed=0)
    fill_synthetic_grads(groups, seed=1)

    def moved(step_groups: list[dict[str, Any]], step: int) -> None:  # a trainer's fresh gradients
        fill_grads(params_of(step_groups), seed=200 + step)

    exact = BatchedMuSGD.with_pad_guard(0)  # exact shapes: bit-equality on the CPU is the contract there
    baseline, base_groups, candidate, cand_groups = _run_both(groups, 3, moved, kwargs, exact)
    plan = _plan(candidate)
    runs = [run for layout in plan.layouts.values() for run in layout.sgd]
    assert len(runs) == 2 and all(run.flat is not None for run in runs)
    assert not any(run.flat_nesterov for run in runs)  # on the CPU the Nesterov update keeps its lists
    flat_buffers = {key: buffers for key, (buffers, _) in plan.sgd_flats.items()}
    for group in cand_groups:
        for p in group["params"]:
            buffer, scratch = _sgd_buffer(candidate, group, p), plan.scratch_of[id(p)]
            assert buffer._base is flat_buffers[(p.device, p.dtype)]
            assert (buffer.storage_offset(), buffer.stride()) == (scratch.storage_offset(), scratch.stride())
    assert sum(run.flat[0].numel() for run in runs) == sum(p.numel() for p in params_of(cand_groups))
    for base_group, cand_group in zip(base_groups, cand_groups, strict=True):
        for q, p in zip(base_group["params"], cand_group["params"], strict=True):
            assert torch.equal(q, p)
            for key, value in baseline.state[q].items():
                assert torch.equal(value, candidate.state[p][key]), key
    # the state moves to the baseline and back as one tensor per parameter
    restored = exact(_clone_groups(cand_groups), **kwargs)
    restored.load_state_dict(baseline.state_dict())
    assert all(buffer._base is None for buffer in baseline.state_dict()["state"][0].values())


def test_an_sgd_run_that_does_not_tile_one_stretch_keeps_its_foreach_lists() -> None:
    """Groups whose scalars alternate: decay 0; decay 5e-4 and momentum 0.8; decay 0.

    The two undecayed groups merge into one SGD run whose scratch the middle group splits. That run keeps the
    foreach lists, and the middle one steps flat. All match the baseline bit for bit, beside a Muon group of
    exact shapes.
    """
    groups = [
        _sgd_group(_make_params([(8,), (16,)], seed=1), weight_decay=0.0),
        _sgd_group(_make_params([(5,), (7,), (9,)], seed=2), momentum=0.8),
        _sgd_group(_make_params([(4,), (32,)], seed=3), weight_decay=0.0),
        _muon_group(_make_params([(8, 3, 3, 3), (16, 8)], seed=4)),
    ]
    exact = BatchedMuSGD.with_pad_guard(0)
    baseline, base_groups, candidate, cand_groups = _run_both(groups, 3, _grads_by_seed, None, exact)
    runs = [run for layout in _plan(candidate).layouts.values() for run in layout.sgd]
    flat = {len(run.params): run.flat is not None for run in runs}
    assert flat == {4: False, 3: True, 2: True}  # undecayed (split), the middle group, Muon's SGD part
    for q, p in zip(params_of(base_groups), params_of(cand_groups), strict=True):
        assert torch.equal(q, p)
        for key, value in baseline.state[q].items():
            assert torch.equal(value, candidate.state[p][key]), key


def test_moving_buffers_into_their_flat_tensor_does_not_make_moved_gradients_rebuild_the_plan() -> None:
    """The moved-gradient check indexes the buffers as they are after their move into the flat tensor.

    Fresh gradients allocated where the old buffers were then do not look like overlaps. Overlaps would
    rebuild the plan every step.
    """
    params = _make_params([(16,)] * 12 + [(64,)] * 6, seed=4)
    optimizer = BatchedMuSGD([_sgd_group(params)])
    fill_grads(params, seed=5)
    optimizer.step()
    plan = _plan(optimizer)
    indexed = sorted(zip(*plan.span_index["cpu"], strict=True))
    held = [p for p in params] + [optimizer.state[p]["momentum_buffer"] for p in params]
    starts = sorted(t.data_ptr() for t in held)
    assert [start for start, _ in indexed] == starts
    for seed in range(6, 10):
        fill_grads(params, seed=seed)  # new gradient tensors every step, as zero_grad(set_to_none) leaves
        optimizer.step()
        assert _plan(optimizer) is plan


@cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_flat_sgd_step_with_its_nesterov_update_is_the_baselines_bit_for_bit(
    dtype: torch.dtype,
) -> None:
    """On CUDA every SGD operation of a run that tiles one stretch is one elementwise kernel, the Nesterov
    update included.

    Sizes leave every kind of remainder: odd, prime, a vector's multiple. fp32 and bf16, undecayed and decayed
    groups, run beside a Muon group. Parameters and buffers stay the baseline's bit for bit over steps.
    """
    sizes = [(1,), (3,), (7,), (16,), (31,), (64,), (127,), (4, 257)]
    groups = [
        _sgd_group(_make_params(sizes, seed=1, dtype=dtype, device="cuda"), weight_decay=0.0),
        _sgd_group(_make_params(sizes[::-1], seed=2, dtype=dtype, device="cuda"), lr=0.03),
        _muon_group(_make_params([(8, 3, 3, 3), (16, 8), (16, 8)], seed=3, dtype=dtype, device="cuda")),
    ]
    exact = BatchedMuSGD.with_pad_guard(0)
    baseline, base_groups, candidate, cand_groups = _run_both(groups, 4, _grads_by_seed, None, exact)
    runs = [run for layout in _plan(candidate).layouts.values() for run in layout.sgd]
    assert runs and all(run.flat is not None and run.flat_nesterov for run in runs)
    for q, p in zip(params_of(base_groups), params_of(cand_groups), strict=True):
        assert torch.equal(q, p)
        for key, value in baseline.state[q].items():
            assert torch.equal(value, candidate.state[p][key]), key
