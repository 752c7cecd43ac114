"""What padding costs on a GPU: the candidate's step and launch floor per YOLO26 scale and padding price.

`BatchedMuSGD.pad_chain_flops` prices one more Newton-Schulz chain in padded arithmetic: padding that wastes
more than a chain costs is split off (None: pad as far as the memory budget allows, the shipped rule). The
right price is a property of the GPU (a chain's fixed time against its arithmetic rate), so it is chosen
from this sweep, not assumed: per scale and price, the plan's chains, its Newton-Schulz arithmetic and its
memory (counted), then the eager step (ms, synchronized around a window of steps) and the CUDA-graph floor
of the whole step (the screen's `launch_floor`), in interleaved rounds so drift favours no price. Figures
are printed, not stored.

    PYTHONPATH=$PWD python scripts/device/h200_pad_price.py
    PYTHONPATH=$PWD python scripts/device/h200_pad_price.py --lanes 1,8
    PYTHONPATH=$PWD python scripts/device/h200_pad_price.py --device cpu --scales n --prices none,1e10 --rounds 1 --warm 1 --steps 1
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import defaultdict

import torch

from experiments.screen.trial import launch_floor
from experiments.workloads import build_param_groups, fill_synthetic_grads
from harness.timing import SyncTimer
from optimizers import batched
from optimizers.batched import BatchedMuSGD

PRICES = "none,0,1e8,1e9,3e9,1e10,3e10"


def priced(price: float | None, lanes: int) -> type[BatchedMuSGD]:
    return type("PricedMuSGD", (BatchedMuSGD,), {"pad_chain_flops": price, "ns_lanes": lanes})


def plan_figures(optimizer: BatchedMuSGD) -> tuple[int, float, float]:
    """Chains, Newton-Schulz GFLOP per step as run (padding included), stacks and scratch in MiB."""
    plan = optimizer._current_plan()
    flops = sum(batch.flops for batch in plan.batches)
    return len(plan.batches), flops / 1e9, plan.nbytes / 2**20


def parse_price(text: str) -> float | None:
    return None if text == "none" else float(text)


def measure(
    scale: str, price: float | None, lanes: int, device: str, warm: int, steps: int, replays: int
) -> dict[str, float]:
    groups, kwargs = build_param_groups(scale, device=device)
    fill_synthetic_grads(groups, seed=0)
    optimizer = priced(price, lanes)(groups, **kwargs)
    chains, gflop, mib = plan_figures(optimizer)
    for _ in range(warm):  # the state, the core's capture, a replay
        optimizer.step()
    with SyncTimer(device) as window:
        for _ in range(steps):
            optimizer.step()
    floor = launch_floor(optimizer, device, replays)["floor_ms"]
    return {
        "chains": chains,
        "gflop": gflop,
        "mib": mib,
        "ms": window.seconds * 1e3 / steps,
        "floor": float("nan") if floor is None else floor,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", nargs="+", default=["n", "s", "m", "l", "x"])
    parser.add_argument(
        "--prices", default=PRICES, help="comma-separated FLOP per chain; none: the budget rule"
    )
    parser.add_argument(
        "--lanes", default="1", help="comma-separated concurrent Newton-Schulz lanes (BatchedMuSGD.ns_lanes)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    arguments = parser.parse_args(argv)
    chosen = [
        (parse_price(text), int(lanes))
        for lanes in arguments.lanes.split(",")
        for text in arguments.prices.split(",")
    ]
    results: dict[tuple[str, tuple[float | None, int]], list[dict[str, float]]] = defaultdict(list)
    order = random.Random(0)
    with batched.batched_on_cpu(arguments.device == "cpu"):
        for _ in range(arguments.rounds):
            for scale in arguments.scales:
                prices = list(chosen)
                order.shuffle(prices)
                for price, lanes in prices:
                    figures = measure(
                        scale,
                        price,
                        lanes,
                        arguments.device,
                        arguments.warm,
                        arguments.steps,
                        arguments.replays,
                    )
                    results[scale, (price, lanes)].append(figures)
                    if arguments.device == "cuda":
                        torch.cuda.empty_cache()
    print(
        "scale | price (FLOP per chain) | lanes | chains | NS GFLOP | stacks+scratch MiB | step ms (median)"
        " | floor ms"
    )
    for scale in arguments.scales:
        for price, lanes in chosen:
            runs = results[scale, (price, lanes)]
            first = runs[0]
            step = statistics.median(r["ms"] for r in runs)
            floor = statistics.median(r["floor"] for r in runs)
            name = "budget rule" if price is None else f"{price:.0e}"
            print(
                f"{scale} | {name} | {lanes} | {first['chains']:.0f} | {first['gflop']:.1f} | {first['mib']:.1f} | "
                f"{step:.3f} | {floor:.3f}"
            )


if __name__ == "__main__":
    main()
