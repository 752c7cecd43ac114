"""Every console line is at most 100 characters: bad input's error and its ``hint:`` line, and a run's output.

Paths come from a short folder in /tmp, as a user's runs/ folder would be; they count like any other text.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli import main
from harness.console import WIDTH

pytestmark = pytest.mark.skipif(shutil.which("sleep") is None, reason="needs the sleep command")

COMMAND = ["command", "--arms", "0.01,0.02", "--pairs", "3", "--warmup", "0", "--", "sleep", "{arm}"]


def long_lines(text: str) -> list[str]:
    """The lines over ``WIDTH`` characters, with their length."""
    return [f"{len(line)}: {line}" for line in text.splitlines() if len(line) > WIDTH]


@pytest.fixture(scope="module")
def short() -> Iterator[Path]:
    """A folder with a short path, holding one finished ``bench command`` run under ``c/``.

    pytest's own folders grow with the worker's name under xdist, so the folder is made in /tmp."""
    root = Path(tempfile.mkdtemp(prefix="b", dir="/tmp"))
    try:
        assert main([*COMMAND[:-3], "--out", str(root / "c"), "--quiet", "--", *COMMAND[-2:]]) == 0
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def command_folder(short: Path) -> Path:
    (folder,) = (short / "c").iterdir()
    return folder


BAD = [
    ["pair", "--device", "cpu", "--steps", "0"],
    ["pair", "--device", "nope"],
    ["pair", "--device", "cpu", "--pairs", "x"],
    ["pair", "--device", "cpu", "--gpus", "a"],
    ["pair", "--device", "cpu", "--tolerance", "abc"],
    ["pair", "--device", "cpu", "--workload", "nope"],
    ["pair", "--device", "cpu", "--arms", "baseline,x=nomodule:Nope"],
    ["pair", "--device", "cpu", "--arms", "x=nomodule:Nope"],
    ["pair", "--device", "cpu", "--out", "{short}/a\x1bb\nc"],
    ["screen", "--device", "cpu", "--scales", "q"],
    ["screen", "--device", "cpu", "--dtype", "float7"],
    ["screen", "--device", "cpu", "--resume", "{short}/missing"],
    ["screen", "--device", "cpu", "--resume", "{folder}"],
    ["probe", "--device", "cpu", "--batch", "-1"],
    ["parity", "--device", "cpu", "--steps", "-3"],
    ["command", "--arms", "a,b", "--timeout", "0", "--", "echo"],
    ["command", "--arms", "a,b", "--", "echo", "{nope}"],
    ["command", "--arms", "a,b", "--figure", "(a)(b)", "--", "echo"],
    ["command", "--resume", "{folder}", "--", "echo", "other"],
    ["command", "--resume", "{folder}"],
    ["plan", "{folder}", "--effect", "lots"],
    ["plan", "{folder}", "--power", "2"],
    ["plan", "{short}/missing"],
    ["report", "{short}/missing"],
    ["report", "{short}/c"],
    ["env", "--arms", "x=nomodule:Nope"],
    ["nosuchcommand"],
]


@pytest.mark.parametrize("argv", BAD, ids=lambda argv: " ".join(argv)[:60])
def test_bad_input_is_an_error_line_and_a_hint_each_at_most_100_characters(
    short: Path, capsys, argv: list[str]
) -> None:
    filled = [a.replace("{short}", str(short)).replace("{folder}", str(command_folder(short))) for a in argv]
    assert main(filled) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines and lines[0].startswith("bench: error: "), err
    assert all(line.startswith("hint: ") for line in lines[1:]) and len(lines) <= 2, err
    assert not long_lines(err), "\n".join(long_lines(err))


def test_a_control_character_in_a_value_stays_escaped(short: Path, capsys) -> None:
    assert main(["pair", "--device", "cpu", "--out", f"{short}/a\x1bb\nc"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b" in err and "\\n" in err, err


def test_a_run_s_output_and_plan_and_env_are_lines_of_at_most_100_characters(short: Path, capsys) -> None:
    out = short / "s"  # one-letter folders, as short as a user's runs/ folder
    screen = ["screen", "--device", "cpu", "--scales", "n", "--guards", "0", "--steps", "1"]
    assert main([*screen, "--warmup-steps", "0", "--pairs", "2", "--warmup", "0", "--out", str(out)]) == 0
    assert main([*COMMAND[:-3], "--out", str(short / "d"), "--", *COMMAND[-2:]]) == 0
    assert main(["plan", str(command_folder(short)), "--effect", "3%"]) == 0
    assert main(["env"]) == 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "run folder:" in text and "environment" in text and "pairs" in text
    assert not long_lines(text), "\n".join(long_lines(text))
