"""Tier commands in a real terminal: a pseudo-terminal, as a user runs them, with the live progress display.

Every tier command is here: pair, screen, probe, parity and command. A pipe hides what only a terminal shows:
rich's live display redraws through stdout. The stdout that survives a closed pipe must not feed that back
into itself. Each command runs under a hard timeout; a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import child_env
from tests.argv import ONE_PAIR, TINY_FIT, TINY_SCREEN, overridden

ENV = child_env(TERM="xterm-256color", COLUMNS="100", LINES="40")
HARD_TIMEOUT = 180.0  # seconds; each command below takes under 30 s on a loaded two-core machine

COMMANDS = {
    "pair": ["pair", *TINY_FIT, *ONE_PAIR],
    "screen": [*overridden(TINY_SCREEN, ["--steps", "2"]), *ONE_PAIR],
    "parity": ["parity", "--steps", "2", "--device", "cpu"],
    "probe": [
        *("probe", "--head", "lm", "--variants", "native", "--tokens", "64", "--vocab", "256", "--dim", "32"),
        *("--pairs", "1", "--warmup", "0", "--device", "cpu"),
    ],
    "command": ["command", "--arms", "baseline,candidate-cpu", *ONE_PAIR, "--", "sleep", "0.1"],
}


def with_out(argv: list[str], out: Path) -> list[str]:
    """``argv`` with ``--out`` among its options (before a command's ``--``)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    return [*argv[:cut], "--out", str(out), *argv[cut:]]


def run_in_terminal(argv: list[str], cwd: Path, timeout: float = HARD_TIMEOUT) -> tuple[int | None, str]:
    """`bench ARGV` with a pseudo-terminal as its stdin, stdout and stderr.

    Returns the exit status (None if it hung past `timeout` and was killed) and everything it wrote, escapes
    included.
    """
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", "from harness.entry import entry; entry()", *argv],
        cwd=cwd,
        env=ENV,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the terminal's other side closed: the process has ended
                    data = b""
                if not data and process.poll() is not None:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                break
        code = process.poll()
        if code is None:
            process.kill()
    finally:
        process.wait(timeout=30)
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


def only_folder(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    return folder


def rows_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_tier_command_runs_to_the_end_in_a_terminal(command: str, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    code, text = run_in_terminal(with_out(COMMANDS[command], out), tmp_path)
    assert code == 0, text[-3000:]
    rows = rows_of(only_folder(out))
    assert rows and all(r["status"] == "ok" for r in rows), rows
    if command != "parity":
        assert sorted(r["arm"].split("@")[0] for r in rows) == ["baseline", "candidate-cpu"]  # @g0: a guard


def test_the_live_display_shows_the_time_left(tmp_path: Path) -> None:
    """After the first trial the bar estimates the time left from the log's trial times."""
    out = tmp_path / "runs"
    argv = overridden(COMMANDS["pair"], ["--pairs", "2", "--out", str(out)])  # a second pair to estimate
    code, text = run_in_terminal(argv, tmp_path)
    assert code == 0, text[-3000:]
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert re.search(r"\d+:\d\d:\d\d elapsed", plain), plain[-2000:]
    assert re.search(r"about \d+:\d\d:\d\d left", plain), plain[-2000:]


def run_piped(
    argv: list[str], cwd: Path, closed: str = "", encoding: str = ""
) -> subprocess.CompletedProcess:
    """``bench ARGV`` with stdout or stderr closed (``>&-``, ``2>&-``) or an ASCII-only encoding."""
    fds = {"stdout": 1, "stderr": 2}
    env = {**ENV, **({"PYTHONIOENCODING": encoding} if encoding else {})}
    shell = " ".join(['"$@"', f"{fds[closed]}>&-" if closed else ""])
    return subprocess.run(
        [
            "bash",
            "-c",
            shell,
            "bench",
            sys.executable,
            "-c",
            "from harness.entry import entry; entry()",
            *argv,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=HARD_TIMEOUT,
    )


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_closed_stream_loses_no_trial(closed: str, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    done = run_piped([*COMMANDS["pair"], "--out", str(out)], tmp_path, closed=closed)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr
    assert len(rows_of(only_folder(out))) == 2


def test_an_ascii_terminal_loses_no_trial(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    done = run_piped([*COMMANDS["screen"], "--out", str(out)], tmp_path, encoding="ascii")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "UnicodeEncodeError" not in done.stderr, done.stderr
    assert len(rows_of(only_folder(out))) == 2
