"""The candidate's CUDA-graph replay of its Newton-Schulz core: bit-equal to the eager step, counted
fallbacks.

Replay exists only on CUDA, so most tests here are marked `cuda` and skip without a device. On the CPU, the
replay policy runs against a simulated backend. So does the way a step consumes a graph's outputs. The
simulated capture runs the core once; a replay recomputes into the captured outputs. The rule that a CPU step
never tries to capture is tested in test_batched.py.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from experiments.screen import trial as screen_trial
from experiments.workloads import build_param_groups, fill_synthetic_grads
from optimizers import BatchedMuSGD, MuSGD, graphs
from optimizers import batched as batched_module
from optimizers.graphs import CoreGraph
from tests.optimizers.groups import fill_grads, muon_and_sgd, params_of, scaled_params

cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _clone_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**g, "params": [torch.nn.Parameter(p.detach().clone(), p.requires_grad) for p in g["params"]]}
        for g in groups
    ]


def _assert_identical(
    first: torch.optim.Optimizer,
    first_groups: list[dict[str, Any]],
    second: torch.optim.Optimizer,
    second_groups: list[dict[str, Any]],
    where: Any = None,
) -> None:
    """Every parameter and every state buffer bit-equal."""
    for p, q in zip(params_of(first_groups), params_of(second_groups), strict=True):
        assert torch.equal(p, q), (where, tuple(p.shape))
        assert set(first.state[p]) == set(second.state[q])
        for key, buffer in first.state[p].items():
            assert torch.equal(buffer, second.state[q][key]), (where, key, tuple(p.shape))


def _eager(groups: list[dict[str, Any]], kwargs: dict[str, float] | None = None) -> BatchedMuSGD:
    optimizer = BatchedMuSGD(groups, **(kwargs or {}))
    optimizer.graph_replay = False  # on this instance only
    return optimizer


def _small_groups(seed: int, device: str = "cuda") -> list[dict[str, Any]]:
    """Padded, uniform and single batches (a lone small matrix, and on CUDA one above the guard too), and
    an SGD group."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(16, 8, 3, 3), (32, 16, 1, 1), (64, 16), (16, 40), (24, 24), (24, 24), (20, 36)]
    shapes += [(300, 260)] if device == "cuda" else []
    muon = scaled_params(shapes, generator, device)
    return muon_and_sgd(muon, scaled_params([(16,), (32,)], generator, device))


# ---------------------------------------------------------------------------------------------- simulated


class SimulatedBackend:
    """A device without kernels: a capture runs the core once, so the first replay has nothing left to do.

    A replay recomputes the core and copies the results into the captured outputs, as a real replay refills
    them.
    """

    def __init__(self, fail_with: Exception | None = None, warm_bytes: int = 0) -> None:
        self.fail_with = fail_with
        self.records = 0
        self.warm_bytes = warm_bytes  # what a warm-up leaves allocated (a real stream's cuBLAS workspace)

    def on_device(self, device: torch.device) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def warm(
        self, device: torch.device, compute: Callable[[], list[torch.Tensor]]
    ) -> tuple[list[torch.Tensor], int]:
        kept, self.warm_bytes = self.warm_bytes, 0  # a stream sets its workspace up once per process
        return compute(), kept

    def record(
        self, device: torch.device, compute: Callable[[], list[torch.Tensor]]
    ) -> tuple[Callable[[], None], list[torch.Tensor], int]:
        self.records += 1
        if self.fail_with is not None:
            raise self.fail_with
        outputs = compute()
        first = True

        def replay() -> None:
            nonlocal first
            if first:  # this step's core already ran in the "capture"
                first = False
                return
            for captured, fresh in zip(outputs, compute(), strict=True):
                if captured is not fresh:
                    captured.copy_(fresh)

        return replay, outputs, 1


@pytest.fixture
def simulated_device(monkeypatch: pytest.MonkeyPatch, batched_cpu_one_thread: None) -> None:
    """CPU stacks count as one CUDA device (the batched path forced onto the CPU, on one thread)."""
    monkeypatch.setattr(batched_module, "_device_refusal", lambda devices: None)


def _simulated(groups: list[dict[str, Any]], backend: SimulatedBackend | None = None) -> BatchedMuSGD:
    optimizer = BatchedMuSGD(groups)
    optimizer._core_graph = CoreGraph(backend or SimulatedBackend())
    return optimizer


def _with_eager_twin(
    seed: int, device: str = "cuda", backend: SimulatedBackend | None = None
) -> tuple[BatchedMuSGD, list[dict[str, Any]], BatchedMuSGD, list[dict[str, Any]]]:
    """An optimizer over `_small_groups` (simulated on the CPU) and an eager twin over a clone of them."""
    groups = _small_groups(seed, device)
    twin_groups = _clone_groups(groups)
    optimizer = _simulated(groups, backend) if device == "cpu" else BatchedMuSGD(groups)
    return optimizer, groups, _eager(twin_groups), twin_groups


def test_simulated_replays_feed_the_step_what_eager_cores_would(simulated_device: None) -> None:
    """Eight steps with a schedule that moves every step: replays give the eager optimizer's bits, and each
    core is counted.

    Replays refill their outputs in place, and the updates widened into scratch too.
    """
    optimizer, groups, twin, twin_groups = _with_eager_twin(seed=6, device="cpu")
    for step in range(8):
        for opt, opt_groups in ((optimizer, groups), (twin, twin_groups)):
            for group in opt_groups:
                group["lr"] = 0.02 * (step + 1) / 8
                group["momentum"] = 0.8 + 0.0125 * step
            fill_grads(params_of(opt_groups), 20 + step)
            opt.step()
        _assert_identical(optimizer, groups, twin, twin_groups, where=step)
    kinds = {entry.batch.kind for entry in optimizer._plan.stacks}
    assert kinds == {"padded", "uniform", "single"}
    for entry in optimizer._plan.stacks:  # one widening copy per run of same-shape neighbours
        shapes = [tuple(m.param.shape) for m in entry.batch.members]
        assert len(entry.widen[0]) == 1 + sum(a != b for a, b in itertools.pairwise(shapes))
    assert optimizer.graph_stats == {"eager: warm-up": 1, "captured": 1, "replayed": 6}
    assert twin.graph_stats == {"eager: replay off": 8}


def test_simulated_replays_keep_their_graph_through_a_nesterov_flip(simulated_device: None) -> None:
    """The captured core reads its inputs in scratch: the Nesterov inputs or copies of the momentum buffers.

    Turning Nesterov off changes what the momentum step writes there, not the graph; the bits stay as eager.
    """
    optimizer, groups, twin, twin_groups = _with_eager_twin(seed=9, device="cpu")
    for step in range(8):
        for opt, opt_groups in ((optimizer, groups), (twin, twin_groups)):
            opt.param_groups[0]["nesterov"] = step < 4
            fill_grads(params_of(opt_groups), 40 + step)
            opt.step()
        _assert_identical(optimizer, groups, twin, twin_groups, where=step)
    assert optimizer.graph_stats == {"eager: warm-up": 1, "captured": 1, "replayed": 6}


def test_plan_bytes_count_what_the_capture_stream_and_the_graph_keep(simulated_device: None) -> None:
    """`plan_bytes` counts what a capture keeps, kept across a new plan.

    That is the stacks and scratch, the graph's pool, and what the warm-up left allocated. The warm-up sets up
    the capture stream's cuBLAS workspace, the largest part.
    """
    groups = _small_groups(seed=8, device="cpu")
    optimizer = _simulated(groups, SimulatedBackend(warm_bytes=32 << 20))
    fill_grads(params_of(groups), 30)
    optimizer.step()  # the warm-up
    assert optimizer.plan_bytes == optimizer._plan.nbytes + (32 << 20)
    fill_grads(params_of(groups), 31)
    optimizer.step()  # the capture: the simulated graph keeps 1 byte of pool
    assert optimizer.plan_bytes == optimizer._plan.nbytes + (32 << 20) + 1
    optimizer.load_state_dict(optimizer.state_dict())  # a new plan and graph; the stream's workspace stays
    fill_grads(params_of(groups), 32)
    optimizer.step()
    assert optimizer.plan_bytes == optimizer._plan.nbytes + (32 << 20)


def _in_lockstep(
    optimizer: BatchedMuSGD,
    groups: list[dict[str, Any]],
    twin: BatchedMuSGD,
    twin_groups: list[dict[str, Any]],
) -> Callable[..., None]:
    """``both(seed)`` gives both optimizers the same seeded gradients and steps each.

    ``drop`` takes the Muon group's second gradient away. ``eager_step`` asks the first for an eager step.
    """

    def both(seed: int, eager_step: bool = False, drop: bool = False) -> None:
        for opt, opt_groups in ((optimizer, groups), (twin, twin_groups)):
            fill_grads(params_of(opt_groups), seed)
            if drop:
                opt_groups[0]["params"][1].grad = None
            (opt.eager_step if eager_step and opt is optimizer else opt.step)()

    return both


def test_simulated_policy_counts_every_reason(simulated_device: None) -> None:
    backend = SimulatedBackend()
    optimizer, groups, twin, twin_groups = _with_eager_twin(seed=7, device="cpu", backend=backend)
    both = _in_lockstep(optimizer, groups, twin, twin_groups)
    for seed in range(3):
        both(seed)  # warm-up, captured, replayed
    both(3, eager_step=True)
    both(4)  # replayed
    both(5, drop=True)  # a new plan: warm-up
    both(6)  # and another: warm-up
    both(7)  # captured
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    twin.load_state_dict(copy.deepcopy(twin.state_dict()))
    both(8)  # warm-up after a checkpoint load
    optimizer.graph_replay = False
    both(9)
    assert optimizer.graph_stats == {
        "eager: warm-up": 4,
        "captured": 2,
        "replayed": 2,
        "eager: eager step asked for": 1,
        "eager: replay off": 1,
    }
    assert backend.records == 2
    _assert_identical(optimizer, groups, twin, twin_groups)


def test_simulated_capture_failure_runs_eagerly_and_says_why(simulated_device: None) -> None:
    backend = SimulatedBackend(
        fail_with=RuntimeError("operation not permitted when stream is capturing\nmore")
    )
    optimizer, groups, twin, twin_groups = _with_eager_twin(seed=8, device="cpu", backend=backend)
    both = _in_lockstep(optimizer, groups, twin, twin_groups)
    for step in range(4):
        both(30 + step)
    assert optimizer.graph_stats == {
        "eager: warm-up": 1,
        "eager: capture failed: RuntimeError: operation not permitted when stream is capturing": 1,
        "eager: capture failed earlier for this plan": 2,
    }
    assert backend.records == 1  # not retried for the same plan
    _assert_identical(optimizer, groups, twin, twin_groups)


# ---------------------------------------------------------------------------------------------- CUDA


@cuda
@needs_cuda
def test_cuda_replayed_steps_equal_eager_steps_under_a_schedule_that_moves_every_step() -> None:
    """YOLO26n, 12 steps: the replaying optimizer stays bit-equal to the eager one.

    Learning rates and momentum change every step, as the trainer's warm-up does. Gradients are fresh tensors
    on odd steps.
    """
    groups, kwargs = build_param_groups("n", device="cuda", seed=0)
    eager_groups, replay_groups = _clone_groups(groups), _clone_groups(groups)
    eager, replaying = _eager(eager_groups, kwargs), BatchedMuSGD(replay_groups, **kwargs)
    base_lrs = [g["lr"] for g in groups]
    steps = 12
    for step in range(steps):
        for optimizer, optimizer_groups in ((eager, eager_groups), (replaying, replay_groups)):
            for group, base_lr in zip(optimizer_groups, base_lrs, strict=True):
                group["lr"] = base_lr * (step + 1) / steps
                group["momentum"] = 0.8 + (0.937 - 0.8) * step / (steps - 1)
            if step % 2:
                optimizer.zero_grad(set_to_none=True)
            fill_synthetic_grads(optimizer_groups, seed=step)
            optimizer.step()
        _assert_identical(eager, eager_groups, replaying, replay_groups, where=step)
    assert replaying.graph_stats == {"eager: warm-up": 1, "captured": 1, "replayed": steps - 2}
    assert eager.graph_stats == {"eager: replay off": steps}
    assert replaying.plan_bytes > eager.plan_bytes > 0  # the graph keeps its own outputs and workspace


@cuda
@needs_cuda
def test_cuda_every_eager_core_is_counted_with_its_reason() -> None:
    optimizer, groups, twin, twin_groups = _with_eager_twin(seed=1)
    both = _in_lockstep(optimizer, groups, twin, twin_groups)
    both(0)  # warm-up
    both(1)  # captured
    both(2)  # replayed
    both(3, eager_step=True)
    both(4)  # replayed
    both(5, drop=True)  # the plan changes: a new graph after a new warm-up
    both(6)  # the gradient is back: the plan changes again
    both(7)  # captured
    optimizer.graph_replay = False
    both(8)
    assert optimizer.graph_stats == {
        "eager: warm-up": 3,
        "captured": 2,
        "replayed": 2,
        "eager: eager step asked for": 1,
        "eager: replay off": 1,
    }
    _assert_identical(optimizer, groups, twin, twin_groups)


@cuda
@needs_cuda
def test_cuda_a_capture_of_a_replaying_step_records_the_steps_own_kernels() -> None:
    """The screen's launch floor captures the step of an optimizer that already replays its core.

    The step calls `eager_step`, so the outer graph holds every kernel of the step. Its replays compute what
    eager steps compute.
    """
    optimizer, groups, twin, twin_groups = _with_eager_twin(seed=2)
    fill_grads(params_of(groups), 0)
    fill_grads(params_of(twin_groups), 0)
    for _ in range(3):  # warm-up, capture, replay
        optimizer.step()
        twin.step()
    assert optimizer.graph_stats["replayed"] == 1
    replays = 4
    floor = screen_trial.launch_floor(optimizer, "cuda", replays)
    torch.cuda.synchronize()
    assert floor["floor_note"] == "" and floor["floor_ms"] > 0
    # The floor calls `eager_step` (the step's own kernels, never a replay inside the outer graph): its warm-ups
    # and the captured step all ran eagerly, for that reason.
    assert optimizer.graph_stats["eager: eager step asked for"] == screen_trial.FLOOR_WARMUP_STEPS + 1
    assert optimizer.graph_stats["replayed"] == 1  # no replay inside the floor's warm-ups or capture
    # The floor ran FLOOR_WARMUP_STEPS steps, captured one (which runs nothing) and replayed it 1 + replays
    # times, all on the same gradients.
    for _ in range(screen_trial.FLOOR_WARMUP_STEPS + 1 + replays):
        twin.step()
    _assert_identical(optimizer, groups, twin, twin_groups)


@cuda
@needs_cuda
def test_cuda_eager_step_is_what_an_outer_capture_should_call() -> None:
    """`eager_step` inside a caller's own capture: the graph replays the step's own kernels."""
    optimizer, groups, twin, twin_groups = _with_eager_twin(seed=3)
    fill_grads(params_of(groups), 0)
    fill_grads(params_of(twin_groups), 0)
    for _ in range(3):
        optimizer.step()
        twin.step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm the side stream (its cuBLAS workspace) before capturing on it
        optimizer.eager_step()
    torch.cuda.current_stream().wait_stream(side)
    twin.step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        optimizer.eager_step()
    for _ in range(3):
        graph.replay()
        twin.step()
    torch.cuda.synchronize()
    assert optimizer.graph_stats["eager: eager step asked for"] == 2
    _assert_identical(optimizer, groups, twin, twin_groups)


@cuda
@needs_cuda
def test_cuda_checkpoints_move_both_ways_while_the_core_replays() -> None:
    """baseline -> candidate (replaying) -> baseline through state_dicts equals the baseline never stopping.

    Distinct shapes keep every matrix a lone one (the baseline's own computation, replayed or not), so bit
    equality is the bar.
    """
    generator = torch.Generator().manual_seed(4)
    shapes = [(16, 8, 3, 3), (32, 72), (24, 40), (300, 260)]
    muon = scaled_params(shapes, generator, "cuda")
    groups = muon_and_sgd(muon, scaled_params([(16,), (32,)], generator, "cuda"))

    uninterrupted = _clone_groups(groups)
    reference = MuSGD(uninterrupted)
    for step in range(8):
        fill_grads(params_of(uninterrupted), 10 + step)
        reference.step()

    resumed = _clone_groups(groups)
    legs = [(MuSGD, range(0, 2)), (BatchedMuSGD, range(2, 6)), (MuSGD, range(6, 8))]
    state: dict[str, Any] | None = None
    for arm, steps in legs:
        optimizer = arm(resumed)
        if state is not None:
            optimizer.load_state_dict(state)
        for step in steps:
            fill_grads(params_of(resumed), 10 + step)
            optimizer.step()
        if isinstance(optimizer, BatchedMuSGD):
            assert optimizer.graph_stats == {"eager: warm-up": 1, "captured": 1, "replayed": 2}
        state = copy.deepcopy(optimizer.state_dict())
    for p, q in zip(params_of(uninterrupted), params_of(resumed), strict=True):
        assert torch.equal(p, q)


@cuda
@needs_cuda
def test_cuda_loading_a_checkpoint_drops_the_graph() -> None:
    groups = _small_groups(seed=5)
    optimizer = BatchedMuSGD(groups)
    for step in range(3):
        fill_grads(params_of(groups), step)
        optimizer.step()
    optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert optimizer.plan_bytes == 0
    for step in range(3, 6):
        fill_grads(params_of(groups), step)
        optimizer.step()
    assert optimizer.graph_stats == {"eager: warm-up": 2, "captured": 2, "replayed": 2}


def test_every_optimizer_shares_one_capture_stream_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every backend uses one capture stream per device.

    The cuBLAS library keeps a workspace (32 MiB on an H200) for every stream it ran on, for the process's
    life. A side stream per optimizer grew the process by one workspace per optimizer built.
    """
    made: list[torch.device] = []

    class FakeStream:
        def __init__(self, device: torch.device) -> None:
            made.append(device)

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(graphs, "_SIDE_STREAMS", {}, raising=False)
    first, second = graphs.CudaBackend(), graphs.CudaBackend()
    zero, one = torch.device("cuda", 0), torch.device("cuda", 1)
    assert first._side(zero) is second._side(zero) is first._side(zero)
    assert first._side(one) is not first._side(zero)
    assert made == [zero, one]
