"""Concurrent Newton-Schulz lanes: the deal on the CPU, and on CUDA the same bits as the lockstep form.

On CUDA they are checked eagerly, inside a captured graph, and through the optimizer's replayed step.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from experiments.workloads import build_param_groups, fill_synthetic_grads
from optimizers import BatchedMuSGD
from optimizers.concurrent import deal, newton_schulz_lanes, stack_flops
from optimizers.newton_schulz import Stack, newton_schulz_stacks

cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SHAPES = [(3, 16, 40), (40, 16), (2, 48, 24), (8, 8), (1, 64, 32), (5, 20, 20), (24, 96)]


def _stacks(device: str, seed: int) -> list[Stack]:
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(shape, generator=generator).to(device, torch.bfloat16) for shape in SHAPES]
    return [Stack.of(t) for t in tensors]


# ---------------------------------------------------------------------------------------------- the deal


def test_deal_places_every_index_once_in_at_most_lanes_nonempty_lanes() -> None:
    rng = np.random.default_rng(0)
    for count, lanes in itertools.product([1, 2, 5, 17, 40], [1, 2, 3, 8, 64]):
        costs = rng.lognormal(0, 2, count).tolist()
        dealt = deal(costs, lanes)
        assert sorted(i for lane in dealt for i in lane) == list(range(count))
        assert len(dealt) == min(lanes, count)
        assert all(lane == sorted(lane) for lane in dealt)
        assert [lane[0] for lane in dealt] == sorted(lane[0] for lane in dealt)
        # Longest-first greedy: the longest lane is within one largest item of a perfect split.
        longest = max(sum(costs[i] for i in lane) for lane in dealt)
        assert longest <= sum(costs) / len(dealt) + max(costs) + 1e-9
        assert deal(costs, lanes) == dealt


def test_deal_puts_the_costliest_stacks_on_separate_lanes() -> None:
    assert deal([1.0, 100.0, 1.0, 90.0, 1.0], 2) == [[0, 2, 3, 4], [1]]
    assert deal([5.0, 5.0, 5.0], 1) == [[0, 1, 2]]


def test_deal_refuses_no_lane() -> None:
    with pytest.raises(ValueError, match="lanes must be at least 1"):
        deal([1.0], 0)


def test_stack_flops_counts_every_matrix_of_a_batch_wide() -> None:
    wide = Stack.of(torch.zeros(3, 16, 40))
    tall = Stack.of(torch.zeros(40, 16))
    assert stack_flops(wide) == 3 * 5 * (4 * 16 * 16 * 40 + 2 * 16**3)
    assert stack_flops(tall) == 5 * (4 * 16 * 16 * 40 + 2 * 16**3)


def test_lanes_on_the_cpu_are_the_lockstep_form_bit_for_bit() -> None:
    lockstep, lanes = _stacks("cpu", 1), _stacks("cpu", 1)
    newton_schulz_stacks(lockstep)
    newton_schulz_lanes(lanes, 8)
    for a, b in zip(lockstep, lanes, strict=True):
        assert torch.equal(a.tensor, b.tensor)


# ---------------------------------------------------------------------------------------------- CUDA


@cuda
@needs_cuda
def test_cuda_lanes_equal_lockstep_eagerly_and_from_a_captured_graph() -> None:
    for lanes in (2, 3, 8):
        lockstep, eager, captured = _stacks("cuda", lanes), _stacks("cuda", lanes), _stacks("cuda", lanes)
        inputs = [s.tensor.clone() for s in captured]
        newton_schulz_stacks(lockstep)
        newton_schulz_lanes(eager, lanes)  # also warms every lane's stream before the capture
        for stack, source in zip(captured, inputs, strict=True):
            stack.tensor.copy_(source)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            newton_schulz_lanes(captured, lanes)
        torch.cuda.current_stream().wait_stream(side)
        for stack, source in zip(captured, inputs, strict=True):
            stack.tensor.copy_(source)
        graph.replay()
        torch.cuda.synchronize()
        for a, b, c in zip(lockstep, eager, captured, strict=True):
            assert torch.equal(a.tensor, b.tensor)
            assert torch.equal(a.tensor, c.tensor)


@cuda
@needs_cuda
def test_cuda_optimizer_with_lanes_equals_lockstep_over_replayed_steps() -> None:
    """YOLO26n, 6 steps (warm-up, capture, replays): 16 lanes and 1 lane give the same parameter and state bits."""
    groups, kwargs = build_param_groups("n", device="cuda", seed=0)
    one_groups, many_groups = copy.deepcopy(groups), copy.deepcopy(groups)
    one = type("OneLane", (BatchedMuSGD,), {"ns_lanes": 1})(one_groups, **kwargs)
    many = type("SixteenLanes", (BatchedMuSGD,), {"ns_lanes": 16})(many_groups, **kwargs)
    for step in range(6):
        for optimizer, optimizer_groups in ((one, one_groups), (many, many_groups)):
            fill_synthetic_grads(optimizer_groups, seed=step)
            optimizer.step()
        for g1, g2 in zip(one_groups, many_groups, strict=True):
            for p1, p2 in zip(g1["params"], g2["params"], strict=True):
                assert torch.equal(p1, p2), step
                for key, value in one.state[p1].items():
                    assert torch.equal(value, many.state[p2][key]), (step, key)
    assert many.graph_stats == {"eager: warm-up": 1, "captured": 1, "replayed": 4}
