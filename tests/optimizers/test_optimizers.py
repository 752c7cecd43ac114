"""The baseline MuSGD and Newton-Schulz: the semantics every other implementation is checked against."""

from __future__ import annotations

import copy

import pytest
import torch

from optimizers import MuSGD, newton_schulz
from optimizers.musgd import muon_update
from optimizers.newton_schulz import NS_STEPS, Stack, foreach_mul_, newton_schulz_stacks
from tests.optimizers.groups import HYPER, fill_grads, scaled_params


def _params(
    *shapes: tuple[int, ...], seed: int = 0, dtype: torch.dtype = torch.float32
) -> list[torch.nn.Parameter]:
    return scaled_params(shapes, torch.Generator().manual_seed(seed), dtype=dtype)


def test_newton_schulz_approximately_orthogonalizes() -> None:
    """Singular values land in the quintic's band around 1 (roughly 0.5-1.5), wide and tall alike."""
    generator = torch.Generator().manual_seed(0)
    for shape in [(32, 96), (96, 32)]:
        G = torch.randn(shape, generator=generator)
        X = newton_schulz(G)
        assert X.dtype == torch.bfloat16 and X.shape == G.shape
        singular_values = torch.linalg.svdvals(X.float())
        assert singular_values.min() > 0.4 and singular_values.max() < 1.6


def test_newton_schulz_leaves_its_input_alone() -> None:
    """A bf16 input (e.g. a bf16 momentum buffer without Nesterov) is copied, never normalized in place."""
    G = torch.randn(16, 48).bfloat16()
    before = G.clone()
    newton_schulz(G)
    assert torch.equal(G, before)


def test_sgd_groups_match_torch_sgd() -> None:
    """Without Muon, MuSGD is SGD with momentum, Nesterov and weight decay: bit-equal to torch.optim.SGD."""
    ours, theirs = _params((8, 4), (16,), seed=1), _params((8, 4), (16,), seed=1)
    settings = {"lr": 0.01, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}
    musgd = MuSGD([{"params": ours, **settings, "use_muon": False}])
    sgd = torch.optim.SGD(theirs, **settings, foreach=False)
    for step in range(3):
        fill_grads(ours, step)
        fill_grads(theirs, step)
        musgd.step()
        sgd.step()
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(musgd.state[a]["momentum_buffer"], sgd.state[b]["momentum_buffer"])


def test_muon_group_is_muon_then_sgd() -> None:
    """A use_muon step is p -= lr*muon*NS(momentum), then SGD momentum with decay on the updated p, gain sgd."""
    (p,) = _params((16, 3, 3, 3), seed=2)
    fill_grads([p], seed=3)
    lr, beta, wd, muon, sgd = 0.01, 0.9, 1e-3, 0.2, 1.0
    expected = p.detach().clone()
    buffer = torch.zeros_like(p)
    expected.add_(muon_update(p.grad, buffer, beta, True).reshape(p.shape), alpha=-(lr * muon))
    grad = p.grad.add(expected, alpha=wd)
    expected.add_(grad.add(grad, alpha=beta), alpha=-(lr * sgd))  # first step: SGD buffer == grad

    optimizer = MuSGD(
        [
            {
                "params": [p],
                "lr": lr,
                "momentum": beta,
                "nesterov": True,
                "weight_decay": wd,
                "use_muon": True,
                "param_group": "muon",
            }
        ],
        muon=muon,
        sgd=sgd,
    )
    optimizer.step()
    assert torch.equal(p.detach(), expected)
    assert set(optimizer.state[p]) == {"momentum_buffer", "momentum_buffer_SGD"}
    assert optimizer.param_groups[0]["param_group"] == "muon"


def test_channels_last_gradients_equal_the_contiguous_case() -> None:
    """Upstream fails on channels_last; here the step is accepted and bit-equal to the contiguous one."""
    contiguous = _params((32, 16, 3, 3), (8, 32, 1, 1), seed=4)
    channels_last = [
        torch.nn.Parameter(p.detach().clone().to(memory_format=torch.channels_last)) for p in contiguous
    ]
    optimizers = []
    for params in (contiguous, channels_last):
        optimizers.append(MuSGD([{"params": params, **HYPER, "use_muon": True}]))
    for step in range(2):
        for params, optimizer in zip((contiguous, channels_last), optimizers, strict=True):
            fill_grads(params, seed=10 + step)
            if params is channels_last:
                for p in params:
                    p.grad = p.grad.contiguous(memory_format=torch.channels_last)
            optimizer.step()
    for a, b in zip(contiguous, channels_last, strict=True):
        assert b.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(a, b)


def test_grads_none_are_skipped_and_state_is_lazy() -> None:
    params = _params((8, 8), (8, 8), seed=5)
    optimizer = MuSGD([{"params": params, "lr": 0.1, "momentum": 0.9, "use_muon": True}])
    fill_grads(params[:1], seed=6)
    before = params[1].detach().clone()
    optimizer.step()
    assert torch.equal(params[1], before)
    assert params[1] not in optimizer.state


def test_all_zero_gradients_give_no_nan() -> None:
    params = _params((16, 8, 3, 3), (32, 8), (8,), seed=7)
    optimizer = MuSGD(
        [
            {"params": params[:2], "lr": 0.1, "momentum": 0.9, "nesterov": True, "use_muon": True},
            {"params": params[2:], "lr": 0.1, "momentum": 0.9},
        ]
    )
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in params)


def test_muon_rejects_non_matrix_parameters() -> None:
    (p,) = _params((16,), seed=8)
    fill_grads([p], seed=9)
    with pytest.raises(ValueError, match="2-D or 4-D"):
        MuSGD([{"params": [p], "use_muon": True}]).step()


def test_state_dict_round_trip_continues_identically() -> None:
    params = _params((16, 8, 3, 3), (8,), seed=11)
    groups = [
        {"params": params[:1], "lr": 0.02, "momentum": 0.9, "nesterov": True, "use_muon": True},
        {"params": params[1:], "lr": 0.02, "momentum": 0.9},
    ]
    optimizer = MuSGD(groups)
    fill_grads(params, seed=12)
    optimizer.step()
    saved_params, saved_state = [p.detach().clone() for p in params], copy.deepcopy(optimizer.state_dict())
    fill_grads(params, seed=13)
    optimizer.step()
    after_uninterrupted = [p.detach().clone() for p in params]

    with torch.no_grad():
        for p, saved in zip(params, saved_params, strict=True):
            p.copy_(saved)
    resumed = MuSGD(groups)
    resumed.load_state_dict(saved_state)
    fill_grads(params, seed=13)
    resumed.step()
    for p, expected in zip(params, after_uninterrupted, strict=True):
        assert torch.equal(p, expected)


NS_SHAPES = [
    (16, 40),
    (72, 16),
    (32, 32),
    (9, 256),
    (300, 64),
    (5, 16, 40),
    (6, 72, 16),
    (3, 32, 32),
    (6, 4, 16),
]


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
        ),
    ],
)
def test_lockstep_newton_schulz_is_bit_equal_to_the_reference(device: str) -> None:
    """Matrices and batches, wide, tall and square, advanced together with mm/bmm and foreach steps.

    Each stack ends bit-equal to `newton_schulz` of its own; the reference uses `@` and out-of-place steps.
    """
    generator = torch.Generator().manual_seed(21)
    inputs = [torch.randn(shape, generator=generator).to(device) for shape in NS_SHAPES]
    stacks = [Stack.of(G.to(torch.bfloat16)) for G in inputs]
    newton_schulz_stacks(stacks)
    for G, stack in zip(inputs, stacks, strict=True):
        assert torch.equal(stack.tensor, newton_schulz(G)), tuple(G.shape)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_x_plus_b_x_is_one_kernel_for_every_wide_stack() -> None:
    """Wide stacks share one foreach kernel for X += B X; each tall one, a transposed view, takes its own.

    A foreach add over tensors of different strides takes CUDA's per-tensor path. The H200 profile of the
    YOLO26n step counted 74 single add_ kernels per step. That profile is
    reports/h200-decisive/logs/2026-12-03-1340/profile-n.log.
    """
    generator = torch.Generator().manual_seed(22)
    stacks = [Stack.of(torch.randn(shape, generator=generator).bfloat16().cuda()) for shape in NS_SHAPES]
    tall = sum(not stack.x.is_contiguous() for stack in stacks)
    assert 0 < tall < len(stacks)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        newton_schulz_stacks(stacks)
    assert sum(event.name == "aten::add_" for event in profile.events()) == NS_STEPS * tall


def test_stacks_must_be_contiguous_matrices_or_batches() -> None:
    with pytest.raises(ValueError, match="contiguous 2-D or 3-D"):
        Stack.of(torch.zeros(4, 6).bfloat16().mT)
    with pytest.raises(ValueError, match="contiguous 2-D or 3-D"):
        Stack.of(torch.zeros(2, 3, 4, 6).bfloat16())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_foreach_mul_rounds_as_the_per_tensor_multiply(dtype: torch.dtype) -> None:
    """In place, with the scalar kept in float: what `t.mul_(s)` gives, tensor by tensor, for one scalar or
    one per tensor.

    The CPU's in-place foreach multiply alone would round 0.937 to the tensor's dtype first.
    """
    generator = torch.Generator().manual_seed(22)
    tensors = [torch.randn(64, 64, generator=generator).to(dtype) for _ in range(3)]
    for scalars in (0.937, [0.937, 2.0315, 1.4142135623730951]):
        ours = [t.clone() for t in tensors]
        foreach_mul_(ours, scalars)
        per_tensor = scalars if isinstance(scalars, list) else [scalars] * len(tensors)
        for t, result, s in zip(tensors, ours, per_tensor, strict=True):
            assert torch.equal(result, t.clone().mul_(s))
