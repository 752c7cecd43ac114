"""Suite-wide set-up and the fixtures several folders share; the set-up changes no test's meaning.

OpenMP threads wait asleep (`OMP_WAIT_POLICY=PASSIVE`, unless the caller set a policy). The CI runs two pytest
workers on two cores, and each fit's worker takes both cores. By default libgomp spins while it waits, holding
a core the awaited thread needs. On this machine a 64-step fit beside one busy process took 63 s spinning and
3.5 s with passive waits. The variable is set before anything loads libgomp; every worker and rank the tests
start inherits it.

The protocol collects garbage after every trial. With torch, pandas, matplotlib, scipy and every test module
loaded, a full collection walks millions of objects: 0.2-0.5 s per trial. Before each test the objects still
alive are collected once and frozen (`gc.freeze`). Each collection a test makes then walks only what that test
created, and still frees every cycle.

The slowest files run first (`SLOWEST_FIRST`). Under `--dist loadfile` a worker takes the next whole file when
it is nearly out of tests. With the longest files first, the short ones fill in at the end and both workers
end together. The reordering xdist does itself is turned off where xdist is installed; the GPU machine's
pytest may lack xdist.
"""

from __future__ import annotations

import gc
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Longest first, by the seconds each file took in a whole suite (-n 2 --dist loadfile, --durations=0); a file
# not named here runs after these, in the usual order. A stale order costs time, never a test.
SLOWEST_FIRST = (
    "test_readme.py",  # one test (150-270 s): first, or it lands alone at the end of one worker
    "test_run_faults.py",
    "test_validation_faults.py",
    "test_folder_is_data.py",
    "test_fit.py",
    "test_ddp.py",
    "test_fit_ultralytics.py",
    "test_parity.py",
    "test_report.py",
    "test_quiet.py",
    "test_cli.py",
    "test_dispatch.py",
    "test_batched.py",
    "test_screen.py",
    "test_protocol.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """Hands files out in `SLOWEST_FIRST`'s order under xdist (`--no-loadscope-reorder`)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the files of ``SLOWEST_FIRST`` first, in its order; within a file the tests keep their order."""
    rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _freeze_what_is_already_alive() -> None:
    gc.collect()
    gc.freeze()


# Imports of the package and of the helpers that load it sit inside the fixtures below: torch must not load
# before OMP_WAIT_POLICY is set above.


@pytest.fixture
def bench(capsys: pytest.CaptureFixture[str]):
    """`bench(argv)` calls the CLI in this process; `bench.refused(argv, ...)` checks a one-line refusal."""
    from tests.cli import Bench

    return Bench(capsys)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory):
    """A finished run folder of the test tier (one warm-up, two pairs); copy it before writing to it."""
    from tests.trialfns import plan_of, runner

    root = tmp_path_factory.mktemp("finished")
    return runner(root).start(plan_of("sleepy", warmup=1, pairs=2)).folder


@pytest.fixture
def half_run(tmp_path: Path):
    """A run of ``TINY_PAIR`` with its first trial logged and the second not run (interrupted there)."""
    from experiments.fit.plan import make_plan
    from experiments.tiers import TIERS
    from harness.options import protocol_options
    from tests.argv import TINY_PAIR
    from tests.runfolders import only_run
    from tests.trialfns import TINY_FIT_SETTINGS, runner

    def stop_at_second(plan):
        def trial(ctx) -> dict:
            if ctx.trial.index == 1:
                raise KeyboardInterrupt
            return {"value": 1.0}

        return trial

    protocol = protocol_options(pairs=1, warmup=2, device="cpu")
    plan = make_plan(protocol, TINY_FIT_SETTINGS, "bench " + " ".join(TINY_PAIR))
    with pytest.raises(KeyboardInterrupt):
        runner(tmp_path, tiers=TIERS).start(plan, stop_at_second(plan))
    return only_run(tmp_path)


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test where a run starts or resumes: for commands refused before anything runs."""
    from harness.run import Runner

    monkeypatch.setattr(Runner, "start", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr(Runner, "resume", lambda *a, **k: pytest.fail("a run resumed"))


@pytest.fixture
def no_gc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skips the collection after each trial, which dominates the time of trials that allocate nothing."""
    from harness import protocol

    monkeypatch.setattr(protocol, "_release_device_memory", lambda: None)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread, the count given back after.

    Small tensors only lose from more threads: oversubscribed on a busy two-core runner, tests ran ten times
    slower.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def tmpfs(tmp_path: Path):
    """`tmpfs(size)` mounts a file system of that size below `tmp_path`; skipped where mounting is refused."""
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"tmpfs-{len(mounts)}"
        where.mkdir()
        made = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        )
        if made.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)
