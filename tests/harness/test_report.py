"""The markdown report.

Every section and plot, byte-for-byte regeneration, failures, A/A controls and interrupted runs. Also several
runs side by side, the claim sentence, the tier hook and `bench report`.

Run folders are built here through the real runner (`Runner.start` with small trial functions), so the
fixtures never drift from what the harness writes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from experiments.tiers import TIERS as PROJECT_TIERS
from harness import cli, report
from harness.console import print_summary
from harness.errors import InputError
from harness.folder_format import LOG
from harness.formatting import format_number, method_label
from harness.plan import Plan
from harness.present import run_view
from harness.present.model import markdown_image, markdown_table
from harness.protocol_options import ProtocolOptions
from harness.run import Runner, RunOptions
from harness.schedule import Arm, Case
from harness.tables import CorruptRunFolder, RunFolder
from harness.tier import BaseTier, Caveat, Run, TierRegistry
from harness.trial import TrialContext, TrialFunction
from tests import ROOT
from tests.runfolders import H200_GPU

# A real CUDA caching-allocator message (torch 2.x); the byte figures below are what it says.
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
    "1.15 GiB is free. Including non-PyTorch memory, this process has 137.9 GiB memory in use. Of the "
    "allocated memory 21.90 GiB is allocated by PyTorch, and 1.06 GiB is reserved by PyTorch but unallocated. "
    "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "to avoid fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
PEAK = 849_244_160  # 809.9 MiB

# Per arm, per measured round: the figure the trial returns ('oom' / 'error' raise instead).
FIGURES: dict[str, list] = {
    "baseline": [89.448, 88.765, 89.646],
    "candidate": [79.183, 77.799, 79.660],
}


def scripted(figures: dict[str, list], peaks: dict[str, int] | None = None, stop_at: int | None = None):
    """A trial function returning ``figures[arm][round]`` (warm-ups use round 0's figure), optional peak
    bytes per arm; 'oom' raises a real-text OutOfMemoryError, 'error' a RuntimeError; ``stop_at`` raises
    KeyboardInterrupt at that schedule index (a run interrupted by the user)."""

    def trial(ctx: TrialContext) -> dict:
        if stop_at is not None and ctx.trial.index == stop_at:
            raise KeyboardInterrupt
        figure = figures[ctx.arm.label][ctx.trial.round if ctx.trial.phase == "measured" else 0]
        if figure == "oom":
            raise torch.OutOfMemoryError(OOM_MESSAGE)
        if figure == "error":
            raise RuntimeError("worker died | exit status -9\nwhile loading the batch")
        row = {"value": float(figure)}
        if peaks:
            row.update(peak_allocated=peaks[ctx.arm.label], peak_reserved=peaks[ctx.arm.label] + 2**26)
        return row

    return trial


def fixture_section(run: Run) -> str:
    """A tier section as a tier engineer writes one: a table and a plot drawn in harness.plots."""
    from harness import plots

    png = run.figures_dir / "fixture-tier.png"
    with plots.figure(png, width=6, height=3) as (_fig, ax):
        ax.plot([0, 1], [0, 1])
        ax.set_xlabel("x (unit)")
    rows = [[r["arm"], format_number(r["median"])] for _, r in run.summaries.arms.iterrows()]
    return "\n\n".join(
        [
            "### Fixture tier section",
            markdown_table(["arm", "median"], rows),
            markdown_image(png, "fixture plot"),
        ]
    )


FIXTURE = BaseTier(
    "fixture",
    trial_function=lambda plan: scripted(FIGURES),
    section=fixture_section,
    caveats=(Caveat("fixture tier: not a training claim.", "Its figures are scripted."),),
)
TIERS = TierRegistry([FIXTURE])


def make_plan(
    tier: str = "fixture",
    arms: tuple[str, ...] = ("baseline", "candidate"),
    pairs: int = 3,
    warmup: int = 2,
    control: bool = False,
    cases: tuple[str, ...] = ("yolo26n",),
    settings: dict | None = None,
) -> Plan:
    if control:
        arm_objects = (Arm(arms[0], "baseline", arms[0]), Arm(f"{arms[0]}-control", "candidate", arms[0]))
    else:
        arm_objects = tuple(Arm(a, "baseline" if i == 0 else "candidate", a) for i, a in enumerate(arms))
    return Plan(
        tier=tier,
        protocol=ProtocolOptions(arm_objects, warmup=warmup, pairs=pairs, bar=8.0, control=control),
        unit="s",
        metric="whole-fit wall time",
        cases=[Case(label, {"model": f"{label}.yaml"}, arm_objects) for label in cases],
        settings=settings or {"steps": 384, "images": 256},
        command=f"bench {tier} --steps 384 --pairs {pairs} --bar 8",
        isolation="each trial in a fresh worker process",
        timed_region="the whole fit, synchronized at both ends",
    )


def runner(root: Path, report: bool = False) -> Runner:
    return Runner(TIERS, RunOptions(out=root / "runs", quiet=True, report=report))


def run_folder(tmp_path: Path, plan: Plan, trial_fn: TrialFunction) -> RunFolder:
    return runner(tmp_path).start(plan, trial_fn).folder


def write(folders: list[RunFolder], output: Path | None = None, tiers: TierRegistry = TIERS) -> Path:
    return report.write_report(folders, tiers, output)


def loaded(folder: RunFolder) -> Run:
    return Run.load(folder)


@pytest.fixture(scope="module")
def pristine_claim_run(tmp_path_factory: pytest.TempPathFactory) -> RunFolder:
    """One claim run, built once through the real protocol; tests get copies they may change."""
    root = tmp_path_factory.mktemp("pristine")
    return run_folder(root, make_plan(), scripted(FIGURES, {"baseline": PEAK, "candidate": PEAK}))


def copy_run(pristine: RunFolder, where: Path) -> RunFolder:
    target = where / pristine.path.name
    shutil.copytree(pristine.path, target)
    return RunFolder(target)


@pytest.fixture
def claim_run(pristine_claim_run: RunFolder, tmp_path: Path) -> RunFolder:
    return copy_run(pristine_claim_run, tmp_path / "runs")


def reduction_text(baseline: list[float], candidate: list[float]) -> str:
    """The reduction clause computed by hand from the figures: the median reduction (odd counts), then the
    geometric mean and (min–max) of the paired reductions."""
    values = sorted((b - c) / b for b, c in zip(baseline, candidate, strict=True))
    ratios = [c / b for b, c in zip(baseline, candidate, strict=True)]
    geometric = 1 - math.prod(ratios) ** (1 / len(ratios))
    return (
        f"{100 * values[len(values) // 2]:.2f}% (median; geometric mean {100 * geometric:.2f}%, range "
        f"{100 * values[0]:.2f}–{100 * values[-1]:.2f}%)"
    )


# --- every section, every plot ---------------------------------------------------------------------------


def test_report_has_every_section_and_both_plots(claim_run: RunFolder) -> None:
    path = write([claim_run])
    assert path == claim_run.path / "report.md"
    text = path.read_text(encoding="utf-8")
    for heading in (
        "# musgd-bench report: fixture",
        "## Summary",
        "## Environment",
        "### Protocol",
        "### Results",
        "### Verdict",
        "### Design diagnostics",
        "### Stability",
        "### Planning",
        "### Failed trials",
        "### Caveats",
        "### Plots",
    ):
        assert heading in text, heading
    plan = loaded(claim_run).plan
    assert f"Date: {plan.created[:10]}" in text
    assert "```sh\nbench fixture --steps 384 --pairs 3 --bar 8\n```" in text
    for field in (
        "| GPU |",
        "| driver |",
        "| CUDA runtime (torch build) |",
        "| cuDNN |",
        "| torch |",
        "| Python |",
        "| CPU |",
        "| git revision |",
        "GPU clocks, temperature, power at start",
        "| … at end |",
    ):
        assert field in text, field
    assert "not recorded" in text  # this machine has no nvidia-smi / driver: said, never guessed
    for phrase in (
        "2 warm-up trials",
        "discarded from every statistic",
        "then 3 pairs",
        "counterbalanced order (AB, BA, AB)",
        "Isolation: each trial in a fresh worker process",
        "Timed region: the whole fit, synchronized at both ends",
        "memory budget: none",
        "seed 0",
        "Estimate, interval and checks per claim: see `docs/statistics.md`.",  # the methods, explained once
        "| sign-test interval of the median | sign verdict | Hodges-Lehmann, Wilcoxon interval |",
        "Verdicts against the 8% bar read the interval as the verdict table of `docs/methods.md` says.",
        "After a resume, or an idle gap of more than 10 s",
    ):
        assert phrase in text, phrase
    assert "| peak allocated (median) | peak reserved (median) |" in text
    for explained_once in (
        "median of the Walsh averages",
        "pooled two-sample t interval",
        "Thresholds: max/min",
        "`clears` when the whole interval lies above it",  # docs/methods.md holds the verdict rule
    ):
        assert explained_once not in text, explained_once  # docs/statistics.md holds the methods
    assert "fixture tier: not a training claim. Its figures are scripted." in text
    assert (
        "insufficient: candidate vs baseline's order-statistic interval does not keep the stated 95% with 3 pairs."
        in text
    )
    assert "95% needs 5" in text and "**insufficient**" in text
    assert "| candidate vs baseline | 3 / 0 (**unbalanced**) |" not in text  # AB, BA, AB: 2 / 1
    assert "2 / 1 (**unbalanced**)" in text and "odd pairs: candidate vs baseline ran second in 2" in text
    assert "bench plan " in text and "pairs to run" in text
    assert "None: every logged trial finished." in text
    for name in ("timeline.png", "reductions.png"):
        png = claim_run.path / "report-figures" / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert f"](report-figures/{name})" in text


def test_claim_sentence_in_the_project_form(claim_run: RunFolder) -> None:
    run = loaded(claim_run)
    plan, summaries = run.plan, run.summaries
    sentence = run_view.claim_sentence(plan, summaries, "yolo26n", "candidate")
    expected = (
        "Baseline median 89.448 s (88.765–89.646); candidate 79.183 s (77.799–79.660). The paired reduction "
        f"is {reduction_text(FIGURES['baseline'], FIGURES['candidate'])}, with the same 809.9 MiB peak "
        "allocated."
    )
    assert sentence == expected
    assert sentence in write([claim_run]).read_text(encoding="utf-8")


def test_one_pair_is_its_own_reduction_and_the_pairs_are_said_in_words(tmp_path: Path) -> None:
    """One pair has no geometric mean over pairs to call 'the paired reduction' (it read 'n/a'): the sentence
    gives that pair's reduction. The protocol line says '1 pair', '3 pairs', or the stopping rule's count."""
    plan = make_plan(pairs=1, warmup=0)
    folder = run_folder(tmp_path, plan, scripted({"baseline": [10.0], "candidate": [8.0]}))
    run = loaded(folder)
    sentence = run_view.claim_sentence(run.plan, run.summaries, "yolo26n", "candidate")
    assert "The one pair's reduction is 20.00%" in sentence and "n/a" not in sentence
    assert run_view.pairs_words(run.plan, run.summaries.trials) == "1 pair"
    three = loaded(run_folder(tmp_path / "three", make_plan(warmup=0), scripted(FIGURES)))
    assert run_view.pairs_words(three.plan, three.summaries.trials) == "3 pairs"
    auto = make_plan(warmup=0)
    auto.protocol = dataclasses.replace(auto.protocol, pairs="auto", precision=2.0, max_pairs=12)
    assert (
        run_view.pairs_words(auto, three.summaries.trials)
        == "pairs by the stopping rule (3 so far, at most 12)"
    )


def test_claim_sentence_with_different_peaks_other_labels_and_no_peaks(tmp_path: Path) -> None:
    figures = {"upstream": FIGURES["baseline"], "candidate": FIGURES["candidate"]}
    plan = make_plan(arms=("upstream", "candidate"))
    folder = run_folder(tmp_path, plan, scripted(figures, {"upstream": PEAK, "candidate": 851_763_200}))
    run = loaded(folder)
    plan, summaries = run.plan, run.summaries
    sentence = run_view.claim_sentence(plan, summaries, "yolo26n", "candidate")
    assert sentence.startswith("Upstream median 89.448 s (88.765–89.646); candidate 79.183 s")
    assert sentence.endswith("with peak allocated 809.9 MiB vs 812.3 MiB (+0.3%).")

    bare = run_folder(tmp_path / "bare", make_plan(), scripted(FIGURES))
    run = loaded(bare)
    plan, summaries = run.plan, run.summaries
    sentence = run_view.claim_sentence(plan, summaries, "yolo26n", "candidate")
    assert sentence.endswith(
        f"The paired reduction is {reduction_text(FIGURES['baseline'], FIGURES['candidate'])}."
    )


def test_same_inputs_same_markdown_byte_for_byte(claim_run: RunFolder, tmp_path: Path) -> None:
    first = write([claim_run]).read_bytes()
    pngs = {p.name: p.read_bytes() for p in (claim_run.path / "report-figures").iterdir()}
    second = write([claim_run]).read_bytes()
    assert first == second
    assert pngs == {p.name: p.read_bytes() for p in (claim_run.path / "report-figures").iterdir()}
    # The same report written elsewhere differs only in where its figures live.
    elsewhere = write([claim_run], tmp_path / "out" / "report.md").read_bytes()
    assert elsewhere == first


# --- failures, controls, interruptions ---------------------------------------------------------------------


def test_failed_trials_are_shown_with_bytes_or_message(tmp_path: Path) -> None:
    figures = {"baseline": [10.0, 10.0, 10.0], "candidate": [8.0, "oom", "error"]}
    folder = run_folder(tmp_path, make_plan(), scripted(figures))
    text = write([folder]).read_text(encoding="utf-8")
    assert "Out of memory (`resource_failure`)" in text
    # requested, total, free, allocated, reserved (= allocated + reserved-but-unallocated), budget
    assert "| 2.00 GiB | 139.81 GiB | 1.15 GiB | 21.90 GiB | 22.96 GiB | n/a |" in text
    assert "`RuntimeError: worker died | exit status -9 while loading the batch`" in text
    assert "failures: 2 measured trials failed and count as infinitely slow." in text
    assert "2 of 3 candidate trials failed and count as infinitely slow." in text
    assert "-∞" in text  # a pair whose candidate failed has reduction -∞, shown, not dropped


def test_a_control_says_it_is_the_noise_floor(tmp_path: Path, no_gc) -> None:
    figures = {"baseline": [10.0, 10.1, 9.9] * 11, "baseline-control": [10.05, 10.0, 10.0, 10.02] * 8}
    folder = run_folder(tmp_path, make_plan(control=True, pairs=32), scripted(figures))
    text = write([folder]).read_text(encoding="utf-8")
    assert "# musgd-bench report: fixture A/A control" in text
    assert "A/A control: it measures the noise floor, not a speed-up." in text
    assert "The first arm ran against itself" in text and "difference" in text
    assert "This run is an A/A control" in text
    # The plan's --bar 8 is, for a control of one arm, the tolerance ±8%: the differences lie inside it.
    assert (
        "Verdicts against the ±8% tolerance read the interval as the verdict table of `docs/methods.md`"
        in text
    )
    assert (
        "| ±8% | **within** |" in text
        and "lies inside the ±8% tolerance: the noise floor is within it" in text
    )
    # with three pairs the same control can only say it cannot tell
    few = run_folder(tmp_path / "few", make_plan(control=True), scripted(figures))
    assert "| ±8% | **insufficient** |" in write([few]).read_text(encoding="utf-8")


def claim_with_control_plan(warmup: int, pairs: int) -> Plan:
    """``--arms baseline,candidate --control``: a claim and its A/A arm in one schedule (bar 8%, ±2%)."""
    arms = (
        Arm("baseline", "baseline", "baseline"),
        Arm("candidate", "candidate", "candidate"),
        Arm("baseline-control", "candidate", "baseline"),
    )
    return Plan(
        tier="fixture",
        protocol=ProtocolOptions(arms, warmup=warmup, pairs=pairs, bar=8.0, control=True, tolerance=2.0),
        unit="s",
        metric="whole-fit wall time",
        cases=[Case("yolo26n", {}, arms)],
    )


def test_a_claim_and_its_control_side_by_side_from_one_run(tmp_path: Path, no_gc) -> None:
    plan = claim_with_control_plan(warmup=0, pairs=32)
    figures = {
        "baseline": [10.0, 10.1, 9.9] * 11,
        "candidate": [8.0, 8.1, 7.9, 8.05] * 8,
        "baseline-control": [10.05, 10.0, 9.95, 10.0] * 8,
    }
    text = write([run_folder(tmp_path, plan, scripted(figures))]).read_text(encoding="utf-8")
    summary = text.split("## Summary", 1)[1].split("## Environment", 1)[0]
    assert "| yolo26n | candidate vs baseline | 32 of 32 |" in summary and "| 8% | **clears** |" in summary
    assert (
        "| yolo26n | baseline-control vs baseline | 32 of 32 |" in summary
        and "| ±2% | **within** |" in summary
    )
    assert "The claim and its noise floor come from one schedule" in summary
    # Beside another run, the runs table calls it both, and only the control's row is tagged a control.
    alone = run_folder(tmp_path / "other", make_plan(), scripted(FIGURES))
    both = run_folder(tmp_path / "again", plan, scripted(figures))
    text = write([both, alone], tmp_path / "two.md").read_text(encoding="utf-8")
    assert "| 1 | `" + both.path.name + "` | fixture | claim + A/A control |" in text
    assert "| 2 | `" + alone.path.name + "` | fixture | claim |" in text
    assert "# musgd-bench report: fixture claim + A/A control + fixture" in text
    assert "| 1 | yolo26n | candidate vs baseline |" in text
    assert "| 1 (A/A control) | yolo26n | baseline-control vs baseline |" in text
    assert "## Run 1: fixture (claim + A/A control)" in text
    assert "(A/A control, within)" in summary and "(clears)" in summary
    assert "counterbalanced order (ABC, BCA, CAB, CBA, ACB, BAC, …)" in text


def test_the_runs_table_says_what_the_gate_exits_per_folder(tmp_path: Path) -> None:
    """A side-by-side report gives each run the exit status `--gate` gives its folder: 0, or 1 with why.

    It says a diagnostic run is not gated, so a reviewer reads the gate without re-running anything.
    """
    passing_plan = make_plan(arms=("baseline", "candidate"), pairs=32, warmup=0)
    passing = run_folder(
        tmp_path / "passing",
        passing_plan,
        scripted({"baseline": [10.0, 10.1, 9.9, 10.0] * 8, "candidate": [8.0, 8.1, 7.9, 8.05] * 8}),
    )
    failing = run_folder(tmp_path / "failing", make_plan(), scripted(FIGURES))  # 3 pairs: insufficient
    stages = BaseTier("fixture-stages", diagnostic=True)
    tiers = TierRegistry([FIXTURE, stages])
    diagnostic = (
        Runner(tiers, RunOptions(out=tmp_path / "diag", quiet=True))
        .start(make_plan(tier="fixture-stages"), scripted(FIGURES))
        .folder
    )
    assert Run.load(passing).gate_failures() == []
    why = Run.load(failing).gate_failures()
    assert why == ["candidate vs baseline (claim): insufficient"]
    text = write([passing, failing, diagnostic], tmp_path / "three.md", tiers).read_text(encoding="utf-8")
    rows = {line.split(" | ")[1].strip("`"): line for line in text.splitlines() if line.startswith("| ")}
    assert rows[passing.path.name].endswith("| exit 0 |")
    assert rows[failing.path.name].endswith("| exit 1 |")
    assert rows[diagnostic.path.name].endswith("| n/a (diagnostic) |")
    assert "| trials logged | `--gate` |" in text
    assert (
        f"\n- run 2 exits 1: {why[0]}.\n" in text and "run 1 exits" not in text and "run 3 exits" not in text
    )


def test_both_failed_pairs_are_left_out_and_counted_in_the_report(tmp_path: Path) -> None:
    figures = {"baseline": [10.0, "oom", 10.0, 10.1], "candidate": [8.0, "oom", 8.1, 7.9]}
    folder = run_folder(tmp_path, make_plan(pairs=4, warmup=0), scripted(figures))
    text = write([folder]).read_text(encoding="utf-8")
    assert "1 pair of candidate vs baseline left out: both arms failed." in text
    assert "| 3 of 4 (+1 both failed, left out) |" in text
    claims = loaded(folder).summaries.claims.iloc[0]
    assert claims["pairs"] == 3 and claims["both_failed"] == 1


def test_checks_that_disagree_with_the_primary_are_said(tmp_path: Path) -> None:
    """Ten clear pairs, one with a hiccup (13 s against 10): the median's interval clears the 8% bar.

    The geometric-mean t and Hodges-Lehmann, widened by the hiccup (the t to [5.9%, 25.0%]), are ambiguous.
    The report says so.
    """
    figures = {
        "baseline": [10.0, 10.1, 9.9, 10.0, 10.05, 9.95, 10.0, 10.1, 9.9, 10.0],
        "candidate": [8.0, 8.1, 7.9, 8.05, 7.95, 8.0, 8.1, 7.9, 8.05, 13.0],
    }
    folder = run_folder(tmp_path, make_plan(pairs=10, warmup=0), scripted(figures))
    text = write([folder]).read_text(encoding="utf-8")
    assert (
        "checks disagree: for candidate vs baseline the primary says clears, the geometric-mean t ambiguous, "
        "Hodges-Lehmann ambiguous." in text
    )
    assert "The checks disagree: the geometric-mean t says ambiguous ([5.88%, 24.98%]" in text
    assert "| 5 / 5 (balanced) |" in text


def test_a_sign_test_that_disagrees_with_the_primary_is_said(tmp_path: Path, capsys) -> None:
    """26 pairs, 8 of them 3% faster and 18 of them 20%: the t interval and Hodges-Lehmann clear 5%.

    The sign-test interval of the median (order statistics 8 and 19) reaches down to 3%: ambiguous. The report
    and the console say so, as the README promises for both checks.
    """
    slow = {3, 7, 8, 12, 16, 19, 22, 25}
    candidate = [9.7 + 0.001 * r if r in slow else 8.0 + 0.001 * r for r in range(26)]
    folder = run_folder(
        tmp_path, make_plan(pairs=26, warmup=0), scripted({"baseline": [10.0] * 26, "candidate": candidate})
    )
    claim = loaded(folder).summaries.claims.iloc[0]
    assert (claim["verdict"], claim["hl_verdict"], claim["sign_verdict"]) == ("clears", "clears", "ambiguous")
    text = write([folder]).read_text(encoding="utf-8")
    assert (
        "checks disagree: for candidate vs baseline the primary says clears, the sign test ambiguous." in text
    )
    assert "The checks disagree: the sign test says ambiguous" in text
    print_summary(loaded(folder).plan, loaded(folder).summaries)
    assert "the sign test says" not in capsys.readouterr().out  # method detail: the report only


def test_an_unstable_run_is_flagged_on_the_console_and_in_the_report(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A quiet machine's load, whatever this one's: on a loaded one the load flag joined the spread's and the
    # caveats were condensed into a count, so the test failed only under load.
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    figures = {"baseline": [55.0, 54.5, 55.3], "candidate": [14.9, 140.4, 31.0]}  # one arm's 9x spread
    folder = runner(tmp_path).start(make_plan(warmup=0), scripted(figures)).folder
    err = capsys.readouterr().err
    assert "unstable: candidate: max/min 9.42 > 1.5 (flagged trials are kept)" in err
    text = write([folder]).read_text(encoding="utf-8")
    assert "- **candidate: max/min 9.42 > 1.5**" in text  # the stability section
    assert "unstable: candidate: max/min 9.42 > 1.5." in text  # and a caveat
    assert loaded(folder).summaries.arms.set_index("arm").loc["candidate", "trials"] == 3  # kept


def test_a_run_resumed_on_another_machine_says_so(claim_run: RunFolder) -> None:
    """Each slice's machine is its boot and its cards.

    A resume on another boot or card is named in the environment table and in the caveats; one on the same
    machine says so too.
    """
    record = claim_run.read_json("env.json")
    card = {"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771.0, "uuid": "GPU-aaaa"}
    record.update(boot_id="boot-one", gpus_start=[card])
    record["resumes"] = [
        {"recorded": "2026-12-01T16:02:27+00:00", "boot_id": "boot-one", "gpus": [card]},
        {
            "recorded": "2026-12-02T09:00:00+00:00",
            "boot_id": "boot-two",
            "gpus": [{**card, "uuid": "GPU-bbbb"}],
        },
    ]
    claim_run.write_json("env.json", record)
    text = write([claim_run]).read_text(encoding="utf-8")
    assert "| machine (boot, GPUs) at start | boot `boot-one`, GPU 0 `GPU-aaaa` |" in text
    assert "| … at resume 1 | the same machine |" in text
    assert "| … at resume 2 | another machine: boot `boot-two`, GPU 0 `GPU-bbbb` |" in text
    assert "spans machines: resume 2 ran on another machine (boot `boot-two`, GPU 0 `GPU-bbbb`)." in text


def test_a_resume_records_its_machine(claim_run: RunFolder) -> None:
    log = claim_run.file(LOG)
    log.write_text("".join(log.read_text(encoding="utf-8").splitlines(keepends=True)[:5]), encoding="utf-8")
    runner(claim_run.path.parent.parent).resume(claim_run.path, scripted(FIGURES))
    (resume,) = claim_run.read_json("env.json")["resumes"]
    assert resume["boot_id"] == claim_run.read_json("env.json")["boot_id"]
    text = write([claim_run]).read_text(encoding="utf-8")
    assert "| … at resume 1 | the same machine |" in text and "spans machines" not in text


def test_a_resume_records_its_code_and_a_run_spanning_revisions_says_so(
    claim_run: RunFolder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume records the revision it runs, and a run whose slices ran other code says so."""
    record = claim_run.read_json("env.json")
    record.update(git_revision="aaaa111", git_dirty=False)
    claim_run.write_json("env.json", record)
    log = claim_run.file(LOG)
    log.write_text("".join(log.read_text(encoding="utf-8").splitlines(keepends=True)[:5]), encoding="utf-8")
    monkeypatch.setenv("BENCH_GIT_REVISION", "bbbb222")
    monkeypatch.setenv("BENCH_GIT_DIRTY", "0")
    runner(claim_run.path.parent.parent).resume(claim_run.path, scripted(FIGURES))
    (resume,) = claim_run.read_json("env.json")["resumes"]
    assert resume["git_revision"] == "bbbb222" and resume["git_dirty"] is False
    text = write([claim_run]).read_text(encoding="utf-8")
    assert "| … code at resume 1 | `bbbb222`, clean (another revision) |" in text
    assert "spans code revisions: resume 1 ran `bbbb222`, the run started at `aaaa111`." in text


def test_a_resume_at_the_start_revision_adds_no_caveat(claim_run: RunFolder, monkeypatch) -> None:
    record = claim_run.read_json("env.json")
    record.update(git_revision="aaaa111", git_dirty=False)
    record["resumes"] = [
        {"recorded": "2026-12-01T16:02:27+00:00", "git_revision": "aaaa111", "git_dirty": False}
    ]
    claim_run.write_json("env.json", record)
    text = write([claim_run]).read_text(encoding="utf-8")
    assert "| … code at resume 1 | the same revision |" in text and "spans code revisions" not in text


def test_a_resumed_run_with_an_extra_warmup_is_complete(claim_run: RunFolder) -> None:
    log = claim_run.file(LOG)
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    log.write_text("".join(lines[:5]), encoding="utf-8")  # 2 warm-ups, pair 0, half of pair 1
    runner(claim_run.path.parent.parent).resume(claim_run.path, scripted(FIGURES))
    rows = claim_run.rows()
    assert len(rows) == 9 and rows[5]["phase"] == "warmup" and rows[5]["index"] == 8
    text = write([claim_run]).read_text(encoding="utf-8")
    assert "interrupted:" not in text and "1 extra warm-up ran outside the schedule: resume (1)." in text
    assert "8 of 8 scheduled trials (+1 extra warm-up) in the log" in text


def test_an_interrupted_run_says_how_far_it_got(tmp_path: Path) -> None:
    plan = make_plan(pairs=4, warmup=2)
    # Schedule: 2 warm-ups, then pairs at indices 2-3, 4-5, 6-7, 8-9; stop when trial 7 starts.
    with pytest.raises(KeyboardInterrupt):
        run_folder(tmp_path, plan, scripted({"baseline": [10.0] * 4, "candidate": [8.0] * 4}, stop_at=7))
    folder = RunFolder(next((tmp_path / "runs").iterdir()))
    text = write([folder]).read_text(encoding="utf-8")
    assert "interrupted: 2 of 4 pairs." in text
    assert "7 of 10 scheduled trials are in the log" in text
    assert (folder.path / "report-figures" / "timeline.png").is_file()
    # Resumed to the end, the same folder reads as complete, and says it was resumed.
    runner(tmp_path).resume(folder.path, scripted({"baseline": [10.0] * 4, "candidate": [8.0] * 4}))
    text = write([folder]).read_text(encoding="utf-8")
    assert "interrupted:" not in text
    assert (
        "The run was resumed 1 time; the log holds each scheduled trial at most once (none re-run)." in text
    )
    assert "| … at resume 1 (" in text
    # A trial logged twice (a row with the same index appended again) is refused: it would count twice.
    folder.append_row(folder.rows()[-1])
    with pytest.raises(CorruptRunFolder, match="is logged twice"):
        write([folder])


def test_environment_of_a_gpu_run(claim_run: RunFolder) -> None:
    """An env.json shaped as harness.env.collect writes it on an H200 (clocks read again at the end)."""
    env = claim_run.read_json("env.json")
    env.update(
        cuda_available=True,
        gpu_count=1,
        gpu_names=["NVIDIA H200"],
        gpu_memory_bytes=[150_119_841_792],
        driver_version="580.159.04",
        cudnn=91002,
        git_revision="0123abc",
        git_dirty=True,
        gpus_start=[H200_GPU],
        gpus_end=[{**H200_GPU, "sm_clock_mhz": 1755.0, "temperature_c": 61.0, "power_w": None}],
    )
    claim_run.write_json("env.json", env)
    text = write([claim_run]).read_text(encoding="utf-8")
    assert "| GPU | 1 × NVIDIA H200 (139.81 GiB) |" in text
    assert "| driver | 580.159.04 |" in text
    assert "| cuDNN | 9.10.2 (91002) |" in text
    assert "GPU 0: SM 1980 MHz, memory 3201 MHz, 34 °C, 118.5 W |" in text
    assert "| … at end | GPU 0: SM 1755 MHz, memory 3201 MHz, 61 °C, power not recorded |" in text
    assert "| git revision | `0123abc`, dirty (uncommitted changes) |" in text
    assert "uncommitted changes: the code differed from its git revision." in text


def test_a_truncated_log_reads_as_interrupted(claim_run: RunFolder) -> None:
    log = claim_run.file(LOG)
    lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
    log.write_text("".join(lines[:5]), encoding="utf-8")  # 2 warm-ups, pair 0, half of pair 1
    text = write([claim_run]).read_text(encoding="utf-8")
    assert "interrupted: 1 of 3 pairs." in text


def test_a_run_with_no_trial_yet_still_reports(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        run_folder(tmp_path, make_plan(), scripted(FIGURES, stop_at=0))
    folder = RunFolder(next((tmp_path / "runs").iterdir()))
    text = write([folder]).read_text(encoding="utf-8")
    assert "interrupted: 0 of 3 pairs." in text
    assert "No measured trial in the log" in text
    assert "No complete pair in any run: no claim can be made." in text


# --- several runs side by side ---------------------------------------------------------------------------


def test_two_runs_side_by_side(claim_run: RunFolder, tmp_path: Path) -> None:
    control = run_folder(
        tmp_path / "control",
        make_plan(control=True),
        scripted({"baseline": [10.0, 10.1, 9.9], "baseline-control": [10.05, 10.0, 10.0]}),
    )
    out = tmp_path / "reports" / "claim-and-control.md"
    path = write([claim_run, control], out)
    assert path == out
    text = out.read_text(encoding="utf-8")
    assert "## Run 1: fixture" in text and "## Run 2: fixture (A/A control)" in text
    assert "| field | run 1 | run 2 |" in text
    summary = text.split("## Summary", 1)[1].split("## Environment", 1)[0]
    assert "| 1 | yolo26n | candidate vs baseline | 3 of 3 |" in summary
    assert "| 2 (A/A control) | yolo26n | baseline-control vs baseline | 3 of 3 |" in summary
    assert "Run 2 is an A/A control." in summary
    for k in (1, 2):
        assert (out.parent / f"claim-and-control-figures-{k}" / "timeline.png").is_file()
        assert f"](claim-and-control-figures-{k}/reductions.png)" in text
    with pytest.raises(InputError, match="name it with -o"):
        write([claim_run, control])


def test_a_claim_with_its_control_but_no_pair_yet_is_not_called_an_a_a_control(
    claim_run: RunFolder, tmp_path: Path
) -> None:
    """A claim with `--control` held at its warm-up has no pair: it is never called an A/A control measuring
    the noise floor.
    """
    plan = claim_with_control_plan(warmup=1, pairs=3)
    figures = {"baseline": [10.0] * 3, "candidate": [8.0] * 3, "baseline-control": [10.0] * 3}
    with pytest.raises(KeyboardInterrupt):  # after the warm-up, before the first round
        run_folder(tmp_path / "started", plan, scripted(figures, stop_at=1))
    started = RunFolder(next((tmp_path / "started" / "runs").iterdir()))
    text = write([claim_run, started], tmp_path / "two.md").read_text(encoding="utf-8")
    summary = text.split("## Summary", 1)[1].split("## Environment", 1)[0]
    assert "Run 2 is an A/A control" not in summary
    assert (
        "Run 2 (claim + A/A control) has no complete pair yet: neither its claim nor its noise floor."
        in summary
    )


# --- the tier's own section ------------------------------------------------------------------------------


def test_the_tier_section_is_included(tmp_path: Path) -> None:
    folder = run_folder(tmp_path, make_plan(), scripted(FIGURES))
    text = write([folder]).read_text(encoding="utf-8")
    assert "### Fixture tier section" in text
    assert "| baseline | 89.448 |" in text
    assert "![fixture plot](report-figures/fixture-tier.png)" in text
    assert (folder.path / "report-figures" / "fixture-tier.png").is_file()


def test_a_tier_not_known_here_still_reports_with_the_defaults(claim_run: RunFolder) -> None:
    text = write([claim_run], tiers=TierRegistry()).read_text(encoding="utf-8")
    assert "### Results" in text and "### Fixture tier section" not in text
    assert "fixture tier: not a training claim" not in text


def test_each_project_tier_says_what_its_figures_are_not(claim_run: RunFolder) -> None:
    """The caveat that every tier's report leads with, by tier (the harness names no tier itself)."""
    expected = {
        "screen": "optimizer-only: not a training claim.",
        "probe": "head-only: not a training claim.",
        "pair": "short fit: no accuracy claim.",
        "stages": "diagnostic, not a claim: synchronized at every stage boundary inside the timed region.",
    }
    run = loaded(claim_run)
    for name, headline in expected.items():
        assert PROJECT_TIERS.get(name).caveats(run)[0].headline == headline
    assert PROJECT_TIERS.get("stages").diagnostic and not PROJECT_TIERS.get("pair").diagnostic
    assert not PROJECT_TIERS.get("parity").paired


def test_the_runner_writes_the_report_when_the_run_ends_and_only_then(tmp_path: Path) -> None:
    folder = runner(tmp_path, report=True).start(make_plan(), scripted(FIGURES)).folder
    assert (folder.path / "report.md").is_file()
    assert (folder.path / "report-figures" / "reductions.png").is_file()
    skipped = runner(tmp_path / "quiet").start(make_plan(), scripted(FIGURES)).folder
    assert not (skipped.path / "report.md").exists()


def test_the_report_writes_nothing_but_itself_and_its_figures(claim_run: RunFolder) -> None:
    before = {p.name: p.read_bytes() for p in claim_run.path.iterdir() if p.is_file()}
    write([claim_run])
    after = {
        p.name: p.read_bytes() for p in claim_run.path.iterdir() if p.is_file() and p.name != "report.md"
    }
    assert after == {k: v for k, v in before.items() if k != "report.md"}


# --- `bench report` ----------------------------------------------------------------------------------------


def test_bench_report_happy_path(claim_run: RunFolder, tmp_path: Path, capsys) -> None:
    assert cli.main(["report", str(claim_run.path)]) == 0
    assert (claim_run.path / "report.md").is_file()
    out = tmp_path / "reports" / "named.md"
    assert cli.main(["report", str(claim_run.path), "-o", str(out)]) == 0
    named = out.read_text(encoding="utf-8")
    assert named == (claim_run.path / "report.md").read_text(encoding="utf-8").replace(
        "](report-figures/", "](named-figures/"
    )
    assert (out.parent / "named-figures" / "timeline.png").is_file()
    assert str(out) in capsys.readouterr().out


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no run folder given"),
        (["{missing}"], "is not a run folder: no such directory"),
        (["{plain}"], "is not a run folder: it has no plan.json"),
        (["{run}", "-o", "{tmp}/report.txt"], "is not a markdown file; give a file path ending in .md"),
        (["{run}", "{run}", "-o", "{tmp}/both.md"], "is given twice"),
        (["{run}", "{run2}"], "name it with -o"),
    ],
)
def test_bench_report_bad_inputs(
    args: list[str], message: str, claim_run: RunFolder, tmp_path: Path, capsys
) -> None:
    other = copy_run(claim_run, tmp_path / "second")
    plain = tmp_path / "plain"
    plain.mkdir()
    names = {
        "run": claim_run.path,
        "run2": other.path,
        "missing": tmp_path / "missing",
        "plain": plain,
        "tmp": tmp_path,
    }
    before = _tree(tmp_path)
    capsys.readouterr()
    assert cli.main(["report", *[a.format(**names) for a in args]]) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().count("\n") == 0
    assert _tree(tmp_path) == before  # nothing written, not even the recomputed CSVs


def test_an_auto_run_states_its_stopping_rule_and_looks(tmp_path: Path, no_gc) -> None:
    from tests.harness.test_protocol import AUTO_FIGURES

    arms = (Arm("baseline", "baseline", "baseline"), Arm("candidate", "candidate", "candidate"))
    plan = Plan(
        tier="fixture",
        protocol=ProtocolOptions(arms, warmup=0, pairs="auto", precision=2.0, bar=8.0),
        unit="s",
        metric="whole-fit wall time",
        cases=[Case("yolo26n", {}, arms)],
    )
    text = write([run_folder(tmp_path, plan, scripted(AUTO_FIGURES))]).read_text(encoding="utf-8")
    assert "Stopping rule (`--pairs auto --precision 2`): at pre-set looks [6, 10, 14, 20]" in text
    assert "Looks taken: 6 pairs: precision not reached by every claim;" in text
    assert "14 pairs: every claim's precision reached." in text
    assert "| 14 of auto (≤ 20) |" in text and "stopping-rule order-statistic" in text


def test_an_aa_in_effect_is_named_first_and_its_verdict_withheld(tmp_path: Path) -> None:
    """A candidate that ran the baseline's code (the candidate on the CPU) is named so first.

    The title, the summary's first line, every verdict cell and a caveat say so; the figures are still shown.
    """
    from experiments.arms import arm_code

    plan = make_plan()
    plan.arm_code = arm_code(plan.cases, plan.protocol.device)  # candidate on the CPU
    folder = run_folder(tmp_path, plan, scripted(FIGURES))
    text = write([folder]).read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "# musgd-bench report: fixture (an A/A in effect: the arms ran the same code on cpu)"
    summary = lines[lines.index("## Summary") + 2]
    assert summary.startswith("An A/A in effect on cpu: every compared arm ran the baseline's code")
    verdict = str(loaded(folder).summaries.claims["verdict"].iloc[0])
    assert f"**{verdict}**" not in text and text.count("**withheld**") == 3  # summary, results, verdict
    assert "measures noise, not a speed-up" in text
    assert "- an A/A in effect: candidate ran the baseline's code on cpu; its verdict is withheld." in text
    assert reduction_text(FIGURES["baseline"], FIGURES["candidate"]) in text


# --- the steady-state figure's own statistics and --warmup auto's phases ----------------------------------------

COMMITTED = ROOT / "reports"


def _committed_copy(name: str, where: Path) -> RunFolder:
    target = where / Path(name).name
    shutil.copytree(COMMITTED / name, target, ignore=shutil.ignore_patterns("trials", "report-figures"))
    return RunFolder(target)


def test_a_fit_run_with_steady_figures_gets_its_own_claims_table_beside_the_claim(tmp_path: Path) -> None:
    from experiments.fit.report import STEADY_CLAIMS_CSV
    from harness.stats import secondary_claims

    folder = _committed_copy("archive/h200-2026-12-01/aa-placed-sequential-384", tmp_path)
    claims_before = pd.read_csv(folder.file("claims.csv"))
    run = Runner(PROJECT_TIERS).finish(folder)
    written = pd.read_csv(folder.file(STEADY_CLAIMS_CSV))
    expected = secondary_claims(run.summaries.trials, run.plan.protocol, "steady_s")
    assert written["estimate"].to_numpy() == pytest.approx(expected["estimate"].to_numpy())
    assert written["verdict"].tolist() == expected["verdict"].tolist() == ["insufficient"]
    # the claim is still the whole fit: the same pairs as committed (the primary's method changed since)
    claims_after = pd.read_csv(folder.file("claims.csv"))
    assert claims_after[["pairs", "min", "max"]].equals(claims_before[["pairs", "min", "max"]])
    assert claims_after["estimate"].to_numpy() != pytest.approx(written["estimate"].to_numpy())
    # the gate reads the whole-fit claims only: a steady table that cleared would not change it
    assert run.gate_failures() == ["candidate-control vs candidate (control): insufficient"]
    claim = folder.file("claim.txt").read_text()
    assert "Secondary, not the claim: the steady-state figure" in claim
    text = report.write_report([folder], PROJECT_TIERS).read_text()
    section = text.split("### Steady-state figure (secondary: the whole fit stays the claim)")[1]
    # the section names the method its table used (its prose once said "calibrated t" beside an order-statistic table)
    assert f"{method_label(expected.iloc[0])}: " in section and "insufficient (the ±1% tolerance)" in section
    assert "calibrated t" not in section and "| median reduction |" in section
    assert f"{100 * expected['estimate'].iloc[0]:.2f}%" in section and STEADY_CLAIMS_CSV in section


def test_a_stages_run_of_the_same_comparison_bounds_a_claim_in_one_report(tmp_path: Path) -> None:
    """Per claim, the report says what a stages run of the same fit and implementations gives: the ceiling and
    the implied saving.

    A stages run of another comparison bounds nothing.
    """
    from experiments.fit.report import claim_bounds

    claim = _committed_copy("h200-decisive/upstream/pair-20261201-135230-647b", tmp_path)
    stages = _committed_copy("h200-decisive/stages-upstream/stages-20261201-155945-55eb", tmp_path)
    other = _committed_copy("h200-decisive/stages-baseline/stages-20261201-134525-37c8", tmp_path)
    text = report.write_report([claim, stages], PROJECT_TIERS, tmp_path / "r.md").read_text()
    bounded = [line for line in text.splitlines() if "bounded by" in line]
    assert bounded == [
        "Run 1: bounded by run 2 (stages): candidate vs upstream (10.41%): upstream's optimizer step is 14.09% "
        "of its fit there (the most an optimizer-only change can save), and the optimizer stages' difference "
        "implies 9.30% (66.00% of that ceiling)."
    ]
    assert claim_bounds(Run.load(claim), [Run.load(other)]) == []  # baseline vs candidate: not this claim


def test_a_fit_run_without_steady_figures_has_no_steady_table(tmp_path: Path) -> None:
    from experiments.fit.report import STEADY_CLAIMS_CSV

    folder = _committed_copy("archive/h200-2026-11-29/pair-yolo26n-384", tmp_path)
    Runner(PROJECT_TIERS).finish(folder)
    assert not folder.file(STEADY_CLAIMS_CSV).exists()
    assert "Steady-state figure" not in report.write_report([folder], PROJECT_TIERS).read_text()


def test_the_report_shows_each_warmup_phase_and_whether_it_settled(tmp_path: Path, monkeypatch) -> None:
    from harness import protocol as protocol_module
    from tests import trialfns

    monkeypatch.setattr(protocol_module, "_release_device_memory", lambda: None)
    settled = trialfns.plan_of(
        "warming",
        warmup="auto",
        pairs=2,
        warmups={"baseline": [12.0, 10.0], "candidate": [9.0, 8.98]},
        measured={"baseline": 10.0, "candidate": 8.0},
    )
    folder = trialfns.runner(tmp_path / "a").start(settled).folder
    text = report.write_report([folder], trialfns.TIERS).read_text()
    assert "Warm-up sequences (`--warmup auto`), warm-ups each: start 4 (settled)." in text
    assert "until one is at most 0.5% faster than its arm's previous" in text
    assert "never settled" not in text
    assert run_view.warmup_words(loaded(folder).plan, loaded(folder).summaries.trials).endswith(
        "start 4 (settled)"
    )
    never = trialfns.plan_of(
        "warming",
        warmup="auto",
        pairs=2,
        max_warmup=4,
        warmups={"baseline": [12.0, 11.0], "candidate": [9.0, 8.0]},  # each warm-up faster: never settled
        measured={"baseline": 10.0, "candidate": 8.0},
    )
    folder = trialfns.runner(tmp_path / "b").start(never).folder
    text = report.write_report([folder], trialfns.TIERS).read_text()
    assert "start 4 (never settled)" in text
    assert "warm-ups never settled in 1 sequence: start (4 warm-ups)." in text


def test_fixed_warmups_read_as_before() -> None:
    plan = make_plan(warmup=2)
    assert run_view.warmup_words(plan, pd.DataFrame()) == "2 warm-up fit(s) discarded"
    assert run_view.warmup_sequence_text(plan, pd.DataFrame()) == ""


def test_the_methods_are_explained_once_in_the_statistics_doc_not_in_each_report(tmp_path: Path) -> None:
    """A report names each claim's method and links `docs/statistics.md`, where the explanation lives."""
    figures = {"baseline": [10.0, 10.1], "candidate": [8.0, 8.1]}
    text = write([run_folder(tmp_path, make_plan(pairs=2, warmup=0), scripted(figures))]).read_text("utf-8")
    assert "the earlier primary" not in text and "below 25 pairs" not in text
    assert text.count("`docs/statistics.md`") >= 2 and "Primary method: order statistics 1 and 2 of 2" in text


def test_a_stopping_rule_interval_states_the_rules_coverage_not_its_looks_level() -> None:
    """A stopping rule's interval states the whole rule's least simulated coverage as attained, and its look's
    level as nominal.

    The interval is computed at its look's level, 98% at a middle look. Taken alone at an early stop it covers
    less: a stop for precision picks the narrow samples.
    """
    from harness import sequential
    from harness.formatting import format_levels

    x = [math.log(0.79 + 0.002 * i) for i in range(10)]
    decision = sequential.should_stop(x, precision=50.0, budget_spent=True)
    levels, worst, _ = sequential.look_level(0.95, (6, 10, 14, 20))
    assert decision.interval.nominal_level == levels[1] > 0.95 and decision.interval.attained_level == worst
    claim = {"ci_level": 0.95, "ci_attained": worst, "ci_method": decision.interval.method}
    assert format_levels(claim) == f"95% stated, {100 * worst:.1f}% attained"


def test_every_caveat_carries_a_reason_code(claim_run: RunFolder) -> None:
    """Caveats are data: a headline, a detail and a reason code a tool can filter on (NVBench's reason codes)."""
    from harness.present.caveats import caveats
    from harness.present.run_view import LoadedRun

    run = LoadedRun(**vars(Run.load(claim_run, tiers=TIERS)), tiers=TIERS)
    codes = [c.code for c in caveats(run)]
    assert {"tier", "insufficient", "odd-pairs", "cpu"} <= set(codes), codes
    assert all(code and code == code.lower() and " " not in code for code in codes), codes
