"""Bringing one's own optimizer: arm specs with keyword arguments and labels, and the constructor mapping.

Also the one check before a run, what an arm's code is called, and its module found from the working
directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from experiments.arms import (
    ArmError,
    arm_code,
    checked_optimizer,
    make_optimizer,
    parse_spec,
    same_path_as_baseline,
    tiny_param_groups,
)
from harness.cli import main
from harness.errors import InputError
from harness.options import parse_arms
from harness.schedule import Case
from optimizers import MuSGD
from tests import child_env
from tests.argv import ONE_PAIR, TINY_FIT
from tests.runfolders import only_run

TWO_ADAMW = "loop=torch.optim:AdamW(foreach=False),fused=torch.optim:AdamW(fused=True)"


def test_arms_take_labels_and_keyword_arguments() -> None:
    arms = parse_arms(TWO_ADAMW, control=False)
    assert [(a.label, a.role, a.spec) for a in arms] == [
        ("loop", "baseline", "torch.optim:AdamW(foreach=False)"),
        ("fused", "candidate", "torch.optim:AdamW(fused=True)"),
    ]
    nested = parse_arms("a=torch.optim:Adam(betas=(0.9, 0.99)),baseline", control=True)
    assert [a.label for a in nested] == ["a", "baseline", "a-control"]
    assert nested[2].spec == "torch.optim:Adam(betas=(0.9, 0.99))"
    assert parse_spec("torch.optim:Adam(betas=(0.9, 0.99), amsgrad=True)") == (
        "torch.optim:Adam",
        {"betas": (0.9, 0.99), "amsgrad": True},
    )
    assert parse_spec(" baseline ") == ("baseline", {})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("torch.optim:SGD(lr=__import__('os').getcwd())", "lr: only literals"),
        ("torch.optim:SGD(0.1)", "keyword arguments only"),
        ("torch.optim:SGD(**{'lr': 1})", "keyword arguments only"),
        ("torch.optim:SGD(lr=0.1", "not closed"),
        ("torch.optim:SGD(lr=0.1)x", "not closed"),
    ],
)
def test_keyword_values_are_literals_never_code(spec: str, message: str) -> None:
    with pytest.raises(ArmError, match=message) as error:
        parse_spec(spec)
    assert "\n" not in str(error.value)


def test_labels_are_checked() -> None:
    with pytest.raises(InputError, match="names an arm twice"):
        parse_arms("a=baseline,a=candidate", control=False)


def test_torch_optimizers_take_the_hyper_parameters_their_signature_accepts() -> None:
    groups = tiny_param_groups()
    tier_kwargs = {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.0, "nesterov": True, "use_muon": False}
    adamw = make_optimizer("torch.optim:AdamW(foreach=False, lr=0.003)", groups, {**tier_kwargs, "muon": 0.2})
    assert isinstance(adamw, torch.optim.AdamW)
    assert adamw.defaults["foreach"] is False
    assert [g["lr"] for g in adamw.param_groups] == [
        0.003,
        0.003,
    ]  # an arm keyword naming a group key sets it
    assert [g["weight_decay"] for g in adamw.param_groups] == [5e-4, 0.0]  # the tier's, per group
    sgd = make_optimizer("torch.optim:SGD", tiny_param_groups(), {**tier_kwargs, "sgd": 1.0})
    assert sgd.defaults["momentum"] == 0.9 and sgd.defaults["nesterov"] is True


class Recorder(MuSGD):
    """Records the keywords its constructor was given."""

    seen: list[dict] = []

    def __init__(self, params, **kwargs) -> None:
        Recorder.seen.append(dict(kwargs))
        super().__init__(params, **kwargs)


def test_the_check_builds_each_arm_with_what_its_tier_passes() -> None:
    from experiments.fit.embedded import optimizer_kwargs

    Recorder.seen.clear()
    checked_optimizer(f"{__name__}:Recorder", tier_kwargs=optimizer_kwargs())
    assert Recorder.seen == [optimizer_kwargs()]


class OnlyZeroGrad(MuSGD):
    """MuSGD with a change outside step()."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)


class Renamed(MuSGD):
    """MuSGD under another name: adds nothing."""


def test_a_subclass_overriding_only_zero_grad_is_not_the_baselines_code() -> None:
    assert same_path_as_baseline(f"{__name__}:OnlyZeroGrad", "cpu") is None
    assert same_path_as_baseline(f"{__name__}:Renamed", "cpu") is not None
    assert same_path_as_baseline("baseline(muon=0.3)", "cpu") is None  # other arguments, other computation


def test_the_plan_records_labels_and_keywords() -> None:
    arms = parse_arms(TWO_ADAMW, control=False)
    code = arm_code([Case("c", {}, arms)], "cpu")
    assert code["fused"]["spec"] == "torch.optim:AdamW(fused=True)"
    assert code["fused"]["kwargs"] == {"fused": True}
    assert code["loop"]["kwargs"] == {"foreach": False}


def test_two_torch_optimizers_with_arguments_through_screen(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    argv = ["screen", "--arms", TWO_ADAMW, "--device", "cpu", "--scales", "n", "--steps", "1"]
    argv += ["--warmup-steps", "0", "--warmup", "0", "--pairs", "2", "--quiet", "--no-report"]
    assert main([*argv, "--out", str(out)]) == 0
    folder = only_run(out)
    rows = folder.rows()
    assert {r["arm"] for r in rows} == {"loop", "fused"}
    assert all(r["status"] == "ok" for r in rows), [r.get("message") for r in rows]
    plan = json.loads(folder.file("plan.json").read_text())
    assert plan["arm_code"]["fused"]["kwargs"] == {"fused": True}


@pytest.mark.slow
def test_two_torch_optimizers_with_arguments_through_pair(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    argv = ["pair", *TINY_FIT, "--quiet", "--arms", TWO_ADAMW, *ONE_PAIR, "--no-report"]
    assert main([*argv, "--out", str(out)]) == 0
    rows = only_run(out).rows()
    assert [r["status"] for r in rows] == ["ok", "ok"], [r.get("message") for r in rows]
    assert {r["arm"] for r in rows} == {"loop", "fused"}


def test_a_constructor_the_tier_cannot_call_is_one_line_before_anything_is_written(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "runs"
    argv = ["screen", "--arms", "baseline,torch.optim:AdamW(nosuch=1)", "--device", "cpu", "--scales", "n"]
    assert main([*argv, "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "nosuch" in err
    assert not out.exists() or not any(out.iterdir())


def test_the_bench_script_imports_arm_modules_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "myopt.py").write_text(
        textwrap.dedent(
            """
            from optimizers import MuSGD

            class Mine(MuSGD):
                def zero_grad(self, set_to_none=True):
                    super().zero_grad(set_to_none)
            """
        )
    )
    bench = Path(sys.executable).with_name("bench")
    if not bench.exists():
        pytest.skip("no bench console script beside this python")
    env = child_env()
    argv = [str(bench), "screen", "--arms", "baseline,mine=myopt:Mine", "--device", "cpu", "--scales", "n"]
    argv += ["--steps", "1", "--warmup-steps", "0", *ONE_PAIR, "--quiet", "--no-report"]
    done = subprocess.run([*argv, "--out", "runs"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = only_run(tmp_path / "runs").rows()
    assert {r["arm"] for r in rows} == {"baseline", "mine"}


def test_an_arm_outside_the_repository_is_fingerprinted_in_env_json(tmp_path: Path, monkeypatch) -> None:
    import hashlib

    source = "from optimizers import MuSGD\n\nclass Outside(MuSGD):\n    pass\n"
    (tmp_path / "outside_arm_42.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "runs"
    argv = ["screen", "--arms", "baseline,outside_arm_42:Outside", "--device", "cpu", "--scales", "n"]
    argv += ["--steps", "1", "--warmup-steps", "0", *ONE_PAIR, "--quiet", "--no-report"]
    assert main([*argv, "--out", str(out)]) == 0
    record = json.loads(only_run(out).file("env.json").read_text())
    files = {entry["path"]: entry["sha256"] for entry in record["arm_files"]}
    assert files == {str(tmp_path / "outside_arm_42.py"): hashlib.sha256(source.encode()).hexdigest()}


def test_git_dirty_counts_an_untracked_arm_file_inside_the_repository(tmp_path: Path) -> None:
    from harness import env

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    arm = tmp_path / "myarm.py"
    arm.write_text("y = 2\n")
    assert env.git_state(tmp_path)["git_dirty"] is False  # untracked files elsewhere do not count
    state = env.git_state(tmp_path, [str(arm)])
    assert state["git_dirty"] is True and state["arm_files"] == []


def test_bench_env_fingerprints_the_arms_it_is_given(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "env_arm_42.py").write_text("from optimizers import MuSGD\n\nclass Mine(MuSGD):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["env", "--json", "--arms", "env_arm_42:Mine"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [entry["path"] for entry in record["arm_files"]] == [str(tmp_path / "env_arm_42.py")]


class Broken(MuSGD):
    """Builds, then fails at every step."""

    def step(self, closure=None):
        raise RuntimeError("boom at step")


def test_an_arm_whose_every_trial_failed_names_its_errors_and_exits_3(tmp_path: Path, capsys) -> None:
    from harness.run import EVERY_TRIAL_FAILED

    out = tmp_path / "runs"
    argv = ["screen", "--arms", f"baseline,broken={__name__}:Broken", "--device", "cpu", "--scales", "n"]
    argv += ["--steps", "1", "--warmup-steps", "0", "--warmup", "0", "--pairs", "2", "--quiet", "--no-report"]
    assert main([*argv, "--out", str(out)]) == EVERY_TRIAL_FAILED == 3
    err = capsys.readouterr().err
    assert "every trial of arm 'broken' failed (1 distinct error(s)):" in err
    assert err.count("RuntimeError: boom at step") == 1, err


def test_the_default_budget_is_an_hour_on_the_cpu_and_none_on_a_gpu() -> None:
    from dataclasses import replace

    from harness.estimate import budget_of
    from tests.trialfns import plan_of

    plan = plan_of("scripted", warmup=0, pairs=2, device="cpu")
    assert budget_of(plan) == 3600.0
    plan.protocol = replace(plan.protocol, device="cuda:0")
    assert budget_of(plan) is None


def test_cpu_defaults_of_screen_and_probe_are_about_a_minute(monkeypatch, tmp_path: Path, capsys) -> None:
    from harness.run import Runner

    planned = {}

    def capture(self, plan, trial_fn=None):
        planned[plan.tier] = plan
        raise KeyboardInterrupt  # nothing run: the plan is what is checked

    monkeypatch.setattr(Runner, "start", capture)
    for argv in (["screen"], ["probe"], ["probe", "--tokens", "16384"]):
        main([*argv, "--device", "cpu", "--quiet", "--out", str(tmp_path)])
        plan = planned.pop(argv[0])
        out = capsys.readouterr().out
        # The work bounds follow measured runs (user+sys CPU under load): 4 steps of scale n a trial, 14 trials,
        # is about a minute on two cores; so are 28 trials of 4096 tokens through a 2048-word head.
        if argv[0] == "screen":
            assert plan.settings["scales"] == ["n"] and "CPU defaults: --scales n" in out
            s = plan.settings
            assert len(plan.schedule) * (s["warmup_steps"] + s["steps"] + 1) <= 14 * 4, s
        elif len(argv) == 1:
            params = plan.cases[-1].params  # the chunked case
            assert (params["vocab"], params["chunk"]) == (2048, 1024) and params["tokens"] <= 4096
            assert len(plan.schedule) == 28
        else:
            assert plan.cases[0].params["tokens"] == 16384 and "--tokens" not in out  # typed: kept
    main(["screen", "--device", "cuda:0", "--quiet", "--out", str(tmp_path)])  # refused (no CUDA): exit 2
    assert "CPU defaults" not in capsys.readouterr().out
