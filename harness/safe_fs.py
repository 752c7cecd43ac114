"""File operations inside a run folder that follow no link: a link is removed (never its target) or refused."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class LinkInRunFolder(OSError):
    """A path of a run folder is a symbolic link; the message names it."""


def open_no_follow(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (``LinkInRunFolder``) instead of following it."""
    try:
        return os.open(path, flags | NO_FOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (os.path.islink(path) and exc.errno in (errno.EMLINK, errno.ENOTDIR)):
            raise LinkInRunFolder(
                errno.ELOOP, f"{path} is a symbolic link, and nothing in a run folder is followed through one"
            ) from None
        raise


def create_exclusive(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A new file at ``path`` for writing, the entry there removed first (never a link's target)."""
    remove_entry(Path(path))
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NO_FOLLOW, mode)


def remove_entry(path: Path) -> None:
    """Remove a file or link at ``path`` (a link itself, never its target); nothing where nothing is."""
    if path.is_symlink() or path.exists() and not path.is_dir():
        path.unlink(missing_ok=True)


def remove_tree(path: Path) -> None:
    """Remove a folder and what it holds, errors ignored; a link is removed as a link."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        with contextlib.suppress(OSError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def fresh_dir(path: Path) -> Path:
    """``path`` as a real folder (made where missing): a link or file there is removed first, never followed."""
    remove_entry(path)
    path.mkdir(exist_ok=True)
    return path
