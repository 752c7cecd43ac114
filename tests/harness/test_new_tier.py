"""A tier declared outside ``harness/`` brings its own ``bench`` command: registered, it shows and runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from experiments import tiers
from harness import protocol, schedule
from harness.cli import main
from harness.plan import Plan
from harness.schedule import Case, build_schedule
from harness.schema import option
from harness.tier import BaseTier, CommandSpec, Start, TierRegistry


@dataclass(frozen=True)
class ToySettings:
    size: int = option(3, "How large the toy's one case is.", low=1)


def _make_plan(options, settings: ToySettings, command: str) -> Plan:
    case = Case("only", {"size": settings.size}, options.arms)
    return Plan("toy", options, [case], "s", "figure", command=command)


def _prepare(start: Start) -> Start:
    start.say(f"toy: size {start.settings.size}")
    return start


TOY = CommandSpec(
    "toy",
    "A toy tier: a figure per trial, from a test.",
    tiers=(BaseTier("toy", make_plan=_make_plan, trial_function=lambda plan: lambda ctx: {"value": 1.0}),),
    settings=ToySettings,
    prepare=_prepare,
)


@pytest.fixture
def with_toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy registered as a new tier is: one more entry in ``experiments.tiers``."""
    monkeypatch.setattr(tiers, "TIERS", TierRegistry(commands=[*tiers.TIERS.commands(), TOY]))
    monkeypatch.setattr(protocol, "_release_device_memory", lambda: None)


def test_a_new_tier_command_shows_in_help_and_runs(with_toy, tmp_path: Path, capsys) -> None:
    assert main(["--help"]) == 0
    assert "toy" in capsys.readouterr().out
    assert main(["toy", "--help"]) == 0
    assert "How large the toy's one case is." in capsys.readouterr().out
    given = ["--arms", "baseline,candidate", "--warmup", "0", "--pairs", "2", "--device", "cpu"]
    given += ["--cpus", "none", "--order", "alternate", "--quiet", "--no-report", "--out", str(tmp_path)]
    assert main(["toy", *given, "--size", "5"]) == 0
    assert "toy: size 5" in capsys.readouterr().out
    (folder,) = tmp_path.iterdir()
    plan = json.loads((folder / "plan.json").read_text())
    assert (plan["tier"], plan["cases"][0]["params"]) == ("toy", {"size": 5})


def test_a_new_tier_option_is_checked_by_its_declaration(with_toy, tmp_path: Path, capsys) -> None:
    assert main(["toy", "--size", "0", "--device", "cpu", "--out", str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line == "bench: error: --size must be a positive whole number (got 0)"
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_a_new_tier_resumes_only_its_own_runs(with_toy, tmp_path: Path, capsys) -> None:
    start = ["--arms", "baseline,candidate", "--warmup", "0", "--pairs", "2", "--device", "cpu", "--quiet"]
    start += ["--cpus", "none", "--order", "alternate", "--no-report", "--out", str(tmp_path)]
    assert main(["toy", *start]) == 0
    (folder,) = tmp_path.iterdir()
    assert main(["screen", "--resume", str(folder)]) == 2
    assert "is a 'toy' run" in capsys.readouterr().err
    assert main(["toy", "--resume", str(folder), "--quiet", "--no-report"]) == 0


def test_a_misspelt_hook_is_refused_as_a_keyword_or_a_method() -> None:
    with pytest.raises(TypeError, match="no hook named setings_problem"):
        BaseTier("typo", setings_problem=lambda plan: None)
    with pytest.raises(TypeError, match="no hook named setings_problem"):

        class Misspelt(BaseTier):
            def setings_problem(self, plan: Plan) -> str | None:
                return "never called"


def test_a_new_run_makes_its_plan_once_when_its_order_is_chosen(
    with_toy, tmp_path: Path, monkeypatch
) -> None:
    """The order chosen for a run given no --order reorders the plan's schedule; the tier's plan (its checks,
    its console lines) is not made again."""
    made: list[str] = []
    monkeypatch.setattr(TOY.tiers[0], "make_plan", lambda *args: made.append("plan") or _make_plan(*args))
    monkeypatch.setattr(schedule, "default_order", lambda plan, cores: schedule.Choice("abba", "order: abba"))
    given = [
        "--arms",
        "baseline,candidate",
        "--warmup",
        "0",
        "--pairs",
        "4",
        "--device",
        "cpu",
        "--cpus",
        "none",
    ]
    assert main(["toy", *given, "--quiet", "--no-report", "--out", str(tmp_path)]) == 0
    (folder,) = tmp_path.iterdir()
    plan = Plan.from_json(json.loads((folder / "plan.json").read_text()))
    assert made == ["plan"] and plan.protocol.order == "abba"
    assert [t.arm for t in plan.schedule] == [t.arm for t in build_schedule(plan.cases, 0, 4, "abba", 0)]
