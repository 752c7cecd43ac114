"""Where the noise of a complete fit sits, read from a fit run folder's worker logs (an analysis; no GPU).

Usage: ``python scripts/noise_from_logs.py [RUN_FOLDER ...] [--per-fit]`` (default: the committed A/A of
2026-12-01 and the three H200 fit runs of 2026-11-29, read in place).

Per fit, from the Ultralytics progress bars in ``trials/<index>.log`` (elapsed seconds at each bar's last
update: 0.1 s resolution under a minute) and the fit's wall time ``value`` in ``trials.jsonl``:

* ``first_iter``: epoch 1's bar at its first update (loader start, first batch, CUDA and cuDNN warm-up);
* ``epoch1_rest``: the rest of epoch 1's training bar;
* ``steady``: training from the start of epoch 2 to the end of the last iteration, validation and
  checkpoints excluded (the sum of epochs 2..E's training bars);
* ``validation``: every per-epoch validation bar and the final validation of ``best.pt``;
* ``setup_other``: the rest of the wall time (model and dataset set-up before epoch 1, checkpoints, gaps
  between bars, stripping the optimizer).

Per pair (measured rows, one baseline and one candidate trial of a round) the log ratio ln(candidate /
baseline) of (a) the whole fit, (b) ``steady``, (c) set-up + first epoch (``setup_other`` + ``first_iter`` +
``epoch1_rest``), and for comparison of validation alone, of the median epoch 2..E and of the host-clock
iteration median the rows carry. Its standard deviation over pairs is the per-pair σ, given with a 90%
chi-square interval (exact for normal log ratios; too narrow when one pair is an outlier, which is why the σ
without the farthest pair is shown too, from 5 pairs up). The share of the whole fit's pair-difference
variance each part carries is cov(Δpart, Δwhole) / var(Δwhole); the shares sum to 1. The resolution floor is
the σ that rounding the bars to their printed resolution alone would give the steady figure.

Output on the committed folders (read 2026-12-01): per-pair σ [90% interval], and the largest shares of the
pair-difference variance.

  aa-candidate-384-2026-12-01  A/A, 6 pairs: whole 9.03% [6.1, 18.9], steady 11.08% [7.5, 23.2],
      set-up+epoch 1 7.37% [5.0, 15.4]; without the pair holding the first fit after a resume: whole 3.43%,
      steady 4.02%, set-up+epoch 1 4.19%. Shares: steady 62%, set-up/other 30%, validation 9%.
  pair-yolo26n-384  baseline vs candidate, 3 pairs: whole 5.31% [3.1, 23.5], steady 7.83% [4.5, 34.6],
      set-up+epoch 1 3.21% [1.9, 14.2]. Shares: steady 73%, epoch 1 after its first iteration 25%.
  pair-upstream-yolo26n-384  upstream vs candidate, 3 pairs: whole 5.01% [2.9, 22.1], steady 6.18% [3.6, 27.3],
      set-up+epoch 1 3.75% [2.2, 16.6]. Shares: steady 68%, epoch 1 41%, set-up/other -17%.
  pair-control-yolo26n-128  A/A at 128 steps, 3 pairs: whole 5.96% [3.4, 26.3], steady 6.49% [3.8, 28.7],
      set-up+epoch 1 6.52% [3.8, 28.8]. Shares: first iteration 48%, steady 20%, set-up/other 14%.
  Epoch-to-epoch variation inside one fit (CV of epochs 2..E, median per folder at 384 steps): 7.8%, 5.8%,
  4.6%, which alone would give the steady figure a per-pair σ of about 4.9%, 3.7%, 2.9%. Rounding floor of
  the steady σ: 0.17-0.30%.

What it says. At 384 steps the steady-state training (52-59% of the wall time) carries 62-73% of the
pair-difference variance, and its relative σ is 1.2-1.5 times the whole fit's (1.1 at 128 steps): a
steady-state figure would not be quieter, it would be noisier, and so would the median epoch. The noise is
the host's speed while training, varying on every time scale the logs show: between epochs of one fit for
identical work (enough by itself for a steady σ of ~3-5%), between fits, and in the first fits after the
machine starts or resumes. In the A/A most of the 9% is one pair (the first fit after a resume, 65.3 s
against 54.5 s): a warm machine after every gap is the first remedy, and the remaining ~3.4% is still over
twice the 1.5% target; what is left is the host's speed during training (placement, contention,
steal, clocks), which is what per-trial telemetry is for. At 128 steps the first iteration (loader start and
CUDA/cuDNN warm-up, ~8 s of ~49) carries half the variance.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_FOLDERS = (
    Path("/work/shared/data/aa-candidate-384-2026-12-01"),
    Path("/work/main/reports/archive/h200-2026-11-29/pair-yolo26n-384"),
    Path("/work/main/reports/archive/h200-2026-11-29/pair-upstream-yolo26n-384"),
    Path("/work/main/reports/archive/h200-2026-11-29/pair-control-yolo26n-128"),
)
PARTS = ("setup_other", "first_iter", "epoch1_rest", "steady", "validation")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TRAIN = re.compile(r"^\s*(\d+)/(\d+)\s.*?\s(\d+)/(\d+)\s(?:.*\s)?(\S+)\s*$")
_VAL = re.compile(r"mAP50-95\):.*?\s(\d+)/(\d+)\s(?:.*\s)?(\S+)\s*$")
_TIME = re.compile(r"^(?:(\d+):)?(?:(\d+):)?(\d+(?:\.\d+)?)s?$")


def parse_elapsed(token: str) -> tuple[float, float] | None:
    """A bar's elapsed time (``14.0s``, ``1:02``, ``1:02:03``, optionally ``<remaining``): (seconds, resolution)."""
    text = token.split("<", 1)[0]
    if text.endswith("s") and ":" not in text:
        try:
            return float(text[:-1]), 0.1
        except ValueError:
            return None
    parts = text.split(":")
    if len(parts) in (2, 3) and all(p.isdigit() for p in parts):
        seconds = 0
        for part in parts:
            seconds = seconds * 60 + int(part)
        return float(seconds), 1.0
    return None


@dataclass
class FitLog:
    """The bars of one fit's log: per epoch, training end and first update, validation; the final validation."""

    epochs: int | None = None
    train: dict[int, tuple[float, float]] = field(default_factory=dict)
    first_update: dict[int, float] = field(default_factory=dict)
    validation: dict[int, tuple[float, float]] = field(default_factory=dict)
    final_validation: tuple[float, float] | None = None


def parse_log(text: str) -> FitLog:
    log = FitLog()
    epoch: int | None = None
    final = False
    for raw in re.split(r"[\r\n]", text):
        line = _ANSI.sub("", raw).replace("[K", "")
        if line.startswith("Validating ") and "best.pt" in line:
            final = True
            continue
        val = _VAL.search(line)
        if val:
            done, total, token = int(val.group(1)), int(val.group(2)), val.group(3)
            elapsed = parse_elapsed(token)
            if elapsed is not None and done == total:
                if final:
                    log.final_validation = max(log.final_validation or elapsed, elapsed)
                elif epoch is not None:
                    log.validation[epoch] = max(log.validation.get(epoch, elapsed), elapsed)
            continue
        train = _TRAIN.match(line)
        if train and not final:
            epoch, log.epochs = int(train.group(1)), int(train.group(2))
            done, total = int(train.group(3)), int(train.group(4))
            elapsed = parse_elapsed(train.group(5))
            if elapsed is None:
                continue
            if done == 0 and epoch not in log.first_update:
                log.first_update[epoch] = elapsed[0]
            if done == total:
                log.train[epoch] = max(log.train.get(epoch, elapsed), elapsed)
    return log


@dataclass
class Fit:
    index: int
    arm: str
    role: str
    phase: str
    round: int
    whole: float
    iteration_median: float | None
    parts: dict[str, float]
    per_epoch: list[float]
    steady_resolution: float


def read_fit(row: dict, folder: Path) -> Fit | None:
    path = folder / "trials" / f"{row['index']}.log"
    if not path.is_file() or row.get("status") != "ok":
        return None
    log = parse_log(path.read_text(errors="replace"))
    epochs = log.epochs
    if not epochs or sorted(log.train) != list(range(1, epochs + 1)) or log.final_validation is None:
        raise ValueError(f"{path}: could not read every epoch's bars (found {sorted(log.train)} of {epochs})")
    if sorted(log.validation) != list(range(1, epochs + 1)):
        raise ValueError(f"{path}: validation bars for epochs {sorted(log.validation)} of {epochs}")
    train = [log.train[e][0] for e in range(1, epochs + 1)]
    first = log.first_update.get(1)
    validation = sum(v for v, _ in log.validation.values()) + log.final_validation[0]
    whole = float(row["value"])
    parts = {
        "first_iter": first if first is not None else 0.0,
        "epoch1_rest": train[0] - (first or 0.0),
        "steady": sum(train[1:]),
        "validation": validation,
    }
    parts["setup_other"] = whole - sum(parts.values())
    resolution = math.sqrt(sum((log.train[e][1] / math.sqrt(12)) ** 2 for e in range(2, epochs + 1)))
    return Fit(
        index=int(row["index"]),
        arm=row["arm"],
        role=row["role"],
        phase=row["phase"],
        round=int(row.get("round", 0)),
        whole=whole,
        iteration_median=row.get("iteration_host_median_s"),
        parts=parts,
        per_epoch=train,
        steady_resolution=resolution,
    )


def pairs_of(fits: list[Fit]) -> list[tuple[Fit, Fit]]:
    """(baseline, candidate) of each measured round that has both."""
    rounds: dict[int, dict[str, Fit]] = {}
    for fit in fits:
        if fit.phase == "measured":
            rounds.setdefault(fit.round, {})[fit.role] = fit
    return [
        (r["baseline"], r["candidate"])
        for _, r in sorted(rounds.items())
        if {"baseline", "candidate"} <= set(r)
    ]


def sigma_interval(values: list[float], level: float = 0.90) -> tuple[float, float, float] | None:
    """Sample standard deviation and its chi-square interval at ``level`` (normal data assumed)."""
    if len(values) < 2:
        return None
    sd = statistics.stdev(values)
    try:
        from scipy.stats import chi2
    except ImportError:
        return sd, math.nan, math.nan
    dof = len(values) - 1
    low = sd * math.sqrt(dof / chi2.ppf(0.5 + level / 2, dof))
    high = sd * math.sqrt(dof / chi2.ppf(0.5 - level / 2, dof))
    return sd, low, high


def covariance_share(part: list[float], whole: list[float]) -> float:
    mean_p, mean_w = statistics.fmean(part), statistics.fmean(whole)
    cov = sum((p - mean_p) * (w - mean_w) for p, w in zip(part, whole, strict=True))
    var = sum((w - mean_w) ** 2 for w in whole)
    return cov / var if var > 0 else math.nan


def analyse(folder: Path, per_fit: bool) -> dict:
    rows = [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines() if line.strip()]
    fits = [fit for row in rows if (fit := read_fit(row, folder)) is not None]
    pairs = pairs_of(fits)
    arms = sorted({f.arm for f in fits})
    print(f"\n== {folder.name}: {len(fits)} fits ({', '.join(arms)}), {len(pairs)} measured pairs")
    if per_fit:
        print(
            "  idx phase    role       round  whole   setup  1st-it  ep1-rest  steady   val   epochs 2..E (s)"
        )
        for f in fits:
            p = f.parts
            epochs = " ".join(f"{t:.1f}" for t in f.per_epoch[1:])
            print(
                f"  {f.index:>3} {f.phase:<8} {f.role:<10} {f.round:>5} {f.whole:6.2f}  {p['setup_other']:5.2f}"
                f"  {p['first_iter']:5.1f}  {p['epoch1_rest']:7.1f}  {p['steady']:6.1f}  {p['validation']:4.1f}"
                f"   {epochs}"
            )
    figures = {
        "whole": lambda f: f.whole,
        "steady": lambda f: f.parts["steady"],
        "setup+epoch1": lambda f: f.parts["setup_other"] + f.parts["first_iter"] + f.parts["epoch1_rest"],
        "validation": lambda f: f.parts["validation"],
        "median epoch 2..E": lambda f: statistics.median(f.per_epoch[1:]) if len(f.per_epoch) > 1 else None,
        "iteration median": lambda f: f.iteration_median,
    }
    result: dict = {"folder": folder.name, "pairs": len(pairs), "sigma": {}}
    print("  per-pair σ of ln(candidate/baseline), 90% interval; mean log ratio")
    for name, figure in figures.items():
        ratios = [
            math.log(figure(c) / figure(b))
            for b, c in pairs
            if figure(b) is not None and figure(c) is not None
        ]
        interval = sigma_interval(ratios)
        if interval is None:
            continue
        sd, low, high = interval
        result["sigma"][name] = sd
        mean = statistics.fmean(ratios)
        rest = sorted(ratios, key=lambda r: abs(r - mean))[
            :-1
        ]  # one-outlier check: the farthest pair left out
        print(
            f"    {name:<17} σ {sd:6.2%}  [{low:6.2%}, {high:6.2%}]  mean {mean:+7.2%}  ({len(ratios)} pairs)"
            + (f"; without its farthest pair {statistics.stdev(rest):.2%}" if len(rest) >= 4 else "")
        )
    if len(pairs) >= 2:
        whole = [c.whole - b.whole for b, c in pairs]
        shares = {
            part: covariance_share([c.parts[part] - b.parts[part] for b, c in pairs], whole) for part in PARTS
        }
        result["shares"] = shares
        print(
            "  share of the whole fit's pair-difference variance: "
            + ", ".join(f"{part} {share:.0%}" for part, share in shares.items())
        )
        steady = statistics.fmean(f.parts["steady"] for f in fits)
        floor = math.sqrt(2) * statistics.fmean(f.steady_resolution for f in fits) / steady
        result["steady_floor"] = floor
        print(f"  the bars' rounding alone would give the steady figure a σ of {floor:.2%}")
    within = [
        statistics.stdev(f.per_epoch[1:]) / statistics.fmean(f.per_epoch[1:])
        for f in fits
        if len(f.per_epoch) > 2
    ]
    if within:
        later = statistics.median(len(f.per_epoch) - 1 for f in fits)
        implied = math.sqrt(2) * statistics.median(within) / math.sqrt(later)
        result["epoch_cv"], result["implied_steady_sigma"] = statistics.median(within), implied
        print(
            f"  epoch-to-epoch variation inside one fit (epochs 2..E, CV): median {statistics.median(within):.1%}, "
            f"range {min(within):.1%}–{max(within):.1%}; epochs varying independently that much would give the "
            f"steady figure a per-pair σ of about {implied:.1%}"
        )
    mean_parts = {part: statistics.fmean(f.parts[part] for f in fits) for part in PARTS}
    print(
        "  mean seconds per fit: "
        + ", ".join(f"{part} {seconds:.1f}" for part, seconds in mean_parts.items())
        + f" (whole {statistics.fmean(f.whole for f in fits):.1f})"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folders", nargs="*", type=Path, help="fit run folders (trials.jsonl and trials/N.log)"
    )
    parser.add_argument("--per-fit", action="store_true", help="print each fit's parts too")
    args = parser.parse_args(argv)
    folders = args.folders or [f for f in DEFAULT_FOLDERS if f.is_dir()]
    if not folders:
        parser.error("no run folder given, and none of the default ones exists here")
    for folder in folders:
        analyse(folder, args.per_fit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
