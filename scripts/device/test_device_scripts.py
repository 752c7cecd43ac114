"""The device scripts: the packing (scripts/device/h200_pack.sh: a device call returns at most 8 files of 16 MiB, so a
call must bring back only the run folders it changed, without checkpoints, dataset caches or the trainer's
font copies, and every log in one file), when a decisive step starts a claim (scripts/device/h200_decisive.sh) and
the choice of folders for the decisive report (scripts/device/decisive_claims.sh)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "scripts" / "device"
# The series the decisive script's claims run now (it moves on when the candidate changes).
SERIES = re.search(r"^SERIES=(\w+)$", (HERE / "h200_decisive.sh").read_text(), re.M).group(1)
pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("tar") is None, reason="needs bash and tar"
)


def write(path: Path, text: str = "x", age_s: float = 0.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if age_s:
        stamp = time.time() - age_s
        os.utime(path, (stamp, stamp))


def names(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {member.name.removeprefix("./") for member in tar.getmembers() if member.isfile()}


def test_pack_brings_back_only_changed_run_folders_and_one_log_archive(tmp_path: Path) -> None:
    home = tmp_path / "tree" / "reports" / "decisive"
    write(home / "screen" / "screen-old" / "trials.jsonl", age_s=3600)  # committed, untouched this call
    write(home / "upstream-d" / "pair-1" / "trials.jsonl", age_s=3600)  # resumed: gains a row this call
    write(home / "logs" / "2026-12-01" / "screen.log", age_s=3600)
    mark = tmp_path / "mark"
    write(mark, age_s=60)
    write(home / "upstream-d" / "pair-1" / "trials.jsonl", "x\ny")
    write(home / "upstream-d" / "pair-1" / "trials" / "000" / "fit" / "last.pt")
    write(home / "upstream-d" / "pair-1" / "ultralytics-config" / "Ultralytics" / "Arial.ttf")
    write(home / "upstream-d" / "datasets" / "synthetic" / "images" / "0.jpg")
    write(home / "parity" / "parity-new" / "report.md")
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    write(logs / "upstream-d.log")
    write(logs / "parity.log")
    environment = {**os.environ, "OUT": str(out), "LOGS": str(logs), "MARK": str(mark)}
    script = f". {HERE / 'h200_pack.sh'} && pack decisive reports/decisive"
    subprocess.run(["bash", "-c", script], cwd=tmp_path / "tree", env=environment, check=True)

    assert sorted(path.name for path in out.iterdir()) == ["decisive.tgz", "logs.tgz"]
    assert names(out / "decisive.tgz") == {
        "reports/decisive/upstream-d/pair-1/trials.jsonl",
        "reports/decisive/parity/parity-new/report.md",
    }
    assert names(out / "logs.tgz") == {"upstream-d.log", "parity.log"}


def test_pack_without_changes_writes_no_run_archive(tmp_path: Path) -> None:
    home = tmp_path / "tree" / "reports" / "decisive"
    write(home / "screen" / "screen-old" / "trials.jsonl", age_s=3600)
    out = tmp_path / "out"
    out.mkdir()
    environment = {**os.environ, "OUT": str(out), "LOGS": str(tmp_path / "logs")}
    environment.pop("MARK", None)  # the mark is made when the script is sourced
    script = f". {HERE / 'h200_pack.sh'} && pack decisive reports/decisive"
    subprocess.run(["bash", "-c", script], cwd=tmp_path / "tree", env=environment, check=True)
    assert sorted(path.name for path in out.iterdir()) == ["logs.tgz"]


def decisive_tree(home: Path, kinds: list[str]) -> None:
    for kind in kinds:
        for stamp in ("20261201-0100", "20261202-0100"):
            write(home / kind / f"run-{stamp}-{kind}" / "plan.json", "{}")


def recording_interpreter(path: Path, record: str) -> Path:
    """A stand-in for the interpreter a script calls: it runs nothing, only ``record`` (a bash line that writes
    its arguments where the test reads them)."""
    path.write_text(f"#!/usr/bin/env bash\n{record}\n")
    path.chmod(0o755)
    return path


def run_decisive_claims(
    tmp_path: Path, home: Path, series: str
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """scripts/device/decisive_claims.sh over a made-up tree, with a stand-in interpreter that records its arguments."""
    recorded = tmp_path / "arguments"
    stand_in = recording_interpreter(tmp_path / "python", f'printf "%s\\n" "$@" > {recorded}')
    environment = {**os.environ, "PYTHON": str(stand_in), "DECISIVE_HOME": str(home)}
    result = subprocess.run(
        ["bash", str(HERE / "decisive_claims.sh"), series],
        env=environment,
        capture_output=True,
        text=True,
    )
    return result, recorded.read_text().splitlines() if recorded.exists() else []


OTHERS = [
    "stages-upstream",
    "stages-baseline",
    "screen",
    "parity",
    "probe-lm-24GiB",
    "probe-lm-6GiB",
    "probe-detect-24GiB",
]


def test_decisive_claims_leaves_out_a_claim_not_yet_started(tmp_path: Path) -> None:
    home = tmp_path / "decisive"
    decisive_tree(home, ["upstream-q", *OTHERS])
    result, arguments = run_decisive_claims(tmp_path, home, "q")
    assert result.returncode == 0, result.stderr
    assert "baseline-q has no run folder yet: left out" in result.stderr
    assert arguments[:3] == ["-m", "harness.cli", "report"]
    assert arguments[-2:] == ["-o", f"{home}/claims.md"]
    assert [Path(argument).name for argument in arguments[3:-2]] == [
        "run-20261202-0100-upstream-q",
        "run-20261202-0100-stages-upstream",
        "run-20261202-0100-stages-baseline",
        "run-20261202-0100-screen",
        "run-20261201-0100-parity",
        "run-20261202-0100-parity",
        "run-20261202-0100-probe-lm-24GiB",
        "run-20261202-0100-probe-lm-6GiB",
        "run-20261202-0100-probe-detect-24GiB",
    ]


def test_decisive_claims_refuses_a_tree_without_its_screen(tmp_path: Path) -> None:
    home = tmp_path / "decisive"
    decisive_tree(home, ["upstream-q", "baseline-q", "stages-upstream", "stages-baseline", "parity"])
    result, arguments = run_decisive_claims(tmp_path, home, "q")
    assert result.returncode == 2
    assert f"no run folder under {home}/screen" in result.stderr
    assert arguments == []


def test_decisive_claims_without_a_series_says_what_it_takes(tmp_path: Path) -> None:
    result, arguments = run_decisive_claims(tmp_path, tmp_path / "decisive", "")
    assert result.returncode == 2 and arguments == []
    assert result.stderr.strip().splitlines() == [
        "decisive_claims.sh: which series? usage: decisive_claims.sh SERIES (a letter, e.g. d)"
    ]


def run_decisive_step(
    tmp_path: Path, step: str, deadline: int, started: bool = False
) -> tuple[str, list[str]]:
    """scripts/device/h200_decisive.sh STEP in a copy of its folder, with the device set-up and the interpreter stood
    in for (the stand-in records each bench command it is given)."""
    tree = tmp_path / "tree"
    (tree / "scripts" / "device").mkdir(parents=True)
    shutil.copy(HERE / "h200_decisive.sh", tree / "scripts" / "device")
    (tree / "scripts" / "h200_env.sh").write_text("pack() { :; }\n")
    if started:
        write(
            tree / "reports" / "h200-decisive" / f"{step}-{SERIES}" / "pair-20261202-0100" / "plan.json", "{}"
        )
    recorded = tmp_path / "commands"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recording_interpreter(
        bin_dir / "python3",
        f'echo "$*" >> {recorded}; '
        f'[ -z "${{FIT_STEP_PROFILE_OUT:-}}" ] || echo "profile $FIT_STEP_PROFILE_OUT $PYTHONPATH" >> {recorded}',
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    environment = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DEADLINE": str(deadline),
        "LOGS": str(logs),
        "OUT": str(tmp_path / "out"),
    }
    result = subprocess.run(
        ["bash", "scripts/device/h200_decisive.sh", step],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, recorded.read_text().splitlines() if recorded.exists() else []


@pytest.mark.parametrize("step", ["upstream", "baseline"])
def test_a_claim_is_not_started_without_time_for_its_warmup_and_one_round(tmp_path: Path, step: str) -> None:
    """On the H200 the baseline claim started with 221 s left: its warm-up fit took 131 s, no round fitted
    after it, and the next slice's resume had to warm up again: the warm-up was spent for nothing."""
    out, commands = run_decisive_step(tmp_path, step, deadline=240)
    assert commands == []
    assert f"{step}-{SERIES}: not started" in out


@pytest.mark.parametrize("step", ["upstream", "baseline"])
def test_a_claim_starts_with_time_for_its_warmup_and_one_round(tmp_path: Path, step: str) -> None:
    out, commands = run_decisive_step(tmp_path, step, deadline=900)
    assert len(commands) == 1 and commands[0].startswith("-m harness.cli pair ")
    assert f"--out reports/h200-decisive/{step}-{SERIES} --stop-after" in commands[0]


def test_a_started_claim_resumes_whatever_is_left_and_lets_the_log_decide(tmp_path: Path) -> None:
    """A resume knows its fits' times from its log (the harness stops before a warm-up and round that would
    not end in time), so the script hands it any slice of 100 s or more."""
    out, commands = run_decisive_step(tmp_path, "baseline", deadline=240, started=True)
    assert len(commands) == 1
    assert commands[0].startswith(
        f"-m harness.cli pair --resume reports/h200-decisive/baseline-{SERIES}/pair-20261202-0100"
    )


def test_the_fit_profile_step_runs_one_stages_pair_with_the_profile_loaded_and_its_output_in_the_logs(
    tmp_path: Path,
) -> None:
    """`fit-profile` is the stages pair against upstream at the claim's settings, with the profiling
    sitecustomize first on the path of every process and its output in the logs (which come back)."""
    out, commands = run_decisive_step(tmp_path, "fit-profile", deadline=900)
    assert len(commands) == 2 and commands[0].startswith("-m harness.cli pair --workload ultralytics")
    assert "--arms upstream,candidate --stages --warmup 0 --pairs 1" in commands[0]
    _, folder, path = commands[1].split(" ")
    assert folder == str(tmp_path / "logs" / "fit-profile")
    assert path.split(":")[0] == str(tmp_path / "tree" / "scripts" / "device" / "fit_step_profile")
    assert "fit-profile rc=0" in out and (tmp_path / "logs" / "fit-profile" / "run.log").exists()
