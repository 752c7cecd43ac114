"""Each tier's check of the settings a plan records: an edited value no run can have is one line."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from experiments.tiers import TIERS
from harness import cli, schema
from harness.errors import InputError
from harness.tables import CorruptRunFolder, RunFolder
from harness.tier import Run
from tests.runfolders import TIER_FOLDERS, copy_run, corrupt_plan, set_field

EDITED_SETTINGS = {
    "screen: steps negative": ("screen", set_field("settings.steps", -1), "--steps must be a positive"),
    "screen: a dtype it has not": ("screen", set_field("settings.dtype", "float8"), "--dtype 'float8'"),
    "screen: a scale it has not": ("screen", set_field("settings.scales", ["q"]), "--scales 'q'"),
    "screen: scales not its cases": ("screen", set_field("settings.scales", ["n"]), "settings.scales"),
    "screen: no settings": ("screen", set_field("settings", {}), "settings has no scales"),
    "screen: called a pair": ("screen", set_field("tier", "pair"), "settings has no workload"),
    "screen: called a probe": ("screen", set_field("tier", "probe"), "settings has no head"),
    "pair: steps negative": ("pair", set_field("settings.steps", -1), "--steps must be a positive"),
    "pair: an amp it has not": ("pair", set_field("settings.amp", "float8"), "--amp 'float8'"),
    "pair: no batch": ("pair", set_field("settings.batch", 0), "--batch must be a positive"),
    "pair: no settings": ("pair", set_field("settings", {}), "settings has no workload"),
    "pair: steps not its epochs": (
        "pair",
        set_field("settings.steps", 100),
        "--steps 100 is not a whole number",
    ),
    "pair: called stages": ("pair", set_field("tier", "stages"), "settings.stages is false"),
    "pair: called a screen": ("pair", set_field("tier", "screen"), "settings has no scales"),
    "pair: called parity": ("pair", set_field("tier", "parity"), "settings has no scale"),
    "stages: called a pair": ("stages", set_field("tier", "pair"), "settings.stages is true"),
    "parity: a scale it has not": ("parity", set_field("settings.scale", "q"), "--scale 'q'"),
    "parity: no steps": ("parity", set_field("settings.steps", 0), "--steps must be a positive"),
    "parity: called a probe": ("parity", set_field("tier", "probe"), "settings has no head"),
    "probe: a head it has not": ("probe", set_field("settings.head", "eye"), "--head 'eye'"),
    "probe: a variant it has not": ("probe", set_field("settings.variants", ["wide"]), "--variants 'wide'"),
    "probe: a learner time negative": ("probe", set_field("settings.learner_ms", -1.0), "--learner-ms -1.0"),
    "probe: a reserve negative": ("probe", set_field("settings.reserve_bytes", -1), "settings.reserve_bytes"),
}


@pytest.mark.parametrize("case", list(EDITED_SETTINGS))
def test_a_plan_whose_tier_settings_no_run_can_have_is_one_line(tmp_path: Path, bench, case: str) -> None:
    """A plan.json whose tier or tier settings no run could have is one line, by that tier's own option
    checks.

    Report and resume refuse it before reading, and nothing is written.
    """
    tier, how, fragment = EDITED_SETTINGS[case]
    folder = copy_run(RunFolder(TIER_FOLDERS[tier]), tmp_path / "run")
    corrupt_plan(folder, how)
    before = {p.name: p.read_bytes() for p in folder.path.iterdir() if p.is_file()}
    bench.refused(["report", str(folder.path), "-o", str(tmp_path / "r.md")], "plan.json", fragment)
    if tier == "screen":
        bench.refused(["screen", "--resume", str(folder.path)], "plan.json", fragment)
    with pytest.raises(CorruptRunFolder, match=re.escape(fragment)):
        Run.load(folder, tiers=TIERS)
    assert {p.name: p.read_bytes() for p in folder.path.iterdir() if p.is_file()} == before
    assert not (tmp_path / "r.md").exists()


# A command line of each tier, and a field only its settings declare.
NEW_RUNS = {
    "screen": (["screen", "--scales", "n"], "guards"),
    "probe": (["probe", "--head", "lm"], "head"),
    "pair": (["pair", "--workload", "embedded"], "workload"),
    "parity": (["parity"], "scale"),
    "command": (["command", "--arms", "a,b", "--", "true", "{arm}"], "figure"),
}


@pytest.mark.parametrize("tier", list(NEW_RUNS))
def test_a_new_run_checks_its_settings_once(tmp_path: Path, monkeypatch, bench, tier: str) -> None:
    """The settings' one check runs once, before anything prints; the plan is built from checked settings."""
    argv, field = NEW_RUNS[tier]
    checked: list[str] = []
    check_value = schema.check_value
    monkeypatch.setattr(
        schema, "check_value", lambda name, *rest: checked.append(name) or check_value(name, *rest)
    )
    monkeypatch.setattr(cli.calibration, "check_plan", _stop)  # the plan made, nothing run
    bench.refused([*argv[:1], "--device", "cpu", "--out", str(tmp_path), *argv[1:]], "the plan is made")
    assert checked.count(field) == 1, checked


def _stop(plan: object) -> None:
    raise InputError("the plan is made")


BAD_SETTINGS = {
    "screen": ["screen", "--steps", "0"],
    "probe": ["probe", "--learner-ms", "-1"],
    "pair": ["pair", "--batch", "0"],
    "parity": ["parity", "--steps", "0"],
    "command": ["command", "--arms", "a,b", "--timeout", "0", "--", "true"],
}


@pytest.mark.parametrize("tier", list(BAD_SETTINGS))
def test_a_bad_setting_is_one_line_before_anything_prints(tmp_path: Path, bench, tier: str) -> None:
    argv, out = BAD_SETTINGS[tier], tmp_path / "runs"
    ran = bench([*argv[:1], "--device", "cpu", "--out", str(out), *argv[1:]])
    assert (ran.status, ran.out, len(ran.err.splitlines())) == (2, "", 1) and not out.exists(), ran


@pytest.mark.skipif(shutil.which("true") is None, reason="needs the true command")
def test_a_command_resume_reads_the_command_of_a_checked_plan_only(tmp_path: Path, bench) -> None:
    """An edited command is refused as the folder's fault, not echoed back as the command to give again."""
    argv = ["command", "--arms", "a,b", "--pairs", "1", "--warmup", "0", "--device", "cpu", "--quiet"]
    assert bench([*argv, "--no-report", "--out", str(tmp_path), "--", "true", "{arm}"]).status == 0
    (path,) = tmp_path.iterdir()
    corrupt_plan(RunFolder(path), set_field("settings.argv", "true a"))
    bench.refused(["command", "--resume", str(path)], "plan.json", "argv")
