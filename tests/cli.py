"""``bench`` called in this process as its console script calls it, with what the call printed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.cli import main


@dataclass(frozen=True)
class Ran:
    """One call's exit status and its captured stdout and stderr."""

    status: int
    out: str
    err: str


class Bench:
    """Calls ``harness.cli.main`` with a command line and captures what it printed."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys

    def __call__(self, argv: list[str]) -> Ran:
        self._capsys.readouterr()  # what came before this call
        status = main(argv)
        out, err = self._capsys.readouterr()
        return Ran(status, out, err)

    def refused(self, argv: list[str], *fragments: str) -> str:
        """Asserts exit status 2, one error line and at most one ``hint:`` line holding the fragments.

        Returns the error text."""
        ran = self(argv)
        error = ran.err.strip()
        assert ran.status == 2, error
        lines = error.splitlines()
        assert lines and lines[0].startswith("bench: error: ") and "Traceback" not in error, error
        assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), error
        for fragment in fragments:
            assert fragment in error, error
        return error
