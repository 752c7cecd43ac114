"""The project's tiers, each with its ``bench`` command, registered in one place."""

from __future__ import annotations

from experiments import parity
from experiments.command import tier as command
from experiments.fit import tier as fit
from experiments.probe import tier as probe
from experiments.screen import tier as screen
from harness.tier import TierRegistry

TIERS = TierRegistry(commands=[fit.COMMAND, screen.COMMAND, command.COMMAND, probe.COMMAND, parity.COMMAND])
