"""Where an import would load code from, found without running it: code inside a run folder is refused."""

from __future__ import annotations

import hashlib
import importlib.machinery
import inspect
import os
import sys
from pathlib import Path
from typing import Any

_SUFFIXES = tuple(importlib.machinery.all_suffixes())
RUN_FOLDER_MARK = "plan.json"  # every run folder holds its plan (harness.tables.PLAN) and one of these:
RUN_FOLDER_FILES = ("env.json", "trials.jsonl", "run.lock")


def import_locations(module_name: str) -> list[Path]:
    """Every file and folder importing ``module_name`` could read, found without importing anything."""
    found: list[Path] = []
    search = [os.path.abspath(entry or os.curdir) for entry in sys.path if isinstance(entry, str)]
    parts = module_name.split(".")
    for depth, part in enumerate(parts, start=1):
        module = sys.modules.get(".".join(parts[:depth]))
        if module is not None:
            here = [getattr(module, "__file__", None), *list(getattr(module, "__path__", None) or [])]
            found += [Path(os.path.abspath(p)) for p in here if isinstance(p, str)]
            search = [
                os.path.abspath(p) for p in getattr(module, "__path__", None) or [] if isinstance(p, str)
            ]
            continue
        folders = [os.path.join(d, part) for d in search if os.path.isdir(os.path.join(d, part))]
        files = [
            os.path.join(d, part + s)
            for d in search
            for s in _SUFFIXES
            if os.path.isfile(os.path.join(d, part + s))
        ]
        found += [Path(p) for p in (*folders, *files)]
        search = folders
    return found


def run_folder_holding(path: Path) -> Path | None:
    """The run folder ``path`` lies in (itself or an ancestor holding a plan and an env, log or lock), or None."""
    for folder in [path, *path.parents]:
        if (folder / RUN_FOLDER_MARK).exists() and any((folder / name).exists() for name in RUN_FOLDER_FILES):
            return folder
    return None


def run_folder_code(module_name: str) -> str | None:
    """Why importing ``module_name`` would run code from a run folder (None where it would not)."""
    for location in import_locations(module_name):
        folder = run_folder_holding(location)
        if folder is not None:
            return f"it would import {location.name} from the run folder {folder.name}: a run folder is data, not code"
    return None


def source_sha256(path: str | os.PathLike[str] | None) -> str | None:
    """The SHA-256 of a source file's bytes (None where there is no readable file)."""
    if not path:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def class_fingerprint(cls: type | None) -> dict[str, Any] | None:
    """What a plan records of an arm's class: its qualified name and the SHA-256 of its source file."""
    if cls is None:
        return None
    try:
        source = inspect.getsourcefile(cls)
    except TypeError:  # a built-in class has no source file
        source = None
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "sha256": source_sha256(source)}
