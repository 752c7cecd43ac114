"""The README stays true: its set-up commands, its `bench` commands, its links and its generated table.

The first command, `bench pair` with no option, runs for real here: fourteen fits of 64 steps.
It has its own file because it is the suite's longest test; under ``--dist loadfile`` it runs beside the rest."""

from __future__ import annotations

import csv
import importlib.util
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from harness.cli import main
from tests import ROOT
from tests.runfolders import only_run

README = ROOT / "README.md"


# Pages other helpers write from the option schema and the run-folder format; linked before they land.
def load_index():
    """scripts/reports_index.py, the generator of reports/index.md and the README's headline table."""
    spec = importlib.util.spec_from_file_location("reports_index", ROOT / "scripts" / "reports_index.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def bench_commands(text: str) -> list[list[str]]:
    """Every `bench` command the README shows in a code block, as an argument list without `bench`."""
    commands = []
    for block in code_blocks(text, "bash") + code_blocks(text, "text"):
        for line in block.splitlines():
            line = line.removeprefix("$ ")
            if line.startswith("bench "):
                commands.append(shlex.split(line)[1:])
    return commands


def test_the_two_set_up_commands_come_first_and_ci_runs_the_second() -> None:
    first, second = code_blocks(README.read_text(), "bash")[:2]
    assert first.strip().endswith("&& .venv/bin/bench pair") and "pip install torch==" in first
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert second.strip() == ci


def test_every_bench_command_in_the_readme_names_a_command_and_options_that_exist(capsys) -> None:
    """Each command is parsed with --help after its name: an unknown command or option is exit 2."""
    commands = bench_commands(README.read_text())
    assert len(commands) >= 5
    assert main(["pair", "--help", "--no-such-option"]) == 2  # the check can fail
    for argv in commands:
        cut = argv.index("--") if "--" in argv else len(argv)
        assert main([argv[0], "--help", *argv[1:cut]]) == 0, argv
    capsys.readouterr()


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    pages = [ROOT / "docs" / page.name for page in (ROOT / "docs").glob("*.md")]
    reports = [ROOT / "reports" / "index.md", *(ROOT / "reports").rglob("README.md")]
    for page in [README, *pages, *reports]:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            assert path.exists(), f"{page.name} links {target}, which does not exist"


def prose_sentences(text: str) -> list[str]:
    """The sentences of a markdown page outside code blocks, tables and headings."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    lines = [line for line in text.splitlines() if line and not line.startswith(("|", "#", "<!--"))]
    prose = " ".join(line.strip().removeprefix("- ") for line in lines)
    prose = re.sub(r"`[^`]*`", "CODE", prose)
    return [s for s in re.split(r"(?<=[.!?:;])\s+(?=[A-Z`\[])", prose) if s]


def test_the_readme_and_docs_keep_sentences_under_26_words() -> None:
    pages = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "reports").rglob("README.md"))]
    long = [
        f"{page.relative_to(ROOT)}: {sentence}"
        for page in pages
        for sentence in prose_sentences(page.read_text())
        if len(sentence.split()) > 25
    ]
    assert long == []


def test_the_headline_table_and_the_index_are_what_the_run_folders_say() -> None:
    index = load_index()
    claims = index.all_claims()
    assert README.read_text() == index.readme_with(README.read_text(), index.headline_text(claims))
    assert (ROOT / "reports" / "index.md").read_text() == index.index_text(claims)


def test_the_index_follows_a_folder_s_claims_table(tmp_path: Path, monkeypatch) -> None:
    """A figure changed in a folder's claims.csv changes the index's row: the index is read, not typed."""
    index = load_index()
    source = ROOT / "reports" / "h200-decisive" / "upstream-d" / "pair-20261202-021302-1f43"
    folder = tmp_path / "reports" / "series" / source.name
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("trials", "report-figures"))
    with (folder / "claims.csv").open(newline="") as stream:
        rows = list(csv.DictReader(stream))
    rows[0].update(estimate="0.25", ci_low="0.2", ci_high="0.3", verdict="clears")
    with (folder / "claims.csv").open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    monkeypatch.setattr(index, "REPORTS", tmp_path / "reports")
    text = index.index_text(index.all_claims())
    assert "| 25.00% (20.00% to 30.00%) | 14 | 2026-12-02 | `8f67218` |" in text
    assert f"[{source.name}](series/{source.name}/)" in text


@pytest.mark.slow
def test_the_readme_first_command_compares_two_computations(tmp_path: Path, monkeypatch, capsys) -> None:
    """`bench pair` with no option, as on the README's fresh machine without ultralytics or CUDA.

    It fits the embedded workload, baseline against candidate-cpu; the claim's first line names what each ran.
    """
    monkeypatch.setattr("experiments.fit.plan.ultralytics_importable", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    assert main(["pair"]) == 0
    elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert "device: cpu (auto: no CUDA device here)" in out
    assert "workload: embedded (auto: ultralytics is not importable here" in out
    assert "arms: baseline,candidate-cpu (the default on cpu:" in out
    assert (
        "fit: 64 steps of 128 images = 2 epochs × 32 iterations (128 images and 64 steps: the embedded" in out
    )
    folder = only_run(tmp_path / "runs")
    rows = folder.rows()
    assert len(rows) == 14 and all(r["status"] == "ok" for r in rows), [r["message"] for r in rows]
    assert {r["arm"]: r["optimizer_class"] for r in rows} == {
        "baseline": "optimizers.musgd.MuSGD",
        "candidate-cpu": "experiments.arms.BatchedMuSGDOnCPU",
    }
    answer, first = folder.file("claim.txt").read_text().splitlines()[:2]
    assert answer.startswith("candidate-cpu ") and "baseline" in answer and "6 pairs" in answer  # in words
    assert answer in " ".join(out.split()) and answer in folder.file("report.md").read_text()
    assert first == (
        "On cpu: baseline ran the per-parameter MuSGD (optimizers.musgd.MuSGD); candidate-cpu ran the batched "
        "path with CPU tensors routed through it (experiments.arms.BatchedMuSGDOnCPU)."
    )
    assert first in " ".join(out.split())  # the console says it too, before the figures, wrapped at 100
    report = folder.file("report.md").read_text().splitlines()
    assert report[report.index("## Summary") + 2] == first
    log = (folder.path / "trials" / "0.log").read_text()
    assert "epoch 2/2: train loss " in log
    print(f"the default job took {elapsed:.1f} s here")


def test_every_script_the_docs_and_scripts_name_exists() -> None:
    """The one-off device scripts moved to scripts/device/; a path left behind would send a reader nowhere."""
    pages = [README, *(ROOT / "docs").glob("*.md"), *(ROOT / "reports").glob("*.md")]
    pages += [ROOT / "reports" / "archive" / "README.md", *(ROOT / "scripts").rglob("*.*")]
    named = {
        path
        for page in pages
        if page.suffix in {".md", ".sh", ".py"}
        for path in re.findall(r"scripts/(?:device/)?\w+(?:\.sh|\.py|/)", page.read_text())
    }
    assert "scripts/h200_env.sh" in named and "scripts/device/h200_wheels.sh" in named
    assert sorted(path for path in named if not (ROOT / path).exists()) == []
