"""The failures a command reports on stderr with exit status 2; the Python API raises them.

Each has a short message and an optional hint; the CLI prints the hint on a line of its own.
"""

from __future__ import annotations

import errno

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class Refusal(Exception):
    """A failure the CLI prints as a message and an optional ``hint:`` line."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class InputError(Refusal, ValueError):
    """A bad user input: the message names what is wrong; the hint, what is accepted."""


class RunFolderError(Refusal):
    """A run folder that cannot be used as asked: missing, corrupt, in use or unwritable."""


def is_disk_full(exc: BaseException) -> bool:
    """True for an ``OSError`` that says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL
