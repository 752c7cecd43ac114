"""Make tests/data/musgd_goldens_8.4.101.pt: what upstream Ultralytics 8.4.101's per-parameter MuSGD computes.

Every other optimizer test compares implementations that share one Newton-Schulz; these goldens come from
the published upstream code, so a wrong coefficient, order or dtype in ours is seen. Run once, on the CPU:

    python scripts/make_goldens.py --wheel /path/to/ultralytics-8.4.101-py3-none-any.whl

The wheel is read, not installed: only its optimizer module (`ultralytics/optim/muon.py`, which imports
torch alone) is extracted into a temporary directory and imported from there, so nothing else of ultralytics
is loaded. The data records the wheel's version and sha256, the torch version, the CPU capability and the
Python version that made it.

The parameter set: Muon matrices that are wide, tall and square, 2-D and 4-D (a square kernel, a 1x1 kernel),
all contiguous and of distinct shapes, in groups with Nesterov on and off and weight decay on and off, plus
bias/bn-style vectors in SGD groups; three steps with seeded gradients, in float32 and in bfloat16. The
bfloat16 case keeps Nesterov on in its Muon groups: without it upstream orthogonalizes the bf16 momentum
buffer itself (`G.bfloat16()` returns the buffer, which is then normalized in place), a known upstream
defect that musgd-bench's baseline does not reproduce (it orthogonalizes a copy).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import platform
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

WHEEL_VERSION = "8.4.101"
MODULE_IN_WHEEL = "ultralytics/optim/muon.py"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / f"musgd_goldens_{WHEEL_VERSION}.pt"
FORMAT = 1
STEPS = 3
OPTIMIZER_KWARGS = {"muon": 0.2, "sgd": 1.0}  # what the Ultralytics trainer passes

# (name, hyperparameters, parameter shapes); every Muon shape is distinct, so no two matrices could batch.
MUON_DECAY_NESTEROV = [(16, 8, 3, 3), (36, 4, 3, 3), (48, 12)]  # wide kernel, square kernel, tall
MUON_PLAIN = [(32, 8, 1, 1), (12, 40), (24, 24)]  # tall 1x1 kernel, wide, square
GROUPS: dict[str, list[tuple[str, dict[str, Any], list[tuple[int, ...]]]]] = {
    "float32": [
        ("muon", {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}, MUON_DECAY_NESTEROV),
        ("muon", {"lr": 0.01, "momentum": 0.8, "nesterov": False, "weight_decay": 0.0}, MUON_PLAIN),
        ("bn", {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 0.0}, [(16,), (36,)]),
        ("bias", {"lr": 0.05, "momentum": 0.9, "nesterov": False, "weight_decay": 5e-4}, [(48,), (12,)]),
    ],
    "bfloat16": [
        ("muon", {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}, MUON_DECAY_NESTEROV),
        ("muon", {"lr": 0.01, "momentum": 0.8, "nesterov": True, "weight_decay": 0.0}, MUON_PLAIN),
        ("bn", {"lr": 0.02, "momentum": 0.9, "nesterov": True, "weight_decay": 0.0}, [(16,), (36,)]),
        ("bias", {"lr": 0.05, "momentum": 0.9, "nesterov": False, "weight_decay": 5e-4}, [(48,), (12,)]),
    ],
}


def load_upstream(wheel: Path, workdir: Path) -> tuple[type[torch.optim.Optimizer], str]:
    """Upstream's MuSGD class, imported from the module file extracted from the wheel; and the wheel's version."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        version = next(
            line.split(":", 1)[1].strip()
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Version:")
        )
        target = workdir / "upstream_muon.py"
        target.write_bytes(archive.read(MODULE_IN_WHEEL))
    spec = importlib.util.spec_from_file_location("upstream_muon", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MuSGD, version


def build_case(dtype: torch.dtype, seed: int) -> tuple[list[dict[str, Any]], list[list[torch.Tensor]]]:
    """Groups (initial parameter values as plain tensors) and every step's gradients, in parameter order."""
    generator = torch.Generator().manual_seed(seed)
    groups = []
    for name, hyper, shapes in GROUPS[str(dtype).removeprefix("torch.")]:
        params = [(torch.randn(s, generator=generator) * 0.02).to(dtype) for s in shapes]
        groups.append({"params": params, "use_muon": name == "muon", "param_group": name, **hyper})
    count = sum(len(g["params"]) for g in groups)
    shapes = [p.shape for g in groups for p in g["params"]]
    grads = [
        [(torch.randn(shapes[i], generator=generator) * 0.01).to(dtype) for i in range(count)]
        for _ in range(STEPS)
    ]
    return groups, grads


def run(optimizer_class: type[torch.optim.Optimizer], case: dict[str, Any]) -> dict[str, Any]:
    """Step `optimizer_class` through a case; the final parameters and state, in parameter order."""
    groups = [{**g, "params": [torch.nn.Parameter(p.clone()) for p in g["params"]]} for g in case["groups"]]
    params = [p for g in groups for p in g["params"]]
    optimizer = optimizer_class(groups, **case["optimizer_kwargs"])
    for step_grads in case["grads"]:
        for p, grad in zip(params, step_grads, strict=True):
            p.grad = grad.clone()
        optimizer.step()
    return {
        "params": [p.detach().clone() for p in params],
        "state": [{k: v.clone() for k, v in optimizer.state[p].items()} for p in params],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, required=True, help=f"ultralytics-{WHEEL_VERSION} wheel")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as workdir:
        upstream, version = load_upstream(args.wheel, Path(workdir))
        if version != WHEEL_VERSION:
            raise SystemExit(f"{args.wheel} is ultralytics {version}, not {WHEEL_VERSION}")
        cases = {}
        for seed, dtype in enumerate((torch.float32, torch.bfloat16)):
            groups, grads = build_case(dtype, seed)
            case = {"groups": groups, "grads": grads, "optimizer_kwargs": dict(OPTIMIZER_KWARGS)}
            case["expected"] = run(upstream, case)
            cases[str(dtype).removeprefix("torch.")] = case
    data = {
        "format": FORMAT,
        "made_with": {
            "ultralytics": version,
            "wheel_sha256": hashlib.sha256(args.wheel.read_bytes()).hexdigest(),
            "torch": str(torch.__version__),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "python": platform.python_version(),
            "script": "scripts/make_goldens.py",
        },
        "steps": STEPS,
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, args.out)
    print(
        f"wrote {args.out} ({args.out.stat().st_size} bytes) from ultralytics {version} with torch {torch.__version__}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
