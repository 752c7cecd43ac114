"""The failures a command reports as one line on stderr with exit status 2 (the CLI prints them; the Python API
raises them): a bad input, and a run folder that cannot be used as asked."""

from __future__ import annotations

import errno

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class InputError(ValueError):
    """A bad user input: the message names what is wrong and what is accepted."""


class RunFolderError(Exception):
    """A run folder that cannot be used as asked (missing, corrupt, in use, unwritable): the message names the
    file and what is wrong, and how to go on where there is a way."""


def is_disk_full(exc: BaseException) -> bool:
    """True for an ``OSError`` that says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL
