"""`bench parity` speaks the vocabulary of every command.

It takes --arms, prints a contract line with the difference and its bound, and points to no report it did not
write.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from harness.cli import main
from optimizers import MuSGD
from tests.runfolders import only_run


class Drifting(MuSGD):
    """MuSGD, then every parameter moved by 1e-3: breaks the contract."""

    @torch.no_grad()
    def step(self, closure=None):
        out = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                p.add_(1e-3)
        return out


class Same(MuSGD):
    """MuSGD under another name."""


def test_parity_takes_arms_and_says_the_difference_and_its_bound(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    argv = ["parity", "--arms", f"baseline,{__name__}:Same", "--device", "cpu", "--quiet", "--no-report"]
    assert main([*argv, "--out", str(out)]) == 0
    folder = only_run(out)
    assert json.loads(folder.file("plan.json").read_text())["settings"]["candidate"] == f"{__name__}:Same"
    claim = folder.file("claim.txt").read_text()
    assert "One-step contract: holds; the candidate's largest difference " in claim and " bound " in claim


def test_a_broken_contract_without_a_report_does_not_point_to_one(tmp_path: Path, capsys) -> None:
    out = tmp_path / "runs"
    argv = ["parity", "--arms", f"baseline,{__name__}:Drifting", "--device", "cpu", "--quiet", "--no-report"]
    assert main([*argv, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the one-step contract is broken" in err and "see the report" not in err
    assert "bench report " in err


def test_the_old_candidate_option_still_works_hidden(tmp_path: Path, capsys) -> None:
    out = tmp_path / "runs"
    argv = ["parity", "--candidate", "candidate", "--device", "cpu", "--quiet", "--no-report"]
    assert main([*argv, "--out", str(out)]) == 0
    assert main(["parity", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--arms" in text and "--candidate" not in text


def test_help_says_what_each_tier_passes_to_an_arm_s_constructor(capsys) -> None:
    for command in ("screen", "pair", "probe"):
        assert main([command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.replace("│", " ").split())
        assert "muon, sgd (screen, probe, parity)" in text and "use_muon too (pair)" in text, command
