"""``bench pair``: complete paired fits, or with ``--stages`` the stage-attribution diagnostic."""

from __future__ import annotations

from dataclasses import replace

from experiments.fit import PAIR, STAGES
from experiments.fit.plan import FitSettings, check_data_cache_used
from harness.tier import CommandSpec, Start


def _prepare(start: Start) -> Start:
    settings = start.settings
    if settings.data_cache is not None:
        check_data_cache_used(settings.workload, settings.data)
    settings = replace(settings, data_cache=settings.data_cache or str(start.out / "datasets"))
    return replace(start, tier="stages" if settings.stages else "pair", settings=settings)


COMMAND = CommandSpec(
    "pair",
    "Complete paired fits (the decisive tier): `bench pair --steps 384`.",
    tiers=(PAIR, STAGES),
    settings=FitSettings,
    prepare=_prepare,
)
