"""The order a run takes when none is given, and the quantity each order estimates.

The rule, stated once: ``docs/methods.md`` (``harness/design.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CORES_PER_ARM = 4  # two arms: 8 worker cores
ESTIMANDS = {
    "duet": "the reduction with both arms running at once, each on its own share of the cores",
    "alternate": "the reduction with each arm alone on the machine, in alternating order",
    "abba": "the reduction with each arm alone on the machine, in ABBA order",
    "random": "the reduction with each arm alone on the machine, in seeded random order",
}


@dataclass(frozen=True)
class Choice:
    """The order chosen, and one line saying why."""

    order: str
    text: str


def default_order(plan: Any, worker_cores: int | None) -> Choice:
    """The order for a run given no ``--order``: duet where worker cores allow, else the default."""
    at_once = max((len(case.arms) for case in plan.cases), default=2)
    needed = CORES_PER_ARM * at_once
    if plan.in_process:
        why = f"the {plan.tier} tier's trials run in this process"
    elif plan.protocol.gpus > 1:
        why = "each trial spans several devices"
    elif worker_cores is None:
        why = "no CPU placement to share"
    elif worker_cores < needed:
        why = (
            f"{worker_cores} worker core{'s' * (worker_cores != 1)}; a duet of {at_once} arms wants {needed}"
        )
    else:
        return Choice("duet", f"order: duet ({worker_cores} worker cores); estimates {ESTIMANDS['duet']}")
    return Choice("alternate", f"order: alternate ({why}); estimates {ESTIMANDS['alternate']}")


def estimand(order: str) -> str:
    """What a run in ``order`` estimates, in words (the report names it)."""
    return ESTIMANDS.get(order, ESTIMANDS["alternate"])
