"""The command line: help for every command, the environment command, and one-line bad-input errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import options
from harness.cli import app, main

COMMANDS = ("env", "pair", "screen", "probe", "parity", "report")
ROOT = Path(__file__).resolve().parent.parent


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


def test_unknown_command_is_exit_2() -> None:
    result = run_bench("benchmark-everything")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pairs": 0}, "--pairs must be a positive whole number"),
        ({"warmup": -1}, "--warmup must be zero or more"),
        ({"order": "zigzag"}, "--order 'zigzag' is not accepted; use one of: alternate, random"),
        ({"device": "tpu"}, "use auto, cpu, cuda or cuda:N"),
        ({"budget": "lots"}, "e.g. 24GiB"),
        ({"arms": "baseline"}, "names one arm"),
        ({"arms": "baseline,,candidate"}, "no empty items"),
        ({"arms": "baseline,baseline"}, "names an arm twice"),
        ({"bar": 250.0}, "between -100 and 100"),
        (
            {"bar": -1.0, "control": True},
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
    with pytest.raises(options.InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        options.protocol_options(**values)


def test_cuda_where_there_is_none(monkeypatch) -> None:
    monkeypatch.setattr(options.torch.cuda, "is_available", lambda: False)
    with pytest.raises(options.InputError, match="no CUDA device is available here"):
        options.check_device("cuda")
    with pytest.raises(options.InputError, match="needs a CUDA device"):
        options.protocol_options("baseline,candidate", 1, 2, "alternate", 0, 8.0, "cpu", "24GiB", False)


def test_control_runs_the_first_arm_against_itself() -> None:
    parsed = options.protocol_options("candidate", 0, 1, "alternate", 0, None, "cpu", None, True)
    assert [(a.label, a.role, a.spec) for a in parsed.arms] == [
        ("candidate", "baseline", "candidate"),
        ("candidate-control", "candidate", "candidate"),
    ]


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
    with pytest.raises(options.InputError, match="exceeds the card's 140.40 GiB"):
        options.protocol_options("baseline,candidate", 1, 2, "alternate", 0, None, "cuda:0", "200GiB", False)
    parsed = options.protocol_options(
        "baseline,candidate", 1, 2, "alternate", 0, None, "cuda:0", "24GiB", False
    )
    assert parsed.budget == 24 * 2**30
