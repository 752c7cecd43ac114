"""Calibrate the geometric-mean t interval from measured noise and write ``harness/t_calibration.py``.

Usage: ``python scripts/calibrate_t_interval.py [RUN_FOLDER ...] [--write]``. The default folders are every
committed claim of the sequential design with more than one pair (40 pairs). Only claim pairs count: an A/A
pair's law is symmetric by construction, so its arms are left out. Without ``--write`` it prints what it
would write. About half a minute on two cores.

Step 1, the skewness of the paired log ratios, measured. The log ratios ln(candidate / baseline) of each
folder are centred on that folder's median and pooled. The estimate is the pool's sample skewness
(Fisher-Pearson, biased). Its interval is a 95% percentile bootstrap: 20 000 seeded resamples of pairs within
each folder. Each resample is centred on its own medians, as the estimate is.

Step 2, the reference skewed law. A pair's log ratio is the difference of two arms' delays, G1 − ½·G2,
centred, with G ~ gamma(k, 1). The shape k gives the upper end of that interval (rounded up to 0.01). Two
exponential delays (k = 1) give at most skewness 2 (1.25 at scales 1 and ½). So a larger upper end needs a
gamma shape below 1: most pairs near the floor, a few slow.

Step 3, nominal levels, one-sided. Per stated level L (90 and 95%) and n = 2 … 30: the t interval of n log
ratios takes the nominal level ν. It is the lowest ν ≥ L (step 0.01 point) whose coverage falls short
of L by at most 0.75 point. That coverage is of the mean, on the reference skewed law, from 400 000 seeded
draws; 0.75 point is half the window. On normal log ratios it covers ν, so the level only rises from L. It
is kept only when both coverages lie within 1.5 − 0.2 points of L. The 0.2 point is kept back for this
simulation's own error: five standard errors of 0.04 point at 94% with 400 000 draws. Where no ν
qualifies, the t interval at that n is ``insufficient``.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import sequential  # noqa: E402
from harness.stats import CONTROL_SUFFIX, pair_table  # noqa: E402
from harness.tables import RunFolder  # noqa: E402

# The shared data sit beside the main checkout (``../shared``), one level further up from a worktree.
SHARED = next((p / "shared" for p in (ROOT.parent, ROOT.parent.parent) if (p / "shared").is_dir()), ROOT)
DEFAULT_FOLDERS = (  # every committed claim of the sequential design with more than one pair
    ROOT / "reports/archive/h200-2026-11-29/pair-yolo26n-384",
    ROOT / "reports/archive/h200-2026-11-29/pair-upstream-yolo26n-384",
    ROOT / "reports/h200-decisive/upstream/pair-20261201-135230-647b",
    ROOT / "reports/h200-decisive/upstream-d/pair-20261202-021302-1f43",
    ROOT / "reports/h200-decisive/baseline-d/pair-20261202-060853-6006",
)
OUTPUT = ROOT / "harness/t_calibration.py"

BOOTSTRAP_RESAMPLES = 20_000
SCALE_RATIO = 0.5
LEVELS = (0.90, 0.95)
MAX_PAIRS = 60  # simulated
TABLE_PAIRS = 30  # tabulated: past it the last nominal level serves, the skewed law's shortfall only shrinks
CALIBRATION_DRAWS = 400_000
WINDOW = 0.015  # coverage within 1.5 points of the stated level on both laws
MARGIN = 0.002  # kept back for this simulation's own error (five standard errors)
SHORTFALL = (
    WINDOW / 2
)  # the one-sided target: a test's fresh 20 000 draws (0.15-point error) stay in the band
GRID_STEP = 1e-4


def folder_log_ratios(path: Path) -> np.ndarray:
    """ln(candidate / baseline) of a run folder's finished claim pairs (an A/A arm's left out), in round order."""
    pairs = pair_table(RunFolder.open(path).trials())
    pairs = pairs[~pairs["arm"].astype(str).str.endswith(CONTROL_SUFFIX)]
    ratios = np.log(pairs["candidate"].to_numpy(dtype=float) / pairs["baseline"].to_numpy(dtype=float))
    return ratios[np.isfinite(ratios)]


def pooled_skewness(groups: list[np.ndarray]) -> float:
    return float(stats.skew(np.concatenate([g - np.median(g) for g in groups])))


def skewness_interval(groups: list[np.ndarray], seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the pooled skewness, pairs resampled within each folder."""
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        draws.append(pooled_skewness([g[rng.integers(0, g.size, g.size)] for g in groups]))
    finite = np.asarray(draws)[np.isfinite(draws)]  # a resample of identical values has no skewness
    low, high = np.percentile(finite, [2.5, 97.5])
    return float(low), float(high)


def t_statistics(x: np.ndarray) -> list[np.ndarray]:
    """|mean|·√n / s of the first n columns of ``x`` for n = 2 … columns, each sorted (prefix sums)."""
    total, squares = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    out: list[np.ndarray] = [np.empty(0), np.empty(0)]
    for n in range(2, x.shape[1] + 1):
        mean = total[:, n - 1] / n
        variance = (squares[:, n - 1] - n * mean * mean) / (n - 1)
        out.append(np.sort(np.abs(mean) * math.sqrt(n) / np.sqrt(np.maximum(variance, 1e-300))))
    return out


def calibrate(sorted_t: list[np.ndarray], level: float) -> dict[int, tuple[float, float, float, bool]]:
    """Per n: the lowest nominal level from ``level`` up whose skewed coverage is at most ``SHORTFALL`` short.

    Beside it: its coverage there, its larger distance from ``level`` over the two laws, and whether that
    distance is within the window less the margin.
    """
    grid = np.round(np.arange(level, min(level + WINDOW, 0.9999) + GRID_STEP / 2, GRID_STEP), 6)
    table: dict[int, tuple[float, float, float, bool]] = {}
    for n in range(2, TABLE_PAIRS + 1):
        quantiles = stats.t.ppf(0.5 + grid / 2.0, n - 1)
        skewed = np.searchsorted(sorted_t[n], quantiles, side="right") / sorted_t[n].size
        reaching = np.nonzero(skewed >= level - SHORTFALL + 1e-12)[0]
        best = int(reaching[0]) if reaching.size else int(np.argmax(skewed))
        distance = max(grid[best] - level, abs(skewed[best] - level))
        kept = bool(distance <= WINDOW - MARGIN + 1e-12)
        table[n] = (float(grid[best]), float(skewed[best]), float(distance), kept)
    return table


def render(measured: dict, calibration: dict) -> str:
    lines = [
        '"""Generated by ``scripts/calibrate_t_interval.py`` from the committed H200 fit runs: do not edit by hand.',
        "",
        "The measured skewness of the paired log ratios, and the reference skewed law from its upper end.",
        "The Student t interval's nominal level per stated level and pair count. The script's docstring says",
        "how each was made.",
        '"""',
        "",
        f"MEASURED_FOLDERS = {tuple(measured['folders'])!r}",
        f"MEASURED_PAIRS = {measured['pairs']}",
        f"MEASURED_SKEWNESS = {measured['skewness']:.4f}",
        f"MEASURED_SKEWNESS_INTERVAL = ({measured['low']:.4f}, {measured['high']:.4f})",
        f"REFERENCE_SKEWNESS = {measured['reference']:.2f}",
        f"REFERENCE_SCALE_RATIO = {SCALE_RATIO}",
        f"REFERENCE_DELAY_SHAPE = {measured['shape']:.6f}",
        f"CALIBRATION_DRAWS = {CALIBRATION_DRAWS}",
        f"CALIBRATION_WINDOW = {WINDOW}",
        f"CALIBRATION_MARGIN = {MARGIN}",
        "",
        "# pairs, then per stated level: the best nominal level; its simulated coverage on the reference",
        "# skewed law; the larger distance from the stated level over the two laws there; whether that",
        "# distance is within the window less the margin (whether the t interval keeps the stated level)",
        f"STATED_LEVELS = {tuple(calibration)!r}",
        'TABLE = """',
    ]
    for n in next(iter(calibration.values())):
        rows = (table[n] for table in calibration.values())
        cells = "  ".join(
            f"{nominal:.4f} {skewed:.6f} {gap:.6f} {kept}" for nominal, skewed, gap, kept in rows
        )
        lines.append(f"{n:2d} {cells}")
    lines += [
        '"""',
        "NOMINAL_LEVELS: dict[float, dict[int, tuple[float, float, float, bool]]] = {",
        "    stated: {",
        '        int(row[0]): (*map(float, row[1 + 4 * i : 4 + 4 * i]), row[4 + 4 * i] == "True")',
        "        for row in map(str.split, TABLE.strip().splitlines())",
        "    }",
        "    for i, stated in enumerate(STATED_LEVELS)",
        "}",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, default=list(DEFAULT_FOLDERS))
    parser.add_argument("--write", action="store_true", help=f"write {OUTPUT.relative_to(ROOT)}")
    args = parser.parse_args()

    groups = [folder_log_ratios(path) for path in args.folders]
    for path, group in zip(args.folders, groups, strict=True):
        print(f"{path.name}: {group.size} pairs, log ratios {np.round(group, 4).tolist()}")
    skewness = pooled_skewness(groups)
    low, high = skewness_interval(groups)
    reference = math.ceil(max(abs(low), abs(high)) * 100 - 1e-9) / 100
    shape = sequential.delay_shape_for(reference, SCALE_RATIO)
    pairs = int(sum(g.size for g in groups))
    print(
        f"pooled skewness {skewness:.3f} over {pairs} pairs, 95% bootstrap interval [{low:.3f}, {high:.3f}]"
    )
    print(f"reference law: G1 - {SCALE_RATIO} G2, gamma shape {shape:.4f}, skewness {reference:.2f}")

    rng = np.random.default_rng(1)
    sorted_t = t_statistics(
        sequential.difference_of_delays(rng, (CALIBRATION_DRAWS, MAX_PAIRS), shape, SCALE_RATIO)
    )
    calibration = {level: calibrate(sorted_t, level) for level in LEVELS}
    del sorted_t
    for level, table in calibration.items():
        kept = [n for n, row in table.items() if row[3]]
        print(
            f"{level:.0%}: a nominal level keeps it at n = {kept[:3]} ... ({len(kept)} of {len(table)} counts)"
        )

    measured = {
        "folders": [p.name for p in args.folders],
        "pairs": pairs,
        "skewness": skewness,
        "low": low,
        "high": high,
        "reference": reference,
        "shape": shape,
    }
    text = render(measured, calibration)
    if args.write:
        OUTPUT.write_text(text)
        ruff = Path(sys.executable).with_name("ruff")
        if ruff.exists():
            subprocess.run([str(ruff), "format", "--quiet", str(OUTPUT)], check=True)
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
    else:
        print(text)


if __name__ == "__main__":
    main()
