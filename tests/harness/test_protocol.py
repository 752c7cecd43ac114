"""The paired protocol: schedule order, counterbalancing, warm-ups, the log, failures and resume."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.cli import main
from harness.folder_format import LOG, PLAN
from harness.plan import Plan
from harness.protocol import PlannedStop
from harness.schedule import Arm, Case, balanced_block, build_schedule
from harness.tables import RunFolder
from tests.processes import started, wait_for
from tests.trialfns import TWO_ARMS, plan_of, runner

REAL_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
    "1.15 GiB is free. Including non-PyTorch memory, this process has 24.00 GiB memory in use. 24.00 GiB "
    "allowed; Of the allocated memory 21.90 GiB is allocated by PyTorch, and 1.06 GiB is reserved by PyTorch "
    "but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def test_pairs_alternate_ab_ba_after_warmups() -> None:
    schedule = build_schedule([Case("c", {}, TWO_ARMS)], warmup=2, pairs=4)
    phases = [t.phase for t in schedule]
    assert phases == ["warmup"] * 2 + ["measured"] * 8
    assert [t.arm for t in schedule[:2]] == ["baseline", "candidate"]
    measured = schedule[2:]
    assert [t.order for t in measured[::2]] == ["AB", "BA", "AB", "BA"]
    assert [t.arm for t in measured] == [
        "baseline",
        "candidate",
        "candidate",
        "baseline",
        "baseline",
        "candidate",
        "candidate",
        "baseline",
    ]
    # Counterbalanced: each arm runs first in exactly half of the pairs.
    firsts = [t.arm for t in measured if t.slot == 0]
    assert firsts.count("baseline") == firsts.count("candidate") == 2
    assert [t.index for t in schedule] == list(range(len(schedule)))


def test_three_arms_follow_a_balanced_latin_square() -> None:
    """Three arms (a claim and its A/A control, say) follow a Williams square and its mirror: six rounds per
    block.

    Every arm runs in every slot twice, and before each other arm in half the rounds.
    """
    arms = TWO_ARMS + (Arm("baseline-control", "candidate", "baseline"),)
    schedule = build_schedule([Case("c", {}, arms)], warmup=0, pairs=6)
    orders = [schedule[3 * r].order for r in range(6)]
    assert orders == ["ABC", "BCA", "CAB", "CBA", "ACB", "BAC"]
    for arm in ("baseline", "candidate", "baseline-control"):
        assert sorted(t.slot for t in schedule if t.arm == arm) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("arms", [2, 3, 4, 5])
def test_every_block_balances_slots_and_precedence(arms: int) -> None:
    for order in ("alternate", "abba"):
        block = balanced_block(arms, order)
        assert all(sorted(row) == list(range(arms)) for row in block)
        for arm in range(arms):  # each arm in each slot equally often
            slots = [row.index(arm) for row in block]
            assert all(slots.count(k) == len(block) // arms for k in range(arms)), (order, slots)
        for a in range(arms):  # each arm before each other in half the rounds
            for b in range(a + 1, arms):
                before = sum(row.index(a) < row.index(b) for row in block)
                assert 2 * before == len(block), (order, a, b)


def test_abba_mirrors_each_block_of_two_pairs() -> None:
    schedule = build_schedule([Case("c", {}, TWO_ARMS)], warmup=0, pairs=8, order="abba")
    assert [t.order for t in schedule[::2]] == ["AB", "BA", "BA", "AB"] * 2
    # trials A B B A B A A B: the order contrast is orthogonal to a linear drift over each block of 4 pairs
    second = [t.order == "AB" for t in schedule[::2]][:4]  # the candidate (B) ran second
    assert sum(i for i, s in enumerate(second) if s) == sum(i for i, s in enumerate(second) if not s)


def test_random_order_is_seeded_and_complete() -> None:
    cases = [Case("c", {}, TWO_ARMS)]
    first = build_schedule(cases, warmup=0, pairs=20, order="random", seed=7)
    again = build_schedule(cases, warmup=0, pairs=20, order="random", seed=7)
    other = build_schedule(cases, warmup=0, pairs=20, order="random", seed=8)
    assert first == again
    assert [t.arm for t in first] != [t.arm for t in other]
    for r in range(20):
        assert sorted(t.arm for t in first if t.round == r) == ["baseline", "candidate"]


def test_cases_run_one_after_another_each_with_warmups() -> None:
    cases = [Case("n", {}, TWO_ARMS), Case("s", {}, TWO_ARMS)]
    schedule = build_schedule(cases, warmup=1, pairs=1)
    assert [(t.case, t.phase) for t in schedule] == [
        ("n", "warmup"),
        ("n", "measured"),
        ("n", "measured"),
        ("s", "warmup"),
        ("s", "measured"),
        ("s", "measured"),
    ]


def test_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match="alternate, abba, random"):
        build_schedule([Case("c", {}, TWO_ARMS)], 0, 1, order="zigzag")


def test_run_logs_every_trial_with_warmups_flagged(tmp_path: Path) -> None:
    plan = plan_of("sleepy", warmup=2, pairs=3)
    folder = runner(tmp_path).start(plan).folder
    rows = folder.rows()
    assert len(rows) == 8
    assert [r["phase"] for r in rows] == ["warmup"] * 2 + ["measured"] * 6
    assert all(r["status"] == "ok" for r in rows)
    # Both arms of a round see the same seed; warm-ups another.
    by_round = {}
    for r in rows[2:]:
        by_round.setdefault(r["round"], set()).add(r["seed_seen"])
    assert all(len(seeds) == 1 for seeds in by_round.values())
    assert len({next(iter(s)) for s in by_round.values()}) == 3
    for name in ("trials.csv", "arms.csv", "pairs.csv", "claims.csv", "env.json", PLAN):
        assert folder.file(name).is_file(), name
    claims = folder.file("claims.csv").read_text()
    assert "0.2" in claims  # (10 - 8) / 10


def test_failures_are_rows_and_the_run_goes_on(tmp_path: Path) -> None:
    figures = {"baseline": [10, 10, 10], "candidate": [8, "oom", "error"]}
    plan = plan_of("scripted", warmup=0, pairs=3, figures=figures, oom_message=REAL_OOM)
    folder = runner(tmp_path).start(plan).folder
    rows = {(r["arm"], r["round"]): r for r in folder.rows()}
    assert len(rows) == 6
    oom = rows[("candidate", 1)]
    assert oom["status"] == "resource_failure"
    assert oom["oom_requested"] == 2 * 2**30
    assert oom["oom_budget"] == 24 * 2**30
    assert oom["oom_allocated"] == round(21.90 * 2**30)
    assert oom["value"] is None
    error = rows[("candidate", 2)]
    assert error["status"] == "error" and "the trial broke" in error["message"]


def test_plan_round_trips_through_json(tmp_path: Path) -> None:
    plan = plan_of("sleepy", sleep=0.0, cooldown=0.5, bar=3.0)
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan


def _killed_in_trial(runs: Path, start: str, trial: int, setup: str = "") -> RunFolder:
    """The run folder of `start` (a call on `runner`/`plan_of`), run in a real process.

    The process is SIGKILLed while trial `trial` of a `sleepy` plan runs: started, no row yet.
    """
    script = f"import sys; {setup}from tests.trialfns import plan_of, runner; runner(sys.argv[1]).{start}"
    command = [sys.executable, "-c", script, str(runs)]
    with started(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as process:
        wait_for(lambda: runs.is_dir() and any(runs.iterdir()), timeout=60)
        folder = RunFolder(next(runs.iterdir()))
        wait_for(lambda: folder.file(f"started-{trial}").exists() and len(folder.rows()) == trial, timeout=60)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    return folder


def test_resume_after_a_kill_mid_trial_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    """A real process runs the schedule; it is killed (SIGKILL) while a trial is running; resume finishes."""
    runs = tmp_path / "runs"
    # Killed while trial 3 (the fourth) is running: it has started but has no row yet.
    folder = _killed_in_trial(runs, "start(plan_of('sleepy', warmup=2, pairs=4, sleep=0.4))", trial=3)
    before = folder.rows()
    assert [r["index"] for r in before] == [0, 1, 2]

    runner(runs).resume(folder.path)
    after = folder.rows()
    indices = [r["index"] for r in after]
    # every scheduled trial once, plus the resume's warm-up (index 10, outside the schedule) before the
    # rest of the pair the kill cut in half
    assert sorted(indices) == list(range(11)) and len(indices) == len(set(indices))
    assert after[3]["index"] == 10 and after[3]["phase"] == "warmup" and after[4]["index"] == 3
    assert after[:3] == before  # finished trials kept as they were, not re-run
    assert "resumes" in folder.read_json("env.json")


def test_a_run_killed_outright_leaves_tables_that_hold_every_finished_round(tmp_path: Path) -> None:
    """A run killed outright, as when a machine is taken back, leaves tables holding every round that
    finished.
    """
    # Killed while the third round's second trial runs: rounds 1 and 2 have ended, the tables were due.
    folder = _killed_in_trial(
        tmp_path / "runs",
        "start(plan_of('sleepy', warmup=0, pairs=4, sleep=0.3))",
        trial=5,
        setup="import harness.run; harness.run.TABLES_REFRESH_SECONDS = 0.0; ",
    )
    pairs = pd.read_csv(folder.file("pairs.csv"))
    assert sorted(pairs["round"]) == [0, 1]
    trials = pd.read_csv(folder.file("trials.csv"))
    assert sorted(trials["index"]) == [0, 1, 2, 3]


def test_torn_last_line_is_ignored_and_resume_appends_after_it(tmp_path: Path) -> None:
    folder = runner(tmp_path).start(plan_of("sleepy", warmup=0, pairs=2)).folder
    lines = folder.file(LOG).read_text().splitlines(keepends=True)
    # The last trial was being written when its process died: half a line, no newline.
    folder.file(LOG).write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    assert [r["index"] for r in folder.rows()] == [0, 1, 2]
    runner(tmp_path).resume(folder.path)  # the resume's warm-up (index 4), then the rest of the pair
    assert [r["index"] for r in folder.rows()] == [0, 1, 2, 4, 3]
    runner(tmp_path).resume(folder.path)  # nothing left to run: nothing is run again
    assert [r["index"] for r in folder.rows()] == [0, 1, 2, 4, 3]


def test_a_budget_the_device_refuses_leaves_no_run_folder(tmp_path: Path) -> None:
    from harness.errors import InputError

    plan = plan_of("sleepy", warmup=0, pairs=1, budget=2**30)  # a budget on the CPU
    with pytest.raises(InputError, match="needs a CUDA device"):
        runner(tmp_path / "runs").start(plan)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_cooldown_pauses_before_every_trial(tmp_path: Path) -> None:
    """``--cooldown S``: the protocol sleeps S seconds before each trial, so trial starts lie ≥ S apart."""
    folder = runner(tmp_path).start(plan_of("sleepy", warmup=1, pairs=2, cooldown=0.3)).folder
    starts = [os.stat(folder.file(f"started-{i}")).st_mtime for i in range(5)]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= 0.3 - 0.02, gaps  # file times tick in ~ms here; 0.3 s is far above that
    assert folder.read_json(PLAN)["protocol"]["cooldown"] == 0.3


def test_a_plan_of_the_first_format_reads_and_never_imports_its_code(tmp_path: Path) -> None:
    """A plan of the first format names code (factory, sections) and keeps the shared options flat.

    It still reads, with the options gathered into `protocol` and nothing imported.
    """
    old = {
        "tier": "pair",
        "factory": "builtins:print",
        "sections": "builtins:print",
        "unit": "s",
        "metric": "whole-fit wall time",
        "cases": [
            {
                "label": "c",
                "params": {},
                "arms": [
                    {"label": "baseline", "role": "baseline", "spec": "baseline", "params": {}},
                    {"label": "candidate", "role": "candidate", "spec": "candidate", "params": {}},
                ],
            }
        ],
        "warmup": 2,
        "pairs": 3,
        "order": "alternate",
        "seed": 4,
        "bar": 60.0,
        "device": "cuda",
        "budget": None,
        "control": False,
        "options": {"steps": 384},
        "command": "bench pair",
        "schedule": [],
    }
    plan = Plan.from_json(old)
    assert (plan.protocol.warmup, plan.protocol.pairs, plan.protocol.seed, plan.protocol.bar) == (
        2,
        3,
        4,
        60.0,
    )
    assert plan.protocol.device == "cuda" and plan.settings == {"steps": 384}
    assert [a.label for a in plan.protocol.arms] == ["baseline", "candidate"]
    assert "factory" not in plan.to_json() and "sections" not in plan.to_json()


def test_stop_after_stops_before_a_pair_that_would_not_end_in_time(tmp_path: Path) -> None:
    """The untimed first trial (0.3 s) and the first pair (0.6 s) end by 0.9 s.

    The second pair would end past 1.3 s, so the run stops before it.
    """
    plan = plan_of("sleepy", warmup=0, pairs=3, sleep=0.3)
    with pytest.raises(PlannedStop):
        runner(tmp_path, stop_after=1.3).start(plan)
    (folder,) = [RunFolder(p) for p in tmp_path.iterdir()]
    assert 1 <= len(folder.rows()) < 6  # stopped early
    runner(tmp_path).resume(folder.path)
    measured = [r["index"] for r in folder.rows() if r["phase"] == "measured"]
    assert sorted(measured) == list(range(6))


@pytest.mark.parametrize(
    ("stop_after", "runs_a_pair"), [(0.2, False), (0.5, False), (1.1, True), (1.4, True)]
)
def test_a_deadline_inside_a_pair_waits_for_the_pair_or_stops_before_it(
    tmp_path: Path, stop_after: float, runs_a_pair: bool
) -> None:
    """Whatever the deadline, the log never holds half a pair.

    The untimed first trial (0.3 s) gives the estimate. A pair starts only if both its trials end in time: by
    0.9 s for the first pair.
    """
    plan = plan_of("sleepy", warmup=0, pairs=3, sleep=0.3)
    with pytest.raises(PlannedStop):
        runner(tmp_path, stop_after=stop_after).start(plan)
    (folder,) = [RunFolder(p) for p in tmp_path.iterdir()]
    rounds = [r["round"] for r in folder.rows()]
    assert bool(rounds) == runs_a_pair and all(rounds.count(r) == 2 for r in rounds), rounds


def test_a_resume_inside_a_pair_finishes_the_pair_after_a_warmup(tmp_path: Path) -> None:
    """A resume of half a pair first runs one untimed warm-up of the pair's next arm: a row outside the
    schedule.

    It then finishes the pair, even under a deadline that leaves no time for it, and stops before the next
    pair.
    """
    folder = runner(tmp_path).start(plan_of("sleepy", warmup=0, pairs=3, sleep=0.05)).folder
    log = folder.file(LOG)
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:3]))  # round 1 half done
    with pytest.raises(PlannedStop):
        runner(tmp_path, stop_after=0.01).resume(folder.path)
    rows = folder.rows()
    assert [(r["index"], r["phase"]) for r in rows[3:]] == [(6, "warmup"), (3, "measured")]
    warm = rows[3]
    assert warm["arm"] == rows[4]["arm"] == "baseline" and warm["warmup_reason"] == "resume"
    assert {r["round"] for r in rows if r["phase"] == "measured"} == {
        0,
        1,
    }  # round 1 whole, round 2 not begun
    # the schedule is untouched, and a second resume runs the last pair (after its own warm-up)
    assert len(Plan.from_json(folder.read_json(PLAN)).schedule) == 6
    runner(tmp_path).resume(folder.path)
    rows = folder.rows()
    assert sorted(r["index"] for r in rows if r["phase"] == "measured") == list(range(6))
    assert [r["index"] for r in rows if r["phase"] == "warmup"] == [6, 7]


def test_an_idle_gap_gets_a_warmup_before_the_next_measured_trial(tmp_path: Path, monkeypatch) -> None:
    from harness import protocol
    from tests.trialfns import TIERS

    monkeypatch.setattr(protocol, "IDLE_GAP_SECONDS", 0.2)
    plan = plan_of("sleepy", warmup=0, pairs=2, sleep=0.0)
    folder = RunFolder(tmp_path)
    folder.write_json(PLAN, plan.to_json())
    trial_fn = TIERS.get("test").trial_function(plan)
    ends: list[int] = []

    def pause_after_the_first_pair(row: dict) -> None:
        ends.append(row["index"])
        if row["index"] == 1:
            time.sleep(0.3)  # the parent stalls: the machine idles past the gap

    protocol.run_schedule(plan, trial_fn, folder, on_trial_end=pause_after_the_first_pair)
    rows = folder.rows()
    assert [(r["index"], r["phase"]) for r in rows] == [
        (0, "measured"),
        (1, "measured"),
        (4, "warmup"),
        (2, "measured"),
        (3, "measured"),
    ]
    assert rows[2]["warmup_reason"].startswith("idle gap of") and rows[2]["arm"] == rows[3]["arm"]


# --- --pairs auto: the stopping rule drives the schedule ------------------------------------------------------

NOISE = [2.041, -2.556, 0.418, -0.568, -0.453, -0.216, -2.02, -0.232, -0.865, 3.323]
NOISE += [0.226, -0.353, -0.281, -0.668, -1.055, -0.391, 0.482, -0.239, 0.958, -0.2]  # seeded normals
AUTO_FIGURES = {"baseline": [10.0] * 20, "candidate": [8.0 * math.exp(0.03 * z) for z in NOISE]}


def test_pairs_auto_grows_look_by_look_until_the_precision(tmp_path: Path, no_gc) -> None:
    """Log ratios ln 0.8 + 3%·z: the half-width at the looks' levels falls below 2 points at 14 pairs.

    That is the rule's own decision on the same numbers. The schedule grows from the first look's 6 pairs to
    each look: 6, 10, 14, 20. The plan records every decision, and the claim reads the interval of the look it
    stopped at.
    """
    from harness.sequential import should_stop
    from harness.tier import Run

    x = [math.log(c / b) for b, c in zip(AUTO_FIGURES["baseline"], AUTO_FIGURES["candidate"], strict=True)]
    expected = next(n for n in (6, 10, 14, 20) if should_stop(x[:n], 2.0).stop)
    assert expected == 14
    plan = plan_of("scripted", warmup=0, pairs="auto", precision=2.0, figures=AUTO_FIGURES)
    assert len(plan.schedule) == 12  # the first look's 6 pairs
    folder = runner(tmp_path).start(plan).folder
    saved = Plan.from_json(folder.read_json(PLAN))
    assert sorted({t.round for t in saved.schedule}) == list(range(14))
    assert [(d["rounds"], d["stop"]) for d in saved.looks] == [(6, False), (10, False), (14, True)]
    assert saved.looks[-1]["reason"] == "every claim's precision reached"
    assert saved.looks[-1]["claims"]["candidate"]["half_width"] <= 2.0
    assert len([r for r in folder.rows() if r["phase"] == "measured"]) == 28
    claim = Run.load(folder).summaries.claims.iloc[0]
    assert "look 3 of [6, 10, 14, 20]" in claim["ci_method"] and claim["ci_sufficient"]
    assert 100 * (claim["ci_high"] - claim["ci_low"]) / 2 <= 2.0
    # a resume of a cut run continues the same sequence: the decided looks are not taken again
    log = folder.file(LOG)
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:17]))
    runner(tmp_path).resume(folder.path)
    again = Plan.from_json(folder.read_json(PLAN))
    assert again.looks == saved.looks and again.schedule == saved.schedule
    assert len([r for r in folder.rows() if r["phase"] == "measured"]) == 28


def test_pairs_auto_grown_after_a_resumes_warmup_reads_back_and_resumes(tmp_path: Path, no_gc) -> None:
    """A resume's extra warm-up takes the index after the schedule; rounds the stopping rule adds later take
    indices above it.

    The schedule's indices then have a gap. The folder still reads back, reports and resumes.
    """
    from harness.tier import Run

    plan = plan_of("scripted", warmup=1, pairs="auto", precision=2.0, figures=AUTO_FIGURES)
    folder = runner(tmp_path).start(plan).folder
    log = folder.file(LOG)
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:5]))  # the warm-up and two pairs
    cut = Plan.from_json(folder.read_json(PLAN))
    cut.schedule = [t for t in cut.schedule if t.index < 13]  # as it stood before the first look
    cut.looks = []
    folder.write_json(PLAN, cut.to_json())
    runner(tmp_path).resume(folder.path)
    rows = folder.rows()
    (extra,) = [r for r in rows if r.get("warmup_reason") == "resume"]
    saved = Plan.from_json(folder.read_json(PLAN))
    indices = [t.index for t in saved.schedule]
    assert extra["index"] == 13 and 13 not in indices and max(indices) > 13  # the gap
    assert len(set(indices)) == len(indices)
    run = Run.load(folder)  # raised: the schedule's indices were taken for positions
    assert run.summaries.claims.iloc[0]["pairs"] == 14
    assert main(["report", str(folder.path), "-o", str(tmp_path / "r.md")]) == 0
    before = len(rows)
    runner(tmp_path).resume(folder.path)  # nothing left to run
    assert len(folder.rows()) == before


@pytest.mark.parametrize("max_pairs", [6, 12, 20])
def test_pairs_auto_keeps_95_whatever_its_last_look(max_pairs: int) -> None:
    """The look levels are calibrated for the plan run: any last look keeps 95% within 1.5 points on every law
    simulated.

    A run with --max-pairs 12 thus needs no note.
    """
    from harness import intervals, options, sequential

    said: list[str] = []
    options.protocol_options(
        arms="baseline,candidate",
        device="cpu",
        pairs="auto",
        precision=2.0,
        max_pairs=max_pairs,
        announce=said.append,
    )
    assert not [line for line in said if "insufficient" in line], said
    _, worst, best = sequential.look_level(0.95, sequential.looks(6, max_pairs))
    assert intervals.keeps_level(worst) and best <= 0.95 + intervals.WINDOW


def test_pairs_auto_stops_at_the_last_look_when_the_precision_is_out_of_reach(tmp_path: Path, no_gc) -> None:
    plan = plan_of("scripted", warmup=0, pairs="auto", precision=0.01, max_pairs=10, figures=AUTO_FIGURES)
    folder = runner(tmp_path).start(plan).folder
    saved = Plan.from_json(folder.read_json(PLAN))
    assert [(d["rounds"], d["stop"]) for d in saved.looks] == [(6, False), (10, True)]
    assert saved.looks[1]["reason"] == "last look (max pairs)"
    # a target out of reach at the spread measured is said at the first look
    assert "10 pairs reach about" in saved.looks[0]["claims"]["candidate"]["reason"]
    assert saved.looks[0]["reason"].startswith(
        "precision not reached by every claim; candidate: at the spread"
    )


def test_an_aa_controls_target_does_not_hold_a_claims_stop(tmp_path: Path, no_gc) -> None:
    """A control's precision never holds a claim's stop.

    The decisive runs' A/A control needed 170-216 pairs for the claims' 2-point target.
    """
    arms = TWO_ARMS + (Arm("baseline-control", "candidate", "baseline"),)
    noisy = [10.0 * math.exp(0.3 * z) for z in reversed(NOISE)]
    figures = {**AUTO_FIGURES, "baseline-control": noisy}
    plan = plan_of(
        "scripted", warmup=0, pairs="auto", precision=2.0, arms=arms, control=True, figures=figures
    )
    folder = runner(tmp_path).start(plan).folder
    saved = Plan.from_json(folder.read_json(PLAN))
    assert [(d["rounds"], d["stop"]) for d in saved.looks] == [(6, False), (10, False), (14, True)]
    assert not saved.looks[-1]["claims"]["baseline-control"]["stop"]


def test_pairs_auto_stops_at_a_pair_boundary_when_the_time_budget_is_spent(tmp_path: Path, no_gc) -> None:
    plan = plan_of("sleepy", warmup=0, pairs="auto", precision=0.01, time_budget=0.9, sleep=0.1)
    folder = runner(tmp_path).start(plan).folder
    saved = Plan.from_json(folder.read_json(PLAN))
    (decision,) = saved.looks
    assert decision["stop"] and decision["reason"].startswith("time budget spent")
    rows = folder.rows()
    rounds = [r["round"] for r in rows if r["phase"] == "measured"]
    assert 2 <= len(set(rounds)) < 6 and all(rounds.count(r) == 2 for r in rounds)  # whole pairs only
    assert sum(r["trial_seconds"] for r in rows) <= 0.9 + 0.25  # within the budget, less the estimate's error
    assert len(saved.schedule) == len(rows)  # the rounds not run left the schedule: complete, not cut


def test_report_tables_writes_a_folders_tables_again_from_its_log(tmp_path: Path, capsys) -> None:
    """`--tables` writes a folder's tables and `claim.txt` again from its log, as the run's end does.

    It does so under the folder's lock, refused while a run holds it. Without it, the report alone is written.
    A statistic whose code changed then agrees in the report and `claims.csv`.
    """
    folder = runner(tmp_path).start(plan_of("sleepy", warmup=0, pairs=3)).folder
    written = {name: folder.file(name).read_text() for name in ("claims.csv", "pairs.csv", "arms.csv")}
    for name in written:
        folder.file(name).write_text("stale\n")
    assert main(["report", str(folder.path)]) == 0
    assert all(folder.file(name).read_text() == "stale\n" for name in written)
    capsys.readouterr()  # the report's own lines (a steal flag on a shared machine goes to stderr)
    with folder.lock():
        assert main(["report", "--tables", str(folder.path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "in use by another run" in error, error
    assert all(folder.file(name).read_text() == "stale\n" for name in written)
    assert main(["report", "--tables", str(folder.path)]) == 0
    assert {name: folder.file(name).read_text() for name in written} == written
    assert folder.file("report.md").exists()


def test_report_tables_of_several_folders_writes_none_when_one_is_refused(tmp_path: Path, capsys) -> None:
    """Every input is checked before anything is written: with the second folder held by a run, the first
    folder's tables stay as they were."""
    first = runner(tmp_path / "a").start(plan_of("sleepy", warmup=0, pairs=2)).folder
    second = runner(tmp_path / "b").start(plan_of("sleepy", warmup=0, pairs=2)).folder
    first.file("claims.csv").write_text("stale\n")
    with second.lock():
        status = main(["report", "--tables", str(first.path), str(second.path), "-o", str(tmp_path / "r.md")])
    assert status == 2 and "in use by another run" in capsys.readouterr().err
    assert first.file("claims.csv").read_text() == "stale\n" and not (tmp_path / "r.md").exists()
    twice = main(["report", "--tables", str(first.path), str(first.path), "-o", str(tmp_path / "r.md")])
    assert twice == 2 and "is given twice" in capsys.readouterr().err
    assert first.file("claims.csv").read_text() == "stale\n"
