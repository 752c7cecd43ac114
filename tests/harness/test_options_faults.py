"""Options checked before anything starts: bounds, output paths, and options a resume would ignore."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.fit.plan import ultralytics_importable
from harness.cli import main
from harness.run import Runner
from harness.tables import RunFolder
from tests.argv import EMBEDDED, TINY_PAIR
from tests.runfolders import TIER_FOLDERS, copy_run, corrupt_plan, set_field

TOO_MANY = [
    ([*EMBEDDED, "--pairs", "10000000000"], "--pairs 10000000000 is more than 10000"),
    ([*EMBEDDED, "--warmup", "1000001"], "--warmup 1000001 is more than 1000"),
    ([*EMBEDDED, "--cooldown", "1e9"], "--cooldown 1000000000.0 is more than 3600"),
    (
        [*EMBEDDED, "--steps", "10000000000", "--images", "8", "--batch", "4"],
        "--steps 10000000000 is more than",
    ),
    (
        [*EMBEDDED, "--steps", "200000", "--images", "8", "--batch", "4"],
        "100000 epochs of 2 iterations (8 images / batch 4), more than 10000",
    ),
    (
        [*EMBEDDED, "--images", "100000000", "--steps", "8", "--batch", "4"],
        "--images 100000000 is more",
    ),
    ([*EMBEDDED, "--images", "65536", "--steps", "16384", "--imgsz", "256"], "holds its whole synthetic set"),
    ([*EMBEDDED, "--imgsz", "100000"], "--imgsz 100000 is more than 4096"),
    ([*EMBEDDED, "--val-images", "100000000"], "--val-images 100000000 is more than"),
    ([*EMBEDDED, "--trial-timeout", "100000000000"], "--trial-timeout 100000000000 is more than"),
    ([*EMBEDDED, "--workers", "100000"], "--workers 100000 is more than"),
    ([*EMBEDDED, "--close-mosaic", "100000"], "--close-mosaic 100000 is more than"),
    (["screen", "--steps", "10000000000"], "--steps 10000000000 is more than"),
    (["screen", "--warmup-steps", "10000000000"], "--warmup-steps 10000000000 is more than"),
    (["screen", "--floor-replays", "10000000000"], "--floor-replays 10000000000 is more than"),
    (
        ["screen", "--scales", "n,s,m,l,x", "--guards", ",".join(map(str, range(64))), "--pairs", "10000"],
        "1000000",
    ),
    (["probe", "--tokens", "100000000000000000000"], "--tokens 100000000000000000000 is more than"),
    (["probe", "--head", "detect", "--batch", "10000000000"], "--batch 10000000000 is more than"),
    (["parity", "--steps", "10000000000"], "--steps 10000000000 is more than 10000"),
]


@pytest.mark.parametrize(("command", "message"), TOO_MANY)
def test_a_count_no_run_can_take_is_refused_before_anything_starts(
    tmp_path: Path, bench, no_run, command: list[str], message: str
) -> None:
    out = tmp_path / "runs"
    bench.refused([*command, "--device", "cpu", "--out", str(out)], message)
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        (["screen", "--device", "cpu", "--scales", "n", "--order", "duet"], "in this process"),
        (["probe", "--device", "cpu", "--order", "duet"], "in this process"),
        (["pair", "--workload", "embedded", "--order", "duet", "--cpus", "0"], "2 worker cores"),
    ],
)
def test_a_concurrent_order_the_run_cannot_keep_is_refused_before_any_folder(
    tmp_path: Path, bench, command: list[str], fragment: str
) -> None:
    """`--order duet` is refused in one line, before any folder, where trials run in this process or worker
    cores are too few.
    """
    out = tmp_path / "runs"
    bench.refused([*command, "--out", str(out)], "--order duet", fragment)
    assert not out.exists()


def test_a_core_list_past_any_machine_is_one_line_not_a_memory_kill(tmp_path: Path, bench) -> None:
    """`--cpus 0-999999999` is refused by its bounds before any core list is expanded (24 GB)."""
    bench.refused([*EMBEDDED, "--cpus", "0-999999999", "--out", str(tmp_path)], "--cpus", "999999999")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [EMBEDDED, ["screen"], ["probe"], ["parity"]])
def test_a_seed_beyond_63_bits_is_refused_up_front(tmp_path: Path, bench, command: list[str]) -> None:
    out = tmp_path / "runs"
    bench.refused(
        [*command, "--seed", "18446744073709551616", "--device", "cpu", "--out", str(out)],
        "--seed 18446744073709551616 is more than 9223372036854775807",
    )
    assert not out.exists()


def test_a_control_character_in_a_bad_value_stays_inside_the_one_line(bench) -> None:
    """--order 'abba<newline>INJECTED LINE' was refused (exit 2) on two lines of stderr."""
    error = bench.refused(["screen", "--order", "abba\nINJECTED LINE", "--device", "cpu"], "--order")
    assert "abba\\nINJECTED LINE" in error


def test_paths_no_file_system_can_hold_are_one_line(finished_run: RunFolder, tmp_path: Path, bench) -> None:
    """A name of 300 characters in --out, -o, --resume or report is one line; so is an empty --out."""
    long = str(tmp_path / ("a" * 300))
    bench.refused(["report", long], "is not a run folder", "longer than")
    bench.refused(["pair", "--resume", long], "is not a run folder", "longer than")
    report_to = str(tmp_path / ("c" * 300 + ".md"))
    bench.refused(["report", str(finished_run.path), "-o", report_to], "-o", "longer than")
    tiny = [
        "pair",
        "--workload",
        "embedded",
        "--device",
        "cpu",
        "--steps",
        "2",
        "--images",
        "8",
        "--batch",
        "4",
    ]
    bench.refused([*tiny, "--out", long + "/x"], "--out", "longer than")
    bench.refused([*tiny, "--out", ""], "--out", "empty")
    assert not list(Path.cwd().glob("pair-*"))


@pytest.mark.parametrize("workload", ["embedded", "ultralytics"])
def test_out_on_a_file_is_one_line_before_anything_starts(tmp_path: Path, bench, workload: str) -> None:
    """--out is checked first: the real trainer's parent writes its synthetic set there before any trial."""
    if workload == "ultralytics" and not ultralytics_importable():
        pytest.skip("needs the ultralytics extra")
    occupied = tmp_path / "a-file"
    occupied.write_text("not a folder")
    command = ["pair", "--workload", workload, "--device", "cpu", "--images", "8", "--steps", "2", "--out"]
    bench.refused([*command, str(occupied)], f"--out '{occupied}'", "is a file")
    bench.refused([*command, str(occupied / "below")], "is a file")
    assert occupied.read_text() == "not a folder"


def test_out_on_a_read_only_mount_is_one_line(read_only_disk, bench) -> None:
    mount, _ = read_only_disk
    bench.refused([*EMBEDDED, "--out", str(mount / "more")], "read-only")


def test_options_given_with_resume_that_differ_from_the_plan_are_refused(
    half_run: RunFolder, bench, no_run
) -> None:
    before = half_run.file("trials.jsonl").read_bytes()
    resume = ["pair", "--resume", str(half_run.path)]
    bench.refused(
        [*resume, "--pairs", "9", "--arms", "foo"],
        "--pairs 9",
        "--arms foo",
        "--pairs 1",
        "no --arms",  # the run took the device default
    )
    bench.refused([*resume, "--steps", "8"], "--steps 8", "--steps 4")
    bench.refused([*resume, "--control"], "--control")
    assert half_run.file("trials.jsonl").read_bytes() == before  # nothing ran


def test_options_given_with_resume_that_match_the_plan_are_accepted(half_run: RunFolder, monkeypatch) -> None:
    resumed = []
    monkeypatch.setattr(Runner, "resume", lambda self, path, trial_fn=None: resumed.append(Path(path)))
    given = [
        "--workload",
        "embedded",
        "--pairs",
        "1",
        "--warmup",
        "2",
        "--quiet",
        "--no-report",
        "--stop-after",
        "60",
    ]
    assert main(["pair", "--resume", str(half_run.path), *given]) == 0
    assert resumed == [half_run.path]


def test_a_resume_of_a_plan_with_no_command_refuses_any_option(tmp_path: Path, bench, no_run) -> None:
    folder = copy_run(RunFolder(TIER_FOLDERS["screen"]), tmp_path / "run")  # as if started from Python:
    corrupt_plan(folder, set_field("command", ""))  # no command recorded
    command = ["screen", "--resume", str(folder.path), "--pairs", "1"]
    bench.refused(command, "--pairs 1", "no command")


def test_the_plan_records_the_command_main_was_given(tmp_path: Path, monkeypatch) -> None:
    started = []
    monkeypatch.setattr(Runner, "start", lambda self, plan, trial_fn=None: started.append(plan))
    assert main([*TINY_PAIR, "--seed", "3", "--out", str(tmp_path / "my runs")]) == 0
    assert started[0].command == "bench " + " ".join(TINY_PAIR) + f" --seed 3 --out '{tmp_path / 'my runs'}'"
