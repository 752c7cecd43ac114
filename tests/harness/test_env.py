"""The environment fingerprint: every field present and typed; unreadable ones null, never guessed."""

from __future__ import annotations

import json

import pytest
import torch

from harness import env
from tests.runfolders import H200_GPU

EXPECTED_TYPES = {
    "python": str,
    "os": str,
    "torch": str,
    "cuda_available": bool,
    "gpu_count": int,
    "gpu_names": list,
    "tf32_matmul": bool,
    "tf32_cudnn": bool,
    "cudnn_benchmark": bool,
    "deterministic_algorithms": bool,
    "float32_matmul_precision": str,
    "gpus_start": list,
}
NULLABLE = {
    "cuda_runtime": str,
    "cudnn": int,
    "driver_version": str,
    "cpu_model": str,
    "git_revision": str,
    "git_dirty": bool,
    "hostname": str,
}


def test_fields_present_and_typed() -> None:
    record = env.collect()
    for key, kind in EXPECTED_TYPES.items():
        assert isinstance(record[key], kind), key
    for key, kind in NULLABLE.items():
        assert key in record and (record[key] is None or isinstance(record[key], kind)), key
    assert record["torch"] == torch.__version__
    assert record["gpu_count"] == len(record["gpu_names"])
    json.dumps(record)


@pytest.fixture(autouse=True)
def no_given_revision(monkeypatch) -> None:
    """The H200 scripts export BENCH_GIT_REVISION to everything they run; each test here sets what it needs."""
    monkeypatch.delenv("BENCH_GIT_REVISION", raising=False)
    monkeypatch.delenv("BENCH_GIT_DIRTY", raising=False)


def test_git_revision_is_read_from_the_checkout() -> None:
    if not (env.project_root() / ".git").exists():
        pytest.skip("not a git checkout")
    record = env.collect()
    assert len(record["git_revision"]) == 40 and isinstance(record["git_dirty"], bool)


def test_a_parent_that_must_not_touch_the_gpu_takes_names_from_nvidia_smi(monkeypatch) -> None:
    monkeypatch.setattr(env.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(
        env, "_run", lambda args, **kw: "0, NVIDIA H200, 345, 3201, 31, 78.7, 580.159.04, 143771, GPU-1"
    )
    monkeypatch.setattr(env.torch.cuda, "get_device_name", lambda i: pytest.fail("created a CUDA context"))
    record = env.collect(touch_device=False)
    assert record["gpu_names"] == ["NVIDIA H200"] and record["gpu_memory_bytes"] == [143771 * 2**20]


def test_unreadable_gpu_figures_are_null_not_guessed(monkeypatch) -> None:
    monkeypatch.setattr(env.shutil, "which", lambda name: None)  # as on a machine without nvidia-smi
    record = env.collect()
    assert record["gpus_start"] == [] and record["driver_version"] is None


def test_gpu_snapshot_parses_nvidia_smi(monkeypatch) -> None:
    monkeypatch.setattr(env.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(
        env,
        "_run",
        lambda args, **kw: "0, NVIDIA H200, 1980, 3201, 34, 118.5, 580.159.04, 143771, GPU-5e1a2b3c-0000",
    )
    (gpu,) = env.gpu_snapshot()
    assert gpu == {**H200_GPU, "memory_total_mib": 143771.0, "uuid": "GPU-5e1a2b3c-0000"}
    monkeypatch.setattr(
        env, "_run", lambda args, **kw: "0, NVIDIA H200, [N/A], [N/A], 34, [N/A], 580.159.04, 143771, [N/A]"
    )
    (gpu,) = env.gpu_snapshot()
    assert gpu["sm_clock_mhz"] is None and gpu["power_w"] is None and gpu["temperature_c"] == 34.0
    assert gpu["uuid"] is None


def test_the_machine_is_named_by_its_boot_and_its_cards() -> None:
    """The record names the machine by its boot (the kernel's boot id) and each card's UUID.

    Every VM here is called 'vm', and torch and nvidia-smi give one card two sizes. So neither tells two
    machines apart.
    """
    record = env.collect()
    assert isinstance(record["boot_id"], str) and len(record["boot_id"]) == 36
    assert record["boot_id"] == env.boot_id()  # the same boot, read twice


def test_a_copied_tree_without_git_takes_the_revision_it_was_given(monkeypatch) -> None:
    monkeypatch.setattr(env, "_run", lambda args, **kw: None)  # no git answers here
    monkeypatch.setenv("BENCH_GIT_REVISION", "a" * 40)
    monkeypatch.setenv("BENCH_GIT_DIRTY", "0")
    record = env.collect()
    assert record["git_revision"] == "a" * 40 and record["git_dirty"] is False
    monkeypatch.delenv("BENCH_GIT_REVISION")
    monkeypatch.delenv("BENCH_GIT_DIRTY")
    record = env.collect()
    assert record["git_revision"] is None and record["git_dirty"] is None


def test_a_given_revision_wins_over_a_stale_git(monkeypatch) -> None:
    """The GPU machine's copy carries the .git of the session's start: the revision the copier gives is the truth."""
    stale = "b" * 40
    monkeypatch.setattr(env, "_run", lambda args, **kw: stale if args[:2] == ["git", "rev-parse"] else "")
    assert env.collect()["git_revision"] == stale  # nothing given: git answers
    monkeypatch.setenv("BENCH_GIT_REVISION", "c" * 40)
    monkeypatch.setenv("BENCH_GIT_DIRTY", "1")
    record = env.collect()
    assert record["git_revision"] == "c" * 40 and record["git_dirty"] is True


def test_an_uninstalled_tree_reads_its_version_from_pyproject(monkeypatch) -> None:
    """Run from PYTHONPATH (the GPU machine's way) there is no package metadata: the tree's own pyproject says."""
    import tomllib

    expected = tomllib.loads((env.project_root() / "pyproject.toml").read_text())["project"]["version"]
    monkeypatch.setattr(env, "_package_version", lambda name: None)
    assert env.collect(touch_device=False)["musgd_bench"] == expected
