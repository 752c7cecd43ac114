"""The code each arm ran: where an import would load it from, its fingerprint, and what the plan records.

A candidate running the baseline's code is an A/A in effect: its verdicts are withheld (docs/run-folder.md).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import inspect
import os
import sys
from pathlib import Path
from typing import Any

WITHHELD = "withheld"
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


def arm_files(plan: Any) -> list[str]:
    """The files of the arms' own modules, as the plan records them (what the environment record fingerprints)."""
    return [str(entry["file"]) for entry in plan.arm_code.values() if entry.get("file")]


def control_arm(plan: Any) -> str | None:
    """The A/A control's arm (``<first>-control``, the baseline again by design), or None without ``--control``."""
    arms = plan.protocol.arms
    return f"{arms[0].label}-control" if plan.protocol.control and arms else None


def same_code_arms(plan: Any) -> dict[str, str]:
    """Arm label → why it ran the baseline's code, for each compared arm but the A/A control."""
    control = control_arm(plan)
    return {
        label: str(entry["same_path_as_baseline"])
        for label, entry in plan.arm_code.items()
        if entry.get("same_path_as_baseline") and label != control
    }


def all_same_code(plan: Any) -> bool:
    """Whether every compared arm ran the baseline's code: the whole run is an A/A in effect."""
    same = same_code_arms(plan)
    compared = [label for label in list(plan.arm_code)[1:] if label != control_arm(plan)]
    return bool(compared) and all(label in same for label in compared)


def _grouped(plan: Any, labels: list[str]) -> str:
    """``a, b ran X; c ran Y``: labels that run the same thing are named together."""
    runs: dict[str, list[str]] = {}
    for label in labels:
        runs.setdefault(str(plan.arm_code[label].get("runs") or label), []).append(label)
    return "; ".join(f"{', '.join(names)} ran {text}" for text, names in runs.items())


def what_ran(plan: Any) -> str | None:
    """One sentence naming what the arms ran on the plan's device, and any A/A in effect."""
    if not plan.arm_code:
        return None
    device = plan.protocol.device
    control = control_arm(plan)
    labels = [label for label in plan.arm_code if label != control]
    if control is not None and len(labels) <= 1:
        return f"A/A control on {device}: {_grouped(plan, labels[:1])}, against itself."
    beside = f" (and {control}, the A/A control, ran it again)" if control is not None else ""
    same = same_code_arms(plan)
    if not same:
        return f"On {device}: {_grouped(plan, labels)}{beside}."
    reasons = "; ".join(dict.fromkeys(same.values()))
    if all_same_code(plan):
        return (
            f"An A/A in effect on {device}: every compared arm ran the baseline's code, because {reasons}; the "
            "differences are noise, not a speed-up, and no verdict or conclusion is drawn."
        )
    others = [label for label in labels if label not in same]
    return (
        f"Partly an A/A in effect on {device}: {', '.join(same)} ran the baseline's code, because {reasons}, so "
        f"their verdicts and conclusions are withheld; {_grouped(plan, others)}{beside}."
    )


def verdict_shown(plan: Any, arm: str, verdict: str) -> str:
    """The verdict as shown for one arm's claim: withheld where that arm ran the baseline's code."""
    return WITHHELD if arm in same_code_arms(plan) else verdict
