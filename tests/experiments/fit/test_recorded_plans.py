"""A fit plan read back: the first plan format still reads, a missing setting is named."""

from __future__ import annotations

from dataclasses import replace

from experiments.fit.plan import FitSettings, make_plan
from experiments.fit.recorded import recorded_settings_problem
from harness.options import protocol_options

PLAN = make_plan(protocol_options(device="cpu"), FitSettings(workload="embedded"))
LATER = ("data", "data_cache", "trial_timeout", "keep_checkpoints", "torchrun")  # not in the first format


def _problem(settings: dict) -> str | None:
    return recorded_settings_problem(replace(PLAN, settings=settings))


def test_a_fit_plan_of_the_first_format_still_reads() -> None:
    first = {k: v for k, v in PLAN.settings.items() if k not in LATER}
    assert _problem(PLAN.settings) is None
    assert _problem({**first, "data_root": "runs/datasets", "trial_timeout_s": 3600}) is None


def test_a_fit_plan_without_a_recorded_setting_names_it() -> None:
    for name in ("workers", "stages", "imgsz"):
        problem = _problem({k: v for k, v in PLAN.settings.items() if k != name})
        assert problem == f"settings has no {name} (what a plan of this tier records)"
    problem = _problem({**PLAN.settings, "torchrun": 3})
    assert problem is not None and "torchrun" in problem
