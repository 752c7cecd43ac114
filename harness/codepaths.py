"""What each arm ran, as its plan records it (``Plan.arm_code``).

A candidate running the baseline's code is an A/A in effect: its verdicts are withheld (docs/run-folder.md).
"""

from __future__ import annotations

from typing import Any

WITHHELD = "withheld"


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
