"""scripts/check_commits.py refuses a commit subject over 72 characters, in a range or as a commit-msg hook."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import ROOT

SCRIPT = ROOT / "scripts" / "check_commits.py"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*args], cwd=cwd, capture_output=True, text=True, check=False)


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


def test_a_range_with_one_long_subject_is_refused_and_a_short_one_passes(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "base")
    base = git(tmp_path, "rev-parse", "HEAD")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "x" * 72, "-m", "a body line " * 20)
    fits = run(sys.executable, str(SCRIPT), base, cwd=tmp_path)
    assert fits.returncode == 0, fits.stdout + fits.stderr
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "y" * 73)
    long = run(sys.executable, str(SCRIPT), base, cwd=tmp_path)
    assert long.returncode == 1 and "73 characters" in long.stdout, long.stdout


def test_as_a_commit_msg_hook_it_stops_a_long_subject(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    (tmp_path / ".git" / "hooks" / "commit-msg").symlink_to(SCRIPT)  # as docs/contributing.md installs it
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "a short subject")
    refused = run("git", "commit", "-q", "--allow-empty", "-m", "z" * 80, cwd=tmp_path)
    assert refused.returncode != 0 and "80 characters" in refused.stdout + refused.stderr
    assert git(tmp_path, "log", "--format=%s") == "a short subject"


def test_a_base_git_does_not_know_is_one_line_and_exit_2(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    done = run(sys.executable, str(SCRIPT), "no-such-base", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
