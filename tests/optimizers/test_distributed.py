"""The candidate under a process group: each rank orthogonalizes its share, one gather per step, same updates.

Two CPU ranks on the `gloo` backend run the candidate through the test-only batched switch. They are spawned
with a free port and a deadline. The parent runs the one-rank candidate on the same values and compares bit
for bit. No rank outlives the test, whatever happens in it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from optimizers import BatchedMuSGD
from optimizers.batched import batched_on_cpu
from optimizers.distributed import Partition, world_and_rank
from tests.optimizers.groups import HYPER, scaled_params

WORLD = 2
STEPS = 4
DEADLINE_S = 120  # far above the few seconds the ranks need; a hung collective fails the test instead

# A padded batch (smaller dimension 16), a uniform batch of an odd count (the last rank's chunk holds a zero
# matrix), lone matrices of their own smaller dimensions, and an SGD group.
MUON_SHAPES = (
    [(16, 8, 3, 3), (32, 16, 1, 1), (64, 16), (16, 40)] + [(24, 24)] * 5 + [(20, 36), (28, 44), (12, 12)]
)
SGD_SHAPES = [(16,), (32,), (24,)]


def _groups(device: str = "cpu", seed: int = 0) -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(seed)
    muon = scaled_params(MUON_SHAPES, generator, device)
    sgd = scaled_params(SGD_SHAPES, generator, device)
    return [
        {"params": muon[:6], "use_muon": True, **HYPER},
        {"params": muon[6:], "use_muon": True, **{**HYPER, "nesterov": False, "lr": 0.01}},
        {"params": sgd, "use_muon": False, **HYPER},
    ]


def _run(groups: list[dict[str, Any]]) -> BatchedMuSGD:
    """STEPS candidate steps with seeded gradients and a learning rate that moves every step."""
    optimizer = BatchedMuSGD(groups, muon=0.2, sgd=1.0)
    params = [p for g in groups for p in g["params"]]
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = (torch.randn(p.shape, generator=generator) * 0.01).to(p.device)
        for group in groups:
            group["lr"] *= 1.1
        optimizer.step()
    return optimizer


def _results(optimizer: BatchedMuSGD, groups: list[dict[str, Any]]) -> dict[str, Any]:
    params = [p for g in groups for p in g["params"]]
    return {
        "params": [p.detach().clone() for p in params],
        "state": [{k: v.clone() for k, v in optimizer.state[p].items()} for p in params],
        "sharing": optimizer.sharing,
    }


def _rank(rank: int, world: int, port: int, out: str, device: str) -> None:
    """One rank: the candidate in a gloo group, its results and the collectives it issued saved to `out`."""
    import torch.distributed as dist

    from optimizers import distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        gathers = []
        original = distributed._all_gather_single
        distributed._all_gather_single = lambda *args, **kwargs: (
            gathers.append(1) or original(*args, **kwargs)
        )
        groups = _groups(device)
        with batched_on_cpu():  # CPU tensors take the batched path; CUDA ones take it anyway
            optimizer = _run(groups)
        results = {
            **_results(optimizer, groups),
            "gathers": len(gathers),
            "graphs": dict(optimizer.graph_stats),
        }
        torch.save(results, os.path.join(out, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, out: Path, device: str = "cpu") -> list[dict[str, Any]]:
    """Run `_rank` on `world` processes and load what each saved; kill every one still alive on failure or
    past the deadline."""
    context = mp.start_processes(
        _rank, args=(world, _free_port(), str(out), device), nprocs=world, join=False
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world} ranks still running after {DEADLINE_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
        assert not any(process.is_alive() for process in context.processes)
    return [torch.load(out / f"rank{r}.pt", weights_only=True, map_location="cpu") for r in range(world)]


def _one_rank(device: str = "cpu") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        groups = _groups(device)
        with batched_on_cpu():
            optimizer = _run(groups)
        return _results(optimizer, groups), groups
    finally:
        torch.set_num_threads(threads)


def test_two_ranks_share_newton_schulz_and_update_as_one_rank_does(tmp_path: Path) -> None:
    ranks = _spawn(WORLD, tmp_path)
    one_rank, _ = _one_rank()
    for rank, result in enumerate(ranks):
        assert result["gathers"] == STEPS  # one collective per step, for every matrix
        for index, (p, q) in enumerate(zip(one_rank["params"], result["params"], strict=True)):
            assert torch.equal(p, q), (rank, index, tuple(p.shape))
        for index, (state, other) in enumerate(zip(one_rank["state"], result["state"], strict=True)):
            assert set(state) == set(other)
            assert all(torch.equal(state[key], other[key]) for key in state), (rank, index)
    here = [result["sharing"]["matrices_here"] for result in ranks]
    assert all(result["sharing"]["world"] == WORLD for result in ranks)
    assert sum(here) == len(MUON_SHAPES) and all(0 < h < len(MUON_SHAPES) for h in here)
    assert one_rank["sharing"] == {
        "world": 1,
        "rank": 0,
        "matrices_here": len(MUON_SHAPES),
        "matrices": len(MUON_SHAPES),
        "note": "",
    }


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_two_ranks_on_one_device_agree_with_one_rank(tmp_path: Path) -> None:
    """Two gloo ranks on one GPU: the plumbing, not the speed.

    A rank's chunk of a batch is a smaller cuBLAS batch than one rank's, which may round differently. The
    updates are bit-equal or within the calibrated bound of experiments.parity; the test prints which. Muon
    buffers read gradients only, so they are bit-equal either way. Each rank's graph holds its own
    Newton-Schulz share; the gather stays eager.
    """
    from experiments.parity_steps import ULP_SENSITIVITY_FACTOR, ulp_sensitivity

    ranks = _spawn(WORLD, tmp_path, "cuda")
    one_rank, groups = _one_rank("cuda")
    params = [p for g in groups for p in g["params"]]
    muon = [i for i, p in enumerate(params) if "momentum_buffer_SGD" in one_rank["state"][i]]
    matrices = [one_rank["state"][i]["momentum_buffer"].reshape(len(params[i]), -1) for i in muon]
    tolerance = ULP_SENSITIVITY_FACTOR * max(ulp_sensitivity(m) for m in matrices)
    muon_lr_sum = sum(0.02 * 1.1 ** (step + 1) for step in range(STEPS))  # the larger group's learning rates
    bound = muon_lr_sum * 0.2 * tolerance * 1.01 + 4 * torch.finfo(torch.float32).eps
    worst = 0.0
    for result in ranks:
        assert result["gathers"] == STEPS
        assert result["graphs"] == {"eager: warm-up": 1, "captured": 1, "replayed": STEPS - 2}
        for p, q in zip(one_rank["params"], result["params"], strict=True):
            worst = max(worst, (p.cpu().double() - q.double()).abs().max().item())
        for i in muon:
            assert torch.equal(
                one_rank["state"][i]["momentum_buffer"].cpu(), result["state"][i]["momentum_buffer"]
            )
    verdict = "bit-equal" if worst == 0 else f"largest difference {worst:.3g}"
    print(f"\n2 ranks against 1 on CUDA: {verdict} (bound {bound:.3g})")
    assert worst <= bound


def test_without_a_process_group_one_rank_does_everything() -> None:
    assert world_and_rank() == (1, 0)


def test_the_partition_splits_batches_evenly_and_balances_lone_matrices() -> None:
    # Two batches (5 matrices of 100 elements, 4 of 30) and lone matrices of 500, 300, 250, 40 elements.
    partitions = [Partition.of([5, 4], [100, 30], [500, 300, 250, 40], world=2, rank=r) for r in range(2)]
    first = partitions[0]
    assert partitions[1].fingerprint() == first.fingerprint()
    assert first.chunks == (3, 2) and first.offsets == (0, 300)
    shared = 3 * 100 + 2 * 30
    assert first.owners == (0, 1, 1, 0)  # largest first to the least loaded: 500 | 300, 250 | 40
    assert first.whole_offsets == (shared, shared, shared + 300, shared + 500)
    assert first.per_rank == shared + 550
    lone = Partition.of([], [], [7], world=3, rank=2)
    assert lone.owners == (0,) and lone.per_rank == 7
