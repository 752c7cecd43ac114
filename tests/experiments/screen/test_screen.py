"""The optimizer-only screen.

Cases and labels, the guard's reach, one trial's figures, and the CLI end to end on the CPU. Also the summary
and report section from a fixture log, bad inputs, and the launch floor on CUDA.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from experiments.arms import arm_code
from experiments.screen import plan as screen_plan
from experiments.screen import plots as screen_plots
from experiments.screen import section as screen_section
from experiments.screen import trial as screen_trial
from experiments.tiers import TIERS
from harness.cli import main
from harness.errors import InputError
from harness.options import protocol_options
from harness.plan import Plan
from harness.present.model import markdown
from harness.schedule import Arm
from harness.tables import RunFolder
from harness.tier import Run
from harness.trial import TrialContext
from optimizers.batched import DEFAULT_PAD_GUARD, BatchedMuSGD
from optimizers.batched.planning import batched_on_cpu
from tests.argv import ONE_PAIR, TINY_SCREEN, overridden
from tests.optimizers.groups import conv_groups
from tests.trialfns import runner

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
MiB = 2**20


PROTOCOL_KEYS = ("arms", "warmup", "pairs", "order", "seed", "bar", "device")


def make_plan(on: str | None = None, **options: Any) -> Plan:
    """A screen plan from CLI-style options (protocol ones and the screen's own); ``on='cuda'`` makes it stand
    for a GPU run's plan (its device says cuda) while it is built on this machine."""
    protocol = protocol_options(**{k: v for k, v in options.items() if k in PROTOCOL_KEYS})
    plan = screen_plan.make_plan(
        protocol, screen_plan.ScreenSettings(**{k: v for k, v in options.items() if k not in PROTOCOL_KEYS})
    )
    if on is not None:
        plan.protocol = dataclasses.replace(plan.protocol, device=on)
        plan.arm_code = arm_code(plan.cases, on)  # what the arms run there, as a plan made there records
    return plan


def start(plan: Plan, root: Path, trial_fn) -> RunFolder:
    return runner(root, tiers=TIERS).start(plan, trial_fn).folder


def loaded(folder: RunFolder):
    run = Run.load(folder)
    return run.plan, run.summaries


def section(folder: RunFolder, figures_dir: Path) -> str:
    return "\n".join(markdown(screen_section.report_section(Run.load(folder, figures_dir))))


def labels(case) -> list[str]:
    return [a.label for a in case.arms]


# --- cases, labels, schedule -------------------------------------------------------------------------------


def test_cases_expand_guarded_arms_only() -> None:
    plan = make_plan(
        scales="n,s",
        guards="0,256,none",
        arms="baseline,candidate,upstream",
        pairs=3,
        warmup=10,
        device="cpu",
    )
    assert [c.label for c in plan.cases] == ["n", "s"]
    for case in plan.cases:
        assert labels(case) == ["baseline", "candidate@g0", "candidate@g256", "candidate@gnone", "upstream"]
        assert [a.role for a in case.arms] == ["baseline"] + ["candidate"] * 4
        assert [a.params["guard"] for a in case.arms] == ["no-guard", "0", "256", "none", "no-guard"]
        assert case.params == {"scale": case.label, "model": f"yolo26{case.label}"}
    # --pairs are the protocol's rounds and --warmup its warm-up trials; --warmup-steps stay in the settings.
    assert plan.protocol.pairs == 3 and plan.protocol.warmup == 10
    assert plan.settings["steps"] == screen_plan.ScreenSettings.steps
    assert plan.settings["warmup_steps"] == screen_plan.ScreenSettings.warmup_steps
    assert plan.settings["default_guards"] == {"candidate": str(DEFAULT_PAD_GUARD)}
    assert plan.settings["guarded_specs"] == ["candidate"]
    assert len(plan.schedule) == 2 * (10 + 3 * 5)
    for case in ("n", "s"):
        for r in range(3):
            in_round = [
                t.arm for t in plan.schedule if t.case == case and t.phase == "measured" and t.round == r
            ]
            assert sorted(in_round) == sorted(labels(plan.cases[0]))
    assert Plan.from_json(plan.to_json()).cases == plan.cases  # a resume rebuilds the same cases


def test_a_guarded_first_arm_runs_once_at_its_default() -> None:
    plan = make_plan(scales="n", guards="0,none", arms="candidate,baseline", device="cpu")
    assert labels(plan.cases[0]) == ["candidate", "baseline"]
    assert plan.cases[0].arms[0].params["guard"] == "default"


def test_cli_defaults_are_the_screen_defaults() -> None:
    import typer

    from harness.cli import app

    command = typer.main.get_command(app).commands["screen"]
    defaults = {param.name: param.default for param in command.params}
    for field in dataclasses.fields(screen_plan.ScreenSettings):
        assert defaults[field.name] == field.default, field.name
    assert {"repeats", "warmup_trials"}.isdisjoint(defaults)  # one word, one meaning in every command


@pytest.mark.parametrize(("text", "expected"), [("0", 0), ("256", 256), ("none", None), ("NONE", None)])
def test_guard_parsing(text: str, expected: int | None) -> None:
    assert screen_plan.parse_guard(text) == expected
    assert screen_plan.guard_label("candidate", expected) == f"candidate@g{text.lower()}"


@pytest.mark.parametrize("text", ["²", "-1", "2.5", "big", ""])
def test_guard_parsing_refuses_what_int_would_not_take_cleanly(text: str) -> None:
    with pytest.raises(InputError, match="is not a guard"):
        screen_plan.parse_guard(text)


# --- the guard reaches the trial's optimizer and nothing else ------------------------------------------------


def batch_kinds(guard: str) -> set[str]:
    groups, kwargs = conv_groups()
    optimizer = screen_trial.make_arm_optimizer(
        Arm(f"candidate@g{guard}", "candidate", "candidate", {"guard": guard}), groups, kwargs
    )
    with batched_on_cpu():
        optimizer.step()
    return {batch.kind for batch in optimizer._plan.batches}


def test_the_guard_decides_padding() -> None:
    assert "padded" not in batch_kinds("0")
    assert "padded" in batch_kinds("none")
    assert BatchedMuSGD.pad_guard == DEFAULT_PAD_GUARD


def test_guard_does_not_leak_between_trials() -> None:
    settings = screen_plan.ScreenSettings(steps=2, warmup_steps=1, floor_replays=1, dtype="float32")
    groups, kwargs = conv_groups()
    row = screen_trial.measure_step(
        Arm("candidate@g0", "candidate", "candidate", {"guard": "0"}), groups, kwargs, "cpu", settings
    )
    assert row["guard_in_effect"] == "0"
    assert BatchedMuSGD.pad_guard == DEFAULT_PAD_GUARD
    groups, kwargs = conv_groups()
    row = screen_trial.measure_step(
        Arm("candidate", "baseline", "candidate", {"guard": "default"}), groups, kwargs, "cpu", settings
    )
    assert row["guard_in_effect"] == str(DEFAULT_PAD_GUARD)
    groups, kwargs = conv_groups()
    row = screen_trial.measure_step(
        Arm("baseline", "baseline", "baseline", {"guard": "no-guard"}), groups, kwargs, "cpu", settings
    )
    assert row["guard_in_effect"] == "no-guard"


def test_one_cpu_trial_reports_its_figures_and_no_floor() -> None:
    settings = screen_plan.ScreenSettings(steps=3, warmup_steps=1, floor_replays=5, dtype="float32")
    groups, kwargs = conv_groups()
    before = [p.detach().clone() for g in groups for p in g["params"]]
    row = screen_trial.measure_step(
        Arm("baseline", "baseline", "baseline", {"guard": "no-guard"}), groups, kwargs, "cpu", settings
    )
    after = [p.detach() for g in groups for p in g["params"]]
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True))  # the steps did run
    assert row["value"] > 0 and math.isclose(row["value"] * 3, row["window_ms"])
    assert 0 < row["host_ms"] <= row["value"] * 1.01
    assert row["extra_peak_bytes"] is None and row["state_bytes"] is None  # no CUDA allocator on the CPU
    assert row["floor_ms"] is None and row["floor_note"].startswith("n/a: CPU")


def test_workload_cache_gives_fresh_equal_tensors_per_round() -> None:
    cache = screen_trial.WorkloadCache()
    first, kwargs = cache.fresh("n", 7, torch.float32, "cpu")
    second, _ = cache.fresh("n", 7, torch.float32, "cpu")
    assert kwargs == {"muon": 0.2, "sgd": 1.0}
    pairs = [
        (a, b)
        for ga, gb in zip(first, second, strict=True)
        for a, b in zip(ga["params"], gb["params"], strict=True)
    ]
    assert len(pairs) == 366
    for a, b in pairs:
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
        if a.requires_grad:
            assert torch.equal(a.grad, b.grad) and a.grad.data_ptr() != b.grad.data_ptr()
    first[0]["params"][0].data.add_(1.0)  # a trial's steps must not reach the next trial's copy
    third, _ = cache.fresh("n", 7, torch.float32, "cpu")
    assert torch.equal(third[0]["params"][0], second[0]["params"][0])
    other, _ = cache.fresh("n", 8, torch.float32, "cpu")
    assert not torch.equal(other[-1]["params"][0], second[-1]["params"][0])


# --- the command end to end on the CPU -----------------------------------------------------------------------


@pytest.mark.slow
def test_cpu_screen_through_the_cli(tmp_path: Path) -> None:
    argv = [*TINY_SCREEN, "--arms", "baseline,candidate", *ONE_PAIR, "--quiet"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    trials = pd.read_csv(run_dir / "trials.csv")
    assert list(trials["arm"]) == ["baseline", "candidate@g0"]
    assert (trials["status"] == "ok").all() and (trials["value"] > 0).all()
    assert trials["floor_ms"].isna().all()
    assert trials["floor_note"].str.startswith("n/a: CPU").all()
    summary = pd.read_csv(run_dir / screen_section.SUMMARY_CSV)
    assert list(summary["arm"]) == ["baseline", "candidate@g0"]
    assert list(summary["guard"].astype(str)) == ["no-guard", "0"]
    report = (run_dir / "report.md").read_text()
    assert "### Screen: crossover over scales and padding guards" in report
    assert "Floor n/a: CPU" in report
    assert (run_dir / "report-figures" / screen_plots.CROSSOVER_PNG).stat().st_size > 0
    assert (run_dir / "report-figures" / screen_plots.MEMORY_PNG).stat().st_size > 0


# --- summary and section from a fixture log ------------------------------------------------------------------

# Fixture figures (invented for the test, written through the spine as if measured on a GPU): per scale and
# arm, ms/step, host ms/step, floor ms and extra peak MiB. Each round scales every arm alike, so paired
# comparisons are constant and the medians are the figures themselves.
FIXTURE = {
    "n": {
        "baseline": (90, 89, 20, 1),
        "candidate@g0": (14, 13.5, 5, 20),
        "candidate@g256": (6, 5.8, 3, 25),
        "candidate@gnone": (5.5, 5.3, 2.8, 30),
        "upstream": (16, 15.5, 2.3, 35),
    },
    "s": {
        "baseline": (95, 94, 22, 1),
        "candidate@g0": (15, 14, 6, 100),
        "candidate@g256": (7, 4, 5, 150),
        "candidate@gnone": (9, 4.2, 7, 300),
        "upstream": (20, 19, 3, 140),
    },
}


def fixture_trials(plan: Plan):
    def trial(ctx: TrialContext) -> dict[str, Any]:
        ms, host, floor, peak = FIXTURE[ctx.case.label][ctx.arm.label]
        factor = 1 + 0.01 * (ctx.trial.round - 1)
        return {
            "value": ms * factor,
            "host_ms": host * factor,
            "floor_ms": floor,
            "floor_note": "",
            "extra_peak_bytes": peak * MiB,
            "state_bytes": 10 * MiB,
            "peak_allocated": (peak + 40) * MiB,
        }

    return trial


@pytest.fixture(scope="module")
def fixture_run(tmp_path_factory) -> tuple[RunFolder, Plan]:
    plan = make_plan(
        on="cuda",  # the fixture stands for a GPU run's log
        scales="n,s",
        guards="0,256,none",
        arms="baseline,candidate,upstream",
        pairs=3,
        steps=10,
        warmup_steps=2,
        warmup=0,
        device="cpu",
    )
    folder = start(plan, tmp_path_factory.mktemp("runs"), fixture_trials(plan))
    return folder, plan


def test_summary_table_from_fixture(fixture_run) -> None:
    folder, _ = fixture_run
    table = screen_section.summary_table(*loaded(folder))
    assert (folder.file(screen_section.SUMMARY_CSV)).is_file()  # the runner wrote it when the run ended
    assert len(table) == 10 and list(table["scale"].unique()) == ["n", "s"]
    row = table[(table["scale"] == "n") & (table["arm"] == "candidate@g256")].iloc[0]
    assert row["guard"] == "256" and row["trials"] == 3 and row["failed"] == 0
    assert row["ms_median"] == pytest.approx(6) and row["ms_min"] == pytest.approx(5.94)
    assert row["ms_max"] == pytest.approx(6.06)
    assert row["host_ms_median"] == pytest.approx(5.8) and row["floor_ms_median"] == pytest.approx(3)
    assert row["over_floor"] == pytest.approx(2.0)
    assert row["extra_peak_bytes_median"] == 25 * MiB and row["state_bytes_median"] == 10 * MiB
    assert row["reduction_vs_baseline_median"] == pytest.approx((90 - 6) / 90)
    base = table[(table["scale"] == "s") & (table["arm"] == "baseline")].iloc[0]
    assert base["role"] == "baseline" and math.isnan(base["reduction_vs_baseline_median"])


def test_section_states_the_crossover_and_targets_from_the_data(fixture_run, tmp_path: Path) -> None:
    folder, _ = fixture_run
    figures = tmp_path / "report-figures"
    text = section(folder, figures)
    assert (figures / screen_plots.CROSSOVER_PNG).stat().st_size > 0 and (
        figures / screen_plots.MEMORY_PNG
    ).stat().st_size > 0
    assert "![crossover: ms/step vs scale](report-figures/screen_crossover.png)" in text
    # Fastest guard per scale: none at n (5.5 < 6), 256 at s (7 < 9).
    assert "| n | none | 14.000 | 6.000 | 5.500 |" in text
    assert "| s | 256 | 15.000 | 7.000 | 9.000 |" in text
    # The unguarded arm turns slower than g256 at s only (by 2/7 = 28.57%), never slower than exact shapes.
    assert (
        "`candidate@gnone` is slower than `candidate@g256` at: s (candidate@gnone slower than candidate@g256 "
        "by 28.57%" in text
    )
    assert "`candidate@gnone` is never slower than `candidate@g0`" in text
    # Supported guard: g256's worst case is 6/5.5 = 1.091× (at n), better than none's 9/7 = 1.286× (at s).
    assert "**The data supports guard 256** (`candidate@g256`)" in text
    assert "at most 1.091× the fastest guard's (worst at n)" in text
    assert "gnone 1.286× at s" in text
    # Targets for the shipped default, g256.
    assert "checked for `candidate@g256` (the candidate as shipped)" in text
    assert (
        "| ≤ 1.5× own floor | n | 6.000 ms = 2.000× floor 3.000 ms (over by 1.500 ms) | **missed** | host dispatch"
        in text
    )
    assert "| ≤ 1.5× own floor | s | 7.000 ms = 1.400× floor 5.000 ms (under by 0.5000 ms) | met |" in text
    assert (
        "| ≥ 4× faster than upstream | n | 2.667× (16.000 vs 6.000 ms; faster in 3 of 3 rounds) | **missed** |"
        in text
    )
    assert (
        "| ≥ 2× faster than upstream | s | 2.857× (20.000 vs 7.000 ms; faster in 3 of 3 rounds) | met |"
        in text
    )
    assert "| extra peak ≤ upstream's | n | 25.0 MiB vs 35.0 MiB (−10.0 MiB) | met |" in text
    assert "| extra peak ≤ upstream's | s | 150.0 MiB vs 140.0 MiB (+10.0 MiB) | **missed** |" in text
    assert (
        "| never slower than baseline | s | faster by 92.63% (paired median; faster in 3 of 3 rounds) | met |"
        in text
    )
    assert (
        "- extra peak ≤ upstream's at s: 150.0 MiB vs 140.0 MiB (+10.0 MiB); bound by memory, not time: with "
        "exact shapes (g0) the step takes 100.0 MiB, so padding accounts for the rest." in text
    )
    assert (
        "- ≤ 1.5× own floor at n: 6.000 ms = 2.000× floor 3.000 ms (over by 1.500 ms); bound by host dispatch "
        "(5.800 ms of host time per step is ≥ 80% of it)." in text
    )
    # Next step follows from the worst distance to the floor (n, 2×) and its host-bound step.
    assert (
        "**Next step.** At n the candidate takes 6.000 ms/step, 2.000× its launch floor of 3.000 ms, and "
        "5.800 ms of it is host dispatch" in text
    )


@pytest.mark.parametrize(
    ("ms", "host", "floor", "bound"),
    [
        (10.0, 9.0, 3.0, "host dispatch"),
        (10.0, 9.0, 8.5, "GPU time"),  # the queue was full: the host waited, the GPU was the limit
        (10.0, 2.0, 9.0, "GPU time"),
        (7.0, 4.0, 5.0, "neither alone (host dispatch 4.000 ms, floor 5.000 ms per 7.000 ms step)"),
        (10.0, 9.0, math.nan, "host dispatch"),
    ],
)
def test_what_bounds_a_step(ms: float, host: float, floor: float, bound: str) -> None:
    assert screen_section.bound_by(ms, host, floor).startswith(bound)


def test_section_changes_with_the_data(tmp_path: Path) -> None:
    """The same section over a log where the unguarded arm wins everywhere says so (nothing is canned)."""
    plan = make_plan(
        on="cuda",
        scales="n,s",
        guards="0,256,none",
        arms="baseline,candidate",
        pairs=2,
        warmup=0,
        device="cpu",
    )
    figures = {
        s: {
            "baseline": (90, 89, 20, 1),
            "candidate@g0": (14, 13, 5, 20),
            "candidate@g256": (8, 7.9, 3, 25),
            "candidate@gnone": (4, 3.9, 3.5, 30),
        }
        for s in ("n", "s")
    }

    def trial(ctx: TrialContext) -> dict[str, Any]:
        ms, host, floor, peak = figures[ctx.case.label][ctx.arm.label]
        return {
            "value": ms,
            "host_ms": host,
            "floor_ms": floor,
            "floor_note": "",
            "extra_peak_bytes": peak * MiB,
        }

    folder = start(plan, tmp_path, trial)
    text = section(folder, tmp_path / "figs")
    assert "**The data supports guard none**" in text
    assert "`candidate@gnone` is never slower than `candidate@g256`" in text
    assert "upstream not in this run" in text
    assert "| ≤ 1.5× own floor | n | 8.000 ms = 2.667× floor 3.000 ms" in text


def test_section_reads_failed_trials_as_failures(tmp_path: Path) -> None:
    """An arm that runs out of memory at one scale is a recorded failure: shown, never the fastest guard."""
    plan = make_plan(
        on="cuda", scales="n,s", guards="0,none", arms="baseline,candidate", pairs=2, warmup=0, device="cpu"
    )

    def trial(ctx: TrialContext) -> dict[str, Any]:
        if ctx.case.label == "s" and ctx.arm.label == "candidate@gnone":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        ms = {"baseline": 90.0, "candidate@g0": 12.0, "candidate@gnone": 10.0}[ctx.arm.label]
        return {
            "value": ms,
            "host_ms": ms * 0.9,
            "floor_ms": ms / 3,
            "floor_note": "",
            "extra_peak_bytes": MiB,
        }

    folder = start(plan, tmp_path, trial)
    table = screen_section.summary_table(*loaded(folder))
    failed = table[(table["scale"] == "s") & (table["arm"] == "candidate@gnone")].iloc[0]
    assert failed["failed"] == 2 and math.isinf(failed["ms_median"])
    text = section(folder, tmp_path / "figs")
    assert "| s | candidate@gnone | 2 (2 failed) | failed (failed–failed) |" in text
    assert "| n | none | 12.000 | 10.000 |" in text and "| s | 0 | 12.000 | failed |" in text
    assert (
        "`candidate@gnone` is slower than `candidate@g0` at: s (candidate@gnone failed where candidate@g0 "
        "finished" in text
    )
    assert "| s | 0 | 12.000 | failed | no other guard finished |" in text
    assert "**The data supports guard 0**" in text and "gnone did not finish at every scale." in text


# --- bad inputs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scales", "q"], "--scales 'q' is not accepted; use one of: n, s, m, l, x"),
        (["--scales", "n,n"], "names a scale twice"),
        (["--guards=-1"], "'-1' is not a guard"),
        (["--guards", "0,big"], "'big' is not a guard"),
        (["--guards", "0,0"], "names a guard twice"),
        (["--arms", "baseline,nosuch"], "unknown arm 'nosuch'"),
        (["--arms", "baseline"], "names one arm"),
        (["--steps", "0"], "--steps must be a positive whole number"),
        (["--pairs", "0"], "--pairs must be a positive whole number"),
        (["--warmup=-1"], "--warmup must be zero or more"),
        (["--warmup-steps=-2"], "--warmup-steps must be zero or more"),
        (["--repeats", "3"], "No such option: --repeats"),
        (["--floor-replays", "0"], "--floor-replays must be a positive whole number"),
        (["--dtype", "int8"], "--dtype 'int8' is not accepted"),
        (["--device", "tpu"], "use auto, cpu, cuda or cuda:N"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_run_folder(
    argv: list[str], message: str, tmp_path: Path, bench
) -> None:
    out = tmp_path / "runs"
    base = ["--device", "cpu", "--scales", "n", "--out", str(out), "--quiet"]
    bench.refused(["screen", *overridden(base, argv)], message)
    assert not out.exists() or not any(out.iterdir())


# --- CUDA: the launch floor ---------------------------------------------------------------------------------


class SyncingMuSGD(BatchedMuSGD):
    """A step that reads a value back to the host: it cannot be captured in a CUDA graph."""

    def step(self, closure=None):  # type: ignore[override]
        loss = super().step(closure)
        float(self.param_groups[0]["params"][0].sum().item())
        return loss


@cuda
@pytest.mark.cuda
def test_cuda_floor_of_a_captured_step() -> None:
    groups, kwargs = conv_groups(device="cuda")
    optimizer = BatchedMuSGD(groups, **kwargs)
    for _ in range(2):
        optimizer.step()
    window = screen_trial.time_window(optimizer, "cuda", 3)
    assert window["value"] > 0 and window["extra_peak_bytes"] is not None and window["extra_peak_bytes"] >= 0
    floor = screen_trial.launch_floor(optimizer, "cuda", 5)
    assert floor["floor_note"] == "" and floor["floor_ms"] is not None and floor["floor_ms"] > 0
    # A replay is the same step: it keeps moving the parameters.
    before = groups[1]["params"][0].detach().clone()
    screen_trial.launch_floor(optimizer, "cuda", 1)
    torch.cuda.synchronize()
    assert not torch.equal(before, groups[1]["params"][0])


@cuda
@pytest.mark.cuda
def test_cuda_floor_of_an_uncapturable_step_is_na_with_the_reason() -> None:
    groups, kwargs = conv_groups(device="cuda")
    optimizer = SyncingMuSGD(groups, **kwargs)
    optimizer.step()
    floor = screen_trial.launch_floor(optimizer, "cuda", 5)
    assert floor["floor_ms"] is None and floor["floor_note"].startswith("n/a: capture failed: ")
    # The failed capture leaves the process usable, on its default stream.
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    assert float((torch.ones(4, device="cuda") * 2).sum()) == 8.0


@cuda
@pytest.mark.cuda
def test_cuda_screen_trial_on_scale_n() -> None:
    plan = make_plan(
        scales="n",
        guards="256",
        arms="baseline,candidate",
        steps=2,
        pairs=1,
        warmup_steps=1,
        floor_replays=3,
        device="cuda",
    )
    trial_fn = screen_trial.trial_function(plan)
    case = plan.cases[0]
    for scheduled in plan.schedule:
        if scheduled.phase != "measured":
            continue
        row = trial_fn(TrialContext(plan, scheduled, case, case.arm(scheduled.arm), Path(".")))
        assert row["value"] > 0 and row["floor_ms"] > 0 and row["floor_note"] == ""
        assert row["state_bytes"] > 0 and row["extra_peak_bytes"] >= 0


def test_conclusions_are_withheld_when_the_guarded_arms_run_the_baselines_code(tmp_path: Path) -> None:
    """On the CPU `candidate@gX` keeps the per-parameter step: no guard choice, no target, no next step.

    The same figures with candidate-cpu, the batched path on CPU tensors, are read as usual.
    """
    figures = {"baseline": 90.0, "@g0": 14.0, "@g256": 8.0}

    def trial(ctx: TrialContext) -> dict[str, Any]:
        ms = (
            figures[ctx.arm.label.removeprefix(ctx.arm.spec)] if "@" in ctx.arm.label else figures["baseline"]
        )
        return {
            "value": ms,
            "host_ms": ms,
            "floor_ms": math.nan,
            "floor_note": "n/a",
            "extra_peak_bytes": MiB,
        }

    same = make_plan(scales="n", guards="0,256", arms="baseline,candidate", pairs=2, warmup=0, device="cpu")
    text = section(start(same, tmp_path / "same", trial), tmp_path / "figs-same")
    assert "**Withheld:** `candidate@g0`, `candidate@g256` ran the baseline's code" in text
    assert "which guard the data supports cannot be read from this run" in text
    assert "The data supports guard" not in text and "Next step" not in text and "| target |" not in text
    routed = make_plan(
        scales="n", guards="0,256", arms="baseline,candidate-cpu", pairs=2, warmup=0, device="cpu"
    )
    text = section(start(routed, tmp_path / "routed", trial), tmp_path / "figs-routed")
    assert "Withheld" not in text
    assert "**The data supports guard 256** (`candidate-cpu@g256`)" in text


def test_a_screen_with_its_control_reads_back_its_own_plan(tmp_path: Path) -> None:
    """`--control` records the first arm's spec twice in `arm_specs`, and the folder still reads back for a
    report or resume.
    """
    out = tmp_path / "runs"
    assert main([*TINY_SCREEN, *ONE_PAIR, "--arms", "baseline", "--control", "--out", str(out)]) == 0
    (folder,) = list(out.iterdir())
    assert (folder / "report.md").is_file()
    assert main(["report", str(folder), "-o", str(tmp_path / "again.md")]) == 0


def test_a_screen_of_one_guard_names_no_empty_list_of_other_guards(tmp_path: Path) -> None:
    """With one guard there are no other guards to compare: the report said "the other guards' worst cases: .",
    an empty list rendered."""
    from harness.cli import main
    from tests.runfolders import only_run

    argv = ["screen", "--arms", "baseline,candidate-cpu", "--device", "cpu", "--scales", "n", "--steps", "1"]
    argv += ["--warmup-steps", "0", "--warmup", "0", "--pairs", "2", "--guards", "256"]
    assert main([*argv, "--out", str(tmp_path / "runs")]) == 0
    text = only_run(tmp_path / "runs").file("report.md").read_text()
    assert "**The data supports guard 256**" in text
    assert "worst cases: ." not in text and "the only guard screened" in text
