"""The environment fingerprint of a run: hardware, driver, CUDA, libraries, settings, revision, clocks."""

from __future__ import annotations

import datetime as _dt
import numbers
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from harness.codepaths import source_sha256

_SMI_FIELDS = tuple(
    "index name clocks.sm clocks.mem temperature.gpu power.draw driver_version memory.total uuid".split()
)

SMI_FIGURES = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w")


def _run(args: list[str], cwd: Path | None = None, timeout: float = 10.0) -> str | None:
    """``args``'s stripped output, or None when it fails or cannot start."""
    try:
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def query_smi(fields: Iterable[str]) -> str | None:
    """``nvidia-smi --query-gpu=FIELDS`` as CSV without header or units; None when it fails."""
    return _run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])


def _number(text: str | None) -> float | None:
    try:
        return float(str(text).split()[0])
    except (TypeError, ValueError, IndexError):
        return None


# What this module records, as `harness.validation.load_env` checks it; a list of one shape is a list of records.
_NUMBER = numbers.Real | None
GPU_SHAPE: dict[str, Any] = {
    "index": int,
    "name": str,
    "uuid": str | None,
    "driver_version": str | None,
    **dict.fromkeys(
        ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "memory_total_mib"), _NUMBER
    ),
}
RESUME_SHAPE: dict[str, Any] = {
    "recorded": str,
    "boot_id": str | None,
    "gpus": [GPU_SHAPE],
    "git_revision": str | None,
    "git_dirty": bool | None,
    "placement": dict[str, Any] | None,
    "load1_start": _NUMBER,
    "cpu_logical": int | None,
}
ENV_SHAPE: dict[str, Any] = {
    **{key: hint for key, hint in RESUME_SHAPE.items() if key != "gpus"},
    "gpus_start": [GPU_SHAPE],
    "gpus_end": [GPU_SHAPE],
    "resumes": [RESUME_SHAPE],
    "gpu_names": list[str],
    "gpu_memory_bytes": list[int | None],
    **dict.fromkeys(("os", "python", "torch", "cuda_runtime", "driver_version", "cpu_model"), str | None),
    **dict.fromkeys(("ultralytics", "musgd_bench", "hostname", "float32_matmul_precision"), str | None),
    **dict.fromkeys(("cudnn", "cpu_count", "gpu_count"), int | None),
    **dict.fromkeys(("cuda_available", "cudnn_benchmark", "deterministic_algorithms"), bool | None),
}


def gpu_snapshot() -> list[dict[str, Any]]:
    """Per GPU: index, name, clocks (MHz), temperature (°C), power (W), driver, memory (MiB); [] if none."""
    if shutil.which("nvidia-smi") is None:
        return []
    text = query_smi(_SMI_FIELDS)
    if not text:
        return []
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(_SMI_FIELDS):
            continue
        figures = dict(zip(SMI_FIGURES, map(_number, cells[2:6]), strict=True))
        gpus.append(
            {
                "index": int(cells[0]),
                "name": cells[1],
                **figures,
                "driver_version": cells[6] or None,
                "memory_total_mib": _number(cells[7]),
                "uuid": cells[8] if cells[8] and not cells[8].startswith("[") else None,
            }
        )
    return gpus


def boot_id() -> str | None:
    """The kernel's id of this boot (one VM's life); None where the OS has none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def git_state(repo: Path, code_files: Iterable[str] = ()) -> dict[str, Any]:
    """``_git`` of ``repo``, with the files of the code under test (an arm's module)."""
    state = _git(repo)
    inside, outside = [], []
    for name in dict.fromkeys(code_files):
        path = Path(name).resolve()
        (inside if path.is_relative_to(repo.resolve()) else outside).append(path)
    if inside and state["git_revision"] is not None and state["git_dirty"] is False:
        status = _run(
            ["git", "status", "--porcelain", "--untracked-files=all", "--", *map(str, inside)], repo
        )
        state["git_dirty"] = None if status is None else bool(status)
    state["arm_files"] = [{"path": str(path), "sha256": source_sha256(path)} for path in outside]
    return state


def _git(repo: Path) -> dict[str, Any]:
    """Revision and dirty flag of the code that runs."""
    given = os.environ.get("BENCH_GIT_REVISION")
    if given:
        dirty = os.environ.get("BENCH_GIT_DIRTY")
        return {
            "git_revision": given.strip(),
            "git_dirty": None if dirty is None else dirty.strip().lower() in ("1", "true", "yes"),
        }
    revision = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    if revision is None:
        return {"git_revision": None, "git_dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {"git_revision": revision, "git_dirty": None if status is None else bool(status)}


def code_revision(code_files: Iterable[str] = ()) -> dict[str, Any]:
    """The revision and dirty flag of the code running now."""
    return git_state(project_root(), code_files)


def project_root() -> Path:
    """The checkout this package runs from (where its git revision is read)."""
    return Path(__file__).resolve().parent.parent


def _cudnn_version() -> int | None:
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except RuntimeError:
        return None


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _own_version() -> str | None:
    """musgd-bench's version: the installed metadata, else the ``pyproject.toml`` of the tree that runs."""
    installed = _package_version("musgd-bench")
    if installed is not None:
        return installed
    import tomllib  # Python 3.11 on; reached only where the package is not installed

    try:
        with open(project_root() / "pyproject.toml", "rb") as handle:
            return str(tomllib.load(handle)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None


def collect(touch_device: bool = True, code_files: Iterable[str] = ()) -> dict[str, Any]:
    """The fingerprint of this process's machine and settings, as JSON-ready values."""
    cuda = torch.cuda.is_available()
    gpus = gpu_snapshot()
    if touch_device and cuda:
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        memory = [torch.cuda.get_device_properties(i).total_memory for i in range(len(names))]
    else:
        names = [gpu["name"] for gpu in gpus]
        memory = [
            None if gpu["memory_total_mib"] is None else int(gpu["memory_total_mib"] * 2**20) for gpu in gpus
        ]
    return {
        "recorded": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node() or None,
        "boot_id": boot_id(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda_available": cuda,
        "cuda_runtime": torch.version.cuda,
        "cudnn": _cudnn_version(),
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_names": names,
        "gpu_memory_bytes": memory,
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "ultralytics": _package_version("ultralytics"),
        "musgd_bench": _own_version(),
        **code_revision(code_files),
        "gpus_start": gpus,
        "gpus_end": None,
    }
