"""The project's tiers, each with its ``bench`` command, registered in one place."""

from __future__ import annotations

from experiments import parity_command
from experiments.command import command
from experiments.fit import command as fit
from experiments.probe import command as probe
from experiments.screen import command as screen
from harness.tier import TierRegistry

TIERS = TierRegistry(
    commands=[fit.COMMAND, screen.COMMAND, command.COMMAND, probe.COMMAND, parity_command.COMMAND]
)
