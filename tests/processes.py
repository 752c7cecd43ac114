"""Child processes for tests: one started from the checkout's root, waits on what it does, what it leaves."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests import ROOT, child_env


@contextmanager
def started(
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    stdout: int = subprocess.PIPE,
    stderr: int = subprocess.PIPE,
    text: bool = True,
) -> Iterator[subprocess.Popen]:
    """``command`` running from the checkout's root (in ``child_env()`` unless ``env``); killed on leaving if
    it still runs, so a failed test leaves no process behind."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=env or child_env(), stdout=stdout, stderr=stderr, text=text
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()


def wait_for(predicate: Callable[[], bool], timeout: float = 90.0) -> None:
    """Returns once ``predicate()`` holds; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def children(pid: int) -> set[int]:
    """The processes ``pid`` started, from /proc."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text().split() if (task / "children").exists() else []
        found |= {int(p) for p in text}
    return found


def assert_gone(pids: Iterable[int], timeout: float) -> None:
    """Every process of ``pids`` ends within ``timeout`` seconds: none is left running."""
    pids = set(pids)
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)]
