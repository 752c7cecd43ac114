"""Your own training command as a tier (``bench command --arms a,b -- python train.py --opt {arm}``).

Each trial runs the command in a fresh process, with ``{arm}`` replaced by the arm's spec and ``{label}`` by
its label. The figure is the command's wall time, or with ``--figure REGEX`` the number its output prints
(the regex's first group, its last match). The protocol is every tier's: orders (duet too), warm-ups, the
A/A control, telemetry, placement, stop and resume, the gate.
"""

from __future__ import annotations

from experiments.command.plan import CommandSettings, make_plan, recorded_settings_problem
from experiments.command.trial import trial_function
from harness.tier import BaseTier, Caveat

TIER = BaseTier(
    "command",
    make_plan=make_plan,
    trial_function=trial_function,
    settings_problem=recorded_settings_problem,
    caveats=(
        Caveat("your command's own figure: the harness times the whole process, or reads what it prints."),
    ),
)

__all__ = ["TIER", "CommandSettings"]
