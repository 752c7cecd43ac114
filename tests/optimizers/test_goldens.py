"""Our MuSGD against golden outputs of upstream Ultralytics 8.4.101's per-parameter MuSGD, bit for bit.

The goldens (tests/data/musgd_goldens_8.4.101.pt) were made by scripts/make_goldens.py from the published
wheel. They are the only test data not computed by this repository's own Newton-Schulz. So they see a wrong
coefficient, iteration, order or dtype that every implementation here would share.

They were made on the CPU, where Newton-Schulz runs bf16 matrix products. Their rounding belongs to the CPU
kernels of one torch build on one instruction set. Another torch version or CPU capability may round them
differently without anything here being wrong. Where the comparison fails *and* the recorded torch version or
CPU capability differs, the test is skipped naming both. Regenerate the goldens there. Where both are the
same, a difference fails.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from optimizers import BatchedMuSGD, MuSGD
from optimizers.batched import batched_on_cpu
from tests import ROOT

GOLDENS = ROOT / "tests" / "data" / "musgd_goldens_8.4.101.pt"


@pytest.fixture(scope="module")
def goldens() -> dict[str, Any]:
    return torch.load(GOLDENS, weights_only=True)


def _run(optimizer_class: type[torch.optim.Optimizer], case: dict[str, Any]) -> tuple[list, list]:
    groups = [{**g, "params": [torch.nn.Parameter(p.clone()) for p in g["params"]]} for g in case["groups"]]
    params = [p for g in groups for p in g["params"]]
    optimizer = optimizer_class(groups, **case["optimizer_kwargs"])
    for step_grads in case["grads"]:
        for p, grad in zip(params, step_grads, strict=True):
            p.grad = grad.clone()
        optimizer.step()
    return params, [optimizer.state[p] for p in params]


def _differences(case: dict[str, Any], params: list, states: list) -> list[str]:
    expected = case["expected"]
    found = []
    for index, (p, state, want, want_state) in enumerate(
        zip(params, states, expected["params"], expected["state"], strict=True)
    ):
        if not torch.equal(p.detach(), want):
            found.append(f"param {index} {tuple(p.shape)}")
        if set(state) != set(want_state):
            found.append(f"param {index}: state keys {sorted(state)} != {sorted(want_state)}")
            continue
        found += [
            f"param {index} {key}" for key in want_state if not torch.equal(state[key], want_state[key])
        ]
    return found


def _judge(goldens: dict[str, Any], differences: list[str]) -> None:
    made = goldens["made_with"]
    here = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if differences and any(made[key] != value for key, value in here.items()):
        pytest.skip(
            f"goldens made with torch {made['torch']} ({made['cpu_capability']}); this is torch {here['torch']} "
            f"({here['cpu_capability']}), whose CPU bf16 matmul may round differently: regenerate them with "
            f"scripts/make_goldens.py ({len(differences)} tensors differ)"
        )
    assert not differences, differences


def test_the_goldens_say_what_made_them(goldens: dict[str, Any]) -> None:
    made = goldens["made_with"]
    assert made["ultralytics"] == "8.4.101" and len(made["wheel_sha256"]) == 64
    assert {"torch", "cpu_capability", "python"} <= set(made)
    assert set(goldens["cases"]) == {"float32", "bfloat16"} and goldens["steps"] == 3
    assert GOLDENS.stat().st_size < 500_000


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_baseline_equals_upstream_8_4_101_bit_for_bit(goldens: dict[str, Any], dtype: str) -> None:
    case = goldens["cases"][dtype]
    _judge(goldens, _differences(case, *_run(MuSGD, case)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_candidate_with_exact_shapes_equals_upstream_8_4_101(goldens: dict[str, Any], dtype: str) -> None:
    """Every golden matrix has its own shape, so without padding each is a lone matrix.

    The candidate orthogonalizes it exactly as the baseline does, through its batched path forced onto the
    CPU.
    """
    case = goldens["cases"][dtype]
    with batched_on_cpu():
        _judge(goldens, _differences(case, *_run(BatchedMuSGD.with_pad_guard(0), case)))


# ---------------------------------------------------------------------------------------------- what they see

NS_MODULE = importlib.import_module(
    "optimizers.newton_schulz"
)  # the package re-exports a function of that name
BF16_MANTISSAS = torch.arange(128, dtype=torch.float32) / 128 + 1  # every bf16 significand in [1, 2)


def _bf16_products_differ(k: float, other: float) -> int:
    """How many bf16 significands round differently when multiplied by `k` and by `other`.

    The product is taken as torch does: the Python scalar in float32, the product rounded to bf16. This is
    scale-free, so it covers every normal bf16 value. Each coefficient only ever multiplies bf16 tensors in
    Newton-Schulz.
    """
    k32, other32 = torch.tensor(k, dtype=torch.float32), torch.tensor(other, dtype=torch.float32)
    return int(((BF16_MANTISSAS * k32).bfloat16() != (BF16_MANTISSAS * other32).bfloat16()).sum())


def _nearest_visible_change(k: float, direction: int, step: float = 1e-5) -> float:
    """The closest coefficient on one side of `k` (in `step`s) whose bf16 products differ for some input."""
    for n in range(1, 10_000):
        candidate = k + direction * n * step
        if _bf16_products_differ(k, candidate):
            return candidate
    raise AssertionError(f"no visible change of {k} within {10_000 * step}")


def test_the_issues_b_mutation_is_invisible_to_bf16_arithmetic() -> None:
    """b = -4.7751 instead of -4.7750 gives the same bf16 product for every bf16 input.

    It is an equivalent mutant that no test can catch. The nearest values of b that change any product are
    printed.
    """
    assert _bf16_products_differ(-4.7750, -4.7751) == 0
    below, above = _nearest_visible_change(-4.7750, -1), _nearest_visible_change(-4.7750, +1)
    print(f"\nb = -4.7750: the nearest visible changes are {below:.5f} and {above:.5f}")
    assert below < -4.7751


@pytest.mark.parametrize("index", [0, 1, 2], ids=["a", "b", "c"])
@pytest.mark.parametrize("direction", [-1, 1], ids=["down", "up"])
def test_the_goldens_catch_the_smallest_coefficient_change_bf16_can_see(
    goldens: dict[str, Any], monkeypatch: pytest.MonkeyPatch, index: int, direction: int
) -> None:
    """Each coefficient moved to its nearest value that changes one bf16 product (1 of 128 significands)
    breaks the goldens.

    The baseline no longer equals upstream in the float32 case; its Newton-Schulz is the bfloat16 case's bf16
    arithmetic.
    """
    coefficients = list(NS_MODULE.NS_COEFFICIENTS)
    coefficients[index] = _nearest_visible_change(coefficients[index], direction)
    monkeypatch.setattr(NS_MODULE, "NS_COEFFICIENTS", tuple(coefficients))
    case = goldens["cases"]["float32"]
    assert _differences(case, *_run(MuSGD, case)), coefficients


@pytest.mark.parametrize("steps", [4, 6])
def test_the_goldens_catch_a_wrong_iteration_count(
    goldens: dict[str, Any], monkeypatch: pytest.MonkeyPatch, steps: int
) -> None:
    monkeypatch.setattr(NS_MODULE, "NS_STEPS", steps)
    case = goldens["cases"]["float32"]
    assert _differences(case, *_run(MuSGD, case))
