"""The command line: help for every command, the environment command, and one-line bad-input errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import options
from harness.cli import app, main
from harness.errors import InputError
from tests import ROOT

COMMANDS = ("env", "pair", "screen", "probe", "parity", "report", "plan")


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_help_lists_every_command() -> None:
    result = run_bench("--help")
    assert result.returncode == 0
    for command in COMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys) -> None:
    assert main([command, "--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_registered_commands_match() -> None:
    import typer

    names = set(typer.main.get_command(app).commands)
    assert set(COMMANDS) <= names


def test_env_json(capsys) -> None:
    assert main(["env", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {"torch", "python", "gpu_count", "git_revision"} <= set(record)


def test_unknown_option_is_one_line_and_exit_2() -> None:
    result = run_bench("env", "--bogus")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--bogus" in result.stderr


@pytest.mark.parametrize(
    "given, named",
    [
        (["pair", "--steps", "4", "--steps", "8"], "--steps given twice (4, then 8)"),
        (["pair", "--steps=4", "--device", "cpu", "--steps", "4"], "--steps given twice (4, then 4)"),
        (["pair", "--control", "--control"], "--control given twice"),
        (["report", "run", "-o", "a.md", "--output", "b.md"], "-o/--output given twice (a.md, then b.md)"),
    ],
)
def test_an_option_given_twice_is_refused_in_one_line(given: list[str], named: str, tmp_path, capsys) -> None:
    """Click takes the last of an option given twice and says nothing: `--steps 4 … --steps 8` ran 8 steps
    from a command line that reads 4 at a glance."""
    if given[0] == "pair":
        given = [*given, "--out", str(tmp_path)]
    assert main(given) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and named in error and "give it once" in error, error
    assert list(tmp_path.iterdir()) == []


def test_an_option_value_that_reads_like_an_option_is_not_an_option(capsys) -> None:
    """``--arms --control`` is --arms with the value '--control' (refused as an arm), not --control twice."""
    assert main(["pair", "--arms", "--control", "--control"]) == 2
    assert "given twice" not in capsys.readouterr().err


def test_unknown_command_is_exit_2() -> None:
    result = run_bench("benchmark-everything")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pairs": 0}, "--pairs must be a positive whole number"),
        ({"warmup": -1}, "--warmup must be zero or more"),
        ({"order": "zigzag"}, "--order 'zigzag' is not accepted; use one of: alternate, abba, random"),
        ({"pairs": "many"}, "--pairs 'many' is not a number; use a positive whole number or auto"),
        ({"pairs": "auto"}, "--pairs auto needs --precision P"),
        ({"pairs": "auto", "precision": -1.0}, "--precision must be a positive half-width"),
        ({"pairs": "auto", "precision": 2.0, "max_pairs": 4}, "--max-pairs 4 is below the first look at 6"),
        ({"pairs": "auto", "precision": 2.0, "time_budget": 0.0}, "--time-budget must be a positive number"),
        ({"precision": 2.0}, "--precision only applies with --pairs auto"),
        ({"time_budget": 60.0, "max_pairs": 30}, "--max-pairs only applies with --pairs auto"),
        ({"tolerance": 1.0}, "--tolerance judges the A/A arm; add --control"),
        ({"tolerance": 0.0, "control": True}, "--tolerance 0.0 is not a positive percentage"),
        ({"arms": "baseline,baseline-control", "control": True}, "already names 'baseline-control'"),
        ({"device": "tpu"}, "use auto, cpu, cuda or cuda:N"),
        ({"budget": "lots"}, "e.g. 24GiB"),
        ({"arms": "baseline"}, "names one arm"),
        ({"arms": "baseline,,candidate"}, "no empty items"),
        ({"arms": "baseline,baseline"}, "names an arm twice"),
        ({"bar": 250.0}, "between -100 and 100"),
        (
            {"arms": "baseline", "bar": -1.0, "control": True},
            "--bar -1.0 with --control is the A/A tolerance ±bar; use a positive",
        ),
    ],
)
def test_protocol_options_refuse_bad_values(kwargs: dict, message: str) -> None:
    values = dict(
        arms="baseline,candidate",
        warmup=1,
        pairs=2,
        order="alternate",
        seed=0,
        bar=8.0,
        device="cpu",
        budget=None,
        control=False,
    )
    values.update(kwargs)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        options.protocol_options(**values)


def test_cuda_where_there_is_none(monkeypatch) -> None:
    monkeypatch.setattr(options.torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="no CUDA device is available here"):
        options.check_device("cuda")
    with pytest.raises(InputError, match="needs a CUDA device"):
        options.protocol_options("baseline,candidate", 1, 2, "alternate", 0, 8.0, "cpu", "24GiB", False)


def test_a_device_number_is_ascii_digits() -> None:
    """`--device cuda:٠` (an Arabic-Indic zero) is refused: device numbers are ASCII, as `--cpus` core numbers
    are.
    """
    for device in ("cuda:\u0660", "cuda:\uff10"):
        with pytest.raises(InputError, match="is not a device; use auto, cpu, cuda or cuda:N"):
            options.check_device(device)
    assert options.split_device_list("cuda:\u0660,\u0661", 1) == ("cuda:\u0660,\u0661", 1)


def test_control_runs_the_first_arm_against_itself() -> None:
    parsed = options.protocol_options("candidate", 0, 1, "alternate", 0, None, "cpu", None, True)
    assert [(a.label, a.role, a.spec) for a in parsed.arms] == [
        ("candidate", "baseline", "candidate"),
        ("candidate-control", "candidate", "candidate"),
    ]


def test_control_beside_two_arms_adds_the_aa_arm_to_the_same_schedule() -> None:
    """`--control` with a claim's arms keeps them and adds the first arm again.

    One schedule holds the claim and its noise floor; every round runs all three, in Latin-square order.
    """
    parsed = options.protocol_options(
        "baseline,candidate", 0, 6, "alternate", 0, 8.0, "cpu", None, True, tolerance=1.0
    )
    assert [(a.label, a.role, a.spec) for a in parsed.arms] == [
        ("baseline", "baseline", "baseline"),
        ("candidate", "candidate", "candidate"),
        ("baseline-control", "candidate", "baseline"),
    ]
    assert parsed.bar == 8.0 and parsed.tolerance == 1.0
    from harness.schedule import Case, build_schedule

    schedule = build_schedule([Case("c", {}, parsed.arms)], 0, parsed.pairs)
    for r in range(6):
        assert sorted(t.arm for t in schedule if t.round == r) == [
            "baseline",
            "baseline-control",
            "candidate",
        ]


def test_pairs_auto_is_parsed_with_its_rule() -> None:
    parsed = options.protocol_options(
        "baseline,candidate", 0, "auto", "alternate", 0, 8.0, "cpu", None, False, precision=2.0, max_pairs=30
    )
    assert parsed.auto and parsed.initial_pairs == 6 and parsed.max_pairs == 30
    assert (
        options.protocol_options("baseline,candidate", 0, "8", "abba", 0, None, "cpu", None, False).pairs == 8
    )


def test_negative_seed_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    assert main(["probe", "--seed", "-1", "--device", "cpu", "--out", str(tmp_path / "runs")]) == 2
    assert "--seed must be zero or more" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_resume_refuses_another_tiers_run_folder(tmp_path: Path, capsys) -> None:
    from tests.trialfns import plan_of, runner

    folder = runner(tmp_path).start(plan_of("sleepy", warmup=0, pairs=1)).folder
    before = sorted(p.name for p in folder.path.iterdir())
    assert main(["screen", "--resume", str(folder.path)]) == 2
    assert "is a 'test' run" in capsys.readouterr().err
    assert sorted(p.name for p in folder.path.iterdir()) == before


def test_a_budget_larger_than_the_card_is_refused_without_touching_the_gpu(monkeypatch) -> None:
    """Every tier (the fit's parent too) refuses it up front; the card's size comes from nvidia-smi."""
    monkeypatch.setattr(options, "check_device", lambda device: device)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(options, "gpu_snapshot", lambda: [{"index": 0, "memory_total_mib": 143771.0}])
    monkeypatch.setattr(
        options.torch.cuda, "get_device_properties", lambda i: pytest.fail("created a CUDA context")
    )
    with pytest.raises(InputError, match="exceeds the card's 140.40 GiB"):
        options.protocol_options("baseline,candidate", 1, 2, "alternate", 0, None, "cuda:0", "200GiB", False)
    parsed = options.protocol_options(
        "baseline,candidate", 1, 2, "alternate", 0, None, "cuda:0", "24GiB", False
    )
    assert parsed.budget == 24 * 2**30


def gated_registry(figures: dict[str, list[float]], diagnostic: bool = False, same_code: bool = False):
    """A tier whose trials return ``figures[arm][round]``: what the gate reads, without a real workload;
    ``same_code``: its plan records that the candidate ran the baseline's code (an A/A in effect)."""
    from harness.plan import Plan
    from harness.schedule import Case
    from harness.tier import BaseTier, TierRegistry

    def make_plan(protocol, settings, command):
        arm_code = {
            "baseline": {"spec": "baseline", "runs": "the baseline", "same_path_as_baseline": None},
            "candidate": {"spec": "candidate", "runs": "the baseline", "same_path_as_baseline": "on the CPU"},
        }
        return Plan(
            "gated",
            protocol,
            [Case("only", {}, protocol.arms)],
            "s",
            "figure",
            command=command,
            arm_code=arm_code if same_code else {},
        )

    def trial_function(plan):
        return lambda ctx: {"value": figures[ctx.arm.label][ctx.trial.round % len(figures[ctx.arm.label])]}

    tier = BaseTier("gated", make_plan=make_plan, trial_function=trial_function, diagnostic=diagnostic)
    return TierRegistry([tier])


def gate(tmp_path: Path, monkeypatch, figures: dict, gate: bool = True, **given) -> int:
    """The exit status ``launch`` gives a run of the gated tier (0 when it returns)."""
    import typer

    from harness import cli
    from harness import protocol as protocol_module

    diagnostic, same_code = given.pop("diagnostic", False), given.pop("same_code", False)
    monkeypatch.setattr(cli, "registry", lambda: gated_registry(figures, diagnostic, same_code))
    monkeypatch.setattr(protocol_module, "_release_device_memory", lambda: None)  # 0.2 s of gc per trial
    protocol = dict(arms="baseline,candidate", warmup=0, device="cpu", **given)
    run = cli.RunArgs(resume=None, out=tmp_path, stop_after=None, quiet=True, gate=gate, no_report=True)
    try:
        cli.launch("gated", protocol, None, run, accepts=("gated",))
    except typer.Exit as exc:
        return exc.exit_code
    return 0


FASTER = {"baseline": [10.0, 10.1, 9.9], "candidate": [8.0, 8.05, 7.9, 8.1], "baseline-control": [10.0, 9.95]}


def test_the_gate_passes_a_claim_that_clears_and_a_control_within(tmp_path: Path, monkeypatch) -> None:
    assert gate(tmp_path, monkeypatch, FASTER, pairs=32, bar=8.0) == 0
    both = dict(pairs=32, bar=8.0, control=True, tolerance=5.0)
    assert gate(tmp_path, monkeypatch, FASTER, **both) == 0


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ({"pairs": 32, "bar": 30.0}, "candidate vs baseline (claim): fails"),
        ({"pairs": 4, "bar": 8.0}, "candidate vs baseline (claim): insufficient"),
        ({"pairs": 32, "bar": 20.0}, "candidate vs baseline (claim): ambiguous"),
        (
            {"pairs": 32, "bar": 8.0, "control": True, "tolerance": 0.1},
            "baseline-control vs baseline (control)",
        ),
    ],
)
def test_the_gate_exits_1_when_a_claim_or_control_does_not_pass(
    tmp_path: Path, monkeypatch, capsys, given: dict, why: str
) -> None:
    assert gate(tmp_path, monkeypatch, FASTER, **given) == 1
    assert why in capsys.readouterr().err
    assert gate(tmp_path, monkeypatch, FASTER, gate=False, **given) == 0  # without --gate the status stays 0


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ({"pairs": 2}, "--gate judges each claim against --bar, and the run has none"),
        ({"pairs": 2, "bar": 8.0, "control": True}, "--gate judges the A/A arm against --tolerance"),
    ],
)
def test_the_gate_without_its_threshold_is_refused_before_the_run(
    tmp_path: Path, monkeypatch, given: dict, why: str
) -> None:
    """A gate with no bar to judge against is refused first, when the run starts and when it is resumed."""
    import typer

    from harness import cli

    with pytest.raises(InputError, match=re.escape(why)):
        gate(tmp_path / "new", monkeypatch, FASTER, **given)
    assert not (tmp_path / "new").exists() or not list((tmp_path / "new").iterdir())
    assert gate(tmp_path / "old", monkeypatch, FASTER, gate=False, **given) == 0
    (folder,) = list((tmp_path / "old").iterdir())
    before = (folder / "trials.jsonl").read_bytes()
    run = cli.RunArgs(resume=folder, out=tmp_path, stop_after=None, quiet=True, gate=True, no_report=True)
    with pytest.raises(InputError, match=re.escape(why)):
        try:
            cli.launch("gated", None, None, run, accepts=("gated",))
        except typer.Exit as exc:  # the gate ran to its end instead
            pytest.fail(f"the gate ran the resume and exited {exc.exit_code}")
    assert (folder / "trials.jsonl").read_bytes() == before


def test_the_gate_fails_a_claim_whose_verdict_is_withheld(tmp_path: Path, monkeypatch, capsys) -> None:
    """The gate fails a claim whose verdict is withheld: a candidate that ran the baseline's code, an A/A in
    effect.
    """
    assert gate(tmp_path, monkeypatch, FASTER, pairs=32, bar=8.0, same_code=True) == 1
    assert "candidate vs baseline (claim): withheld" in capsys.readouterr().err


def test_bench_plan_refuses_a_goal_it_cannot_plan_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """A --tolerance for a run with no A/A arm, or an effect at its bar, is refused in one line, exit 2."""
    assert gate(tmp_path, monkeypatch, FASTER, gate=False, pairs=6, bar=8.0) == 0
    (folder,) = list(tmp_path.iterdir())
    for command, fragment in (
        (["--tolerance", "1%"], "--tolerance 1% plans an A/A arm, and the run has none"),
        (["--effect", "5%", "--bar", "5%"], "--effect 5% is at the bar (5.0%)"),
        (["--effect", "0%"], "--effect 0% is at the bar (0.0%)"),
    ):
        capsys.readouterr()
        assert main(["plan", str(folder), *command]) == 2, command
        err = capsys.readouterr().err.strip()
        assert fragment in err and "\n" not in err, err


def test_bench_plan_power_is_a_planning_probability_shown_as_given(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """A power below a coin flip or past 0.999 is refused in one line; one inside prints its decimals."""
    assert gate(tmp_path, monkeypatch, FASTER, gate=False, pairs=6, bar=8.0) == 0
    (folder,) = list(tmp_path.iterdir())
    for power in ("1e-300", "0.4", "0.9999"):
        capsys.readouterr()
        assert main(["plan", str(folder), "--effect", "12%", "--power", power]) == 2, power
        err = capsys.readouterr().err.strip()
        assert f"--power {float(power)}" in err and "0.5" in err and "\n" not in err, err
    capsys.readouterr()
    assert main(["plan", str(folder), "--effect", "12%", "--power", "0.995"]) == 0
    assert "with 99.5% power" in capsys.readouterr().out


def test_the_gate_refuses_a_diagnostic_tier(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(InputError, match="--gate judges claims"):
        gate(tmp_path, monkeypatch, FASTER, pairs=2, diagnostic=True)
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_bench_plan_prints_pairs_and_time_from_a_run(tmp_path: Path, monkeypatch, capsys) -> None:
    assert gate(tmp_path, monkeypatch, FASTER, gate=False, pairs=6, bar=8.0, control=True, tolerance=1.0) == 0
    (folder,) = list(tmp_path.iterdir())
    capsys.readouterr()
    assert main(["plan", str(folder), "--effect", "3%", "--tolerance", "1%"]) == 0
    out = capsys.readouterr().out
    # the effect against 0 (the run's bar is 8%: planned against it, a 3% effect read as a loss to resolve)
    assert "candidate vs baseline: run " in out and "resolve a 3.0% reduction against 0.0%" in out
    assert "baseline-control vs baseline: run " in out and "within +/-1.0%" in out
    assert "at σ's upper bound" in out
    assert main(["plan", str(folder), "--effect", "lots"]) == 2
    assert main(["plan", str(tmp_path / "missing")]) == 2


def test_the_committed_cli_reference_is_the_generated_one() -> None:
    """docs/cli.md is rendered from the option declarations: `python -m harness.cli_doc > docs/cli.md`."""
    from harness.cli_doc import cli_reference

    assert (ROOT / "docs" / "cli.md").read_text() == cli_reference()


@pytest.mark.parametrize(
    ("field", "value", "typed", "why"),
    [
        (
            "cooldown",
            4000.0,
            ["--cooldown", "4000"],
            "--cooldown 4000.0 is more than 3600, the most a run can take",
        ),
        ("gpus", 0, ["--gpus", "0"], "--gpus must be a positive whole number (got 0)"),
        ("order", "zigzag", ["--order", "zigzag"], "--order 'zigzag' is not accepted; use one of: alternate"),
    ],
)
def test_one_check_refuses_a_value_typed_and_a_value_in_a_resumed_plan(
    field: str, value, typed: list[str], why: str, capsys
) -> None:
    """The CLI and a plan read back (``check_protocol``) refuse a value out of its declared bounds alike."""
    from dataclasses import replace

    from harness.protocol_options import ProtocolOptions, check_protocol
    from harness.schedule import Arm
    from harness.schema import OptionError

    arms = (Arm("baseline", "baseline", "baseline"), Arm("candidate", "candidate", "candidate"))
    with pytest.raises(OptionError, match=re.escape(why)) as raised:
        check_protocol(replace(ProtocolOptions(arms), **{field: value}))
    assert raised.value.field == field
    assert main(["screen", "--device", "cpu", *typed]) == 2
    assert why in capsys.readouterr().err


def test_every_option_of_every_command_is_a_declared_settings_field() -> None:
    """Each option is declared once, as a field: no command keeps a hand-written option beside the schema."""
    import dataclasses

    import typer

    from harness import cli
    from harness.schema import declared, flag_of

    flags: set[str] = set()
    classes = [v for v in vars(cli).values() if dataclasses.is_dataclass(v) and isinstance(v, type)]
    for cls in [*classes, *(spec.settings for spec in cli.registry().commands() if spec.settings)]:
        for field, how, _ in declared(cls):
            flags |= {how.flag} if isinstance(how.flag, str) else set(how.flag or (flag_of(field.name),))
    for name, command in typer.main.get_command(app).commands.items():
        for param in command.params:
            if param.param_type_name == "option":
                assert set(param.opts) <= flags, f"bench {name} {param.opts}: not a declared field"


def test_bench_plan_checks_its_goal_with_the_schema_before_reading_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import PlanArgs
    from harness.schema import check_fields

    assert main(["plan", str(tmp_path / "absent"), "--power", "2"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("bench: error: --power 2.0 must be a probability from 0.5 to 0.999")
    with pytest.raises(InputError) as raised:
        check_fields(PlanArgs(power=2.0))
    assert line == f"bench: error: {raised.value}"
