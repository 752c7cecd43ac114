"""A run's statistics: per-arm figures, paired reductions, the claims and their verdicts (docs/methods.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy import stats

from harness import folder_format, intervals, sequential, verdicts
from harness.injected import ROLE as CALIBRATION_ROLE
from harness.intervals import CONFIDENCE, Interval

CONTROL_SUFFIX = "-control"


def measured(trials: pd.DataFrame, metric: str = "value") -> pd.DataFrame:
    """Measured rows with ``effective``: the ``metric`` figure, +∞ for a failed trial."""
    if trials.empty:
        return trials.assign(effective=pd.Series(dtype=float))
    rows = trials[trials["phase"] == "measured"].copy()
    ok = rows["status"] == "ok"
    figure = pd.to_numeric(rows[metric], errors="coerce") if metric in rows else np.nan
    rows["effective"] = np.where(ok, figure, np.inf)
    return rows


def finished(trials: pd.DataFrame) -> pd.DataFrame:
    """Measured rows whose trial finished (they carry figures beside the primary one)."""
    if trials.empty:
        return trials
    return trials[(trials["phase"] == "measured") & (trials["status"] == "ok")]


def numeric_column(rows: pd.DataFrame, column: str) -> pd.Series:
    """A per-trial figure as numbers, missing values dropped; empty where the trials do not carry it."""
    if column not in rows:
        return pd.Series(dtype=float)
    return pd.to_numeric(rows[column], errors="coerce").dropna()


def median_of(rows: pd.DataFrame, column: str) -> float:
    """The median of a per-trial figure over ``rows``; NaN where none of them carries it."""
    return float(numeric_column(rows, column).median())


def max_of(rows: pd.DataFrame, column: str) -> float:
    """The largest value of a per-trial figure over ``rows``; NaN where none of them carries it."""
    return float(numeric_column(rows, column).max())


def reduction(baseline: float, candidate: float) -> float:
    """(baseline − candidate) / baseline, with the failure conventions of this module (NaN: both failed)."""
    if math.isinf(baseline):
        return math.nan if math.isinf(candidate) else 1.0
    return -math.inf if math.isinf(candidate) else (baseline - candidate) / baseline


def arm_table(trials: pd.DataFrame) -> pd.DataFrame:
    """Per case and arm: measured trials, failures, median and (min–max) of the primary figure."""
    rows = measured(trials)
    columns = ["case", "arm", "role", "trials", "failed", "median", "min", "max"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for (case, arm), group in rows.groupby(["case", "arm"], sort=False):
        values = group["effective"].to_numpy(dtype=float)
        failed = int((group["status"] != "ok").sum())
        figures = (len(values), failed, float(np.median(values)), float(values.min()), float(values.max()))
        out.append(dict(zip(columns, (case, arm, group["role"].iloc[0], *figures), strict=True)))
    return pd.DataFrame(out, columns=columns)


PAIR_COLUMNS = [
    *("case", "round", "order", "baseline_arm", "arm", "baseline", "candidate", "reduction", "log_ratio"),
    *("arm_second", "both_failed"),
]


def pair_table(trials: pd.DataFrame, metric: str = "value") -> pd.DataFrame:
    """One row per round and non-reference arm: both figures, the reduction, log ratio and order."""
    rows = measured(trials, metric)
    if rows.empty:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    out = []
    for case, group in rows.groupby("case", sort=False):
        reference = group[group["role"] == "baseline"]["arm"]
        if reference.empty:
            continue
        reference_arm = reference.iloc[0]
        for rnd, in_round in group.groupby("round", sort=True):
            base = in_round[in_round["arm"] == reference_arm]
            if base.empty:
                continue
            b = float(base["effective"].iloc[0])
            base_slot = int(base["slot"].iloc[0]) if "slot" in base else 0
            for _, other in in_round[in_round["arm"] != reference_arm].iterrows():
                c = float(other["effective"])
                if math.isnan(b) or math.isnan(c):
                    continue
                both_failed = math.isinf(b) and math.isinf(c)
                log_ratio = math.nan if both_failed else float(intervals.split_pairs([b], [c]).log_ratios[0])
                second = bool(int(other.get("slot", 1)) > base_slot)
                figures = (case, int(rnd), other["order"], reference_arm, other["arm"], b, c, reduction(b, c))
                out.append(dict(zip(PAIR_COLUMNS, (*figures, log_ratio, second, both_failed), strict=True)))
    return pd.DataFrame(out, columns=PAIR_COLUMNS)


@dataclass(frozen=True)
class ClaimSettings:
    """How claims are judged: bar, tolerance, control arms, level and the stopping rule's settings."""

    bar_percent: float | None
    level: float = CONFIDENCE
    control: bool = False
    tolerance_percent: float | None = None
    control_arms: frozenset[str] = field(default_factory=frozenset)
    precision: float | None = None  # with --pairs auto: the target half-width in points
    first_look: int = 6
    max_pairs: int | None = None

    @property
    def sequential(self) -> bool:
        return self.precision is not None and self.max_pairs is not None

    def is_control(self, arm: str, baseline_arm: str) -> bool:
        """An arm judged as an A/A control: a named control arm or the first arm's ``-control`` twin."""
        return arm in self.control_arms or (self.control and arm == f"{baseline_arm}{CONTROL_SUFFIX}")

    @classmethod
    def from_protocol(cls, protocol: Any) -> ClaimSettings:
        """The settings a run's ``ProtocolOptions`` imply."""
        control = bool(getattr(protocol, "control", False))
        arms = tuple(a for a in getattr(protocol, "arms", ()) if a.role != CALIBRATION_ROLE)
        tolerance = getattr(protocol, "tolerance", None)
        pure_control = control and len(arms) <= 2
        if pure_control and tolerance is None:
            tolerance = protocol.bar
        sequential = getattr(protocol, "pairs", None) == "auto"
        return cls(
            bar_percent=None if pure_control else protocol.bar,
            control=control,
            tolerance_percent=tolerance,
            control_arms=frozenset([f"{arms[0].label}{CONTROL_SUFFIX}"] if control and arms else []),
            precision=getattr(protocol, "precision", None) if sequential else None,
            first_look=int(getattr(protocol, "first_look", 6) or 6),
            max_pairs=getattr(protocol, "max_pairs", None) if sequential else None,
        )


@dataclass(frozen=True)
class Check:
    """A check beside the primary interval: its names, column prefix and interval method."""

    name: str  # in a sentence
    label: str  # in claim_intervals.csv
    prefix: str
    interval: Callable[[np.ndarray, float], Interval]
    own_estimate: bool = True  # False: its estimate is the primary's (the claims table keeps one)

    @property
    def columns(self) -> list[str]:
        """Its columns in the claims table."""
        fields = INTERVAL_FIELDS if self.own_estimate else INTERVAL_FIELDS[1:]
        return [f"{self.prefix}_{field}" for field in fields]


# The checks beside the primary: a new one is one entry here (its columns, tables and verdict follow).
INTERVAL_FIELDS = ("estimate", "low", "high", "attained", "sufficient", "method", "verdict")
CHECKS = (
    Check("the geometric-mean t", "geometric mean", "gm", intervals.t_interval),
    Check("the sign test", "sign", "sign", intervals.sign_interval, own_estimate=False),
    Check("Hodges-Lehmann", "Hodges-Lehmann", "hl", intervals.hodges_lehmann_interval),
)
# The design diagnostics' columns and the reason where none, in ``design_figures``' order.
DESIGNS = (
    (("drift", "drift_low", "drift_high", "drift_reason"), "no measured trial"),
    (("order_effect", "order_low", "order_high", "order_reason"), "no usable pair"),
)
FIXED_COLUMNS = (
    *("case", "arm", "baseline_arm", "kind", "pairs", "planned_pairs", "both_failed", "one_failed"),
    *("estimate", "ci_low", "ci_high", "ci_level", "ci_attained", "ci_nominal", "ci_sufficient", "ci_method"),
    *("ci_reason", "verdict_basis", "bar", "verdict"),
    *("failed_trials", "arm_trials", "failure_rate", "failure_low", "failure_high", "median", "min", "max"),
    *("arm_second", "arm_first", "stopping"),
)


def claim_columns() -> list[str]:
    """The claims table's columns: the fixed ones, each registered check's, the design diagnostics'."""
    checks = (column for check in CHECKS for column in check.columns)
    return [*FIXED_COLUMNS, *checks, *(column for columns, _ in DESIGNS for column in columns)]


CLAIM_COLUMNS = claim_columns()  # as registered at import; the claims table reads the registry when made


def interval_families() -> list[tuple[str, str, str]]:
    """(name in claim_intervals.csv, column prefix, estimate's column): the primary, the checks, the rest."""
    checks = [(c.label, c.prefix, f"{c.prefix}_estimate" if c.own_estimate else "estimate") for c in CHECKS]
    designs = [("order effect", "order", "order_effect"), ("drift", "drift", "drift")]
    return [("primary", "ci", "estimate"), *checks, ("failure rate", "failure", "failure_rate"), *designs]


def claim_tables(claims: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The claims table written as three: narrow ``claims.csv``, long intervals and long diagnostics."""
    long_fields = list(folder_format.INTERVAL_COLUMNS)[4:]  # after case, arm, interval and estimate
    families = []
    for label, prefix, estimate in interval_families():
        named = {f: "verdict" if (prefix, f) == ("ci", "verdict") else f"{prefix}_{f}" for f in long_fields}
        columns = {f: c for f, c in {"estimate": estimate, **named}.items() if c in claims.columns}
        families.append((label, columns))
    rows = [
        {"case": row["case"], "arm": row["arm"], "interval": label, **{f: row[c] for f, c in columns.items()}}
        for _, row in claims.iterrows()
        for label, columns in families
        if "low" in columns
    ]
    used = set(folder_format.CLAIM_COLUMNS).union(*(set(c.values()) - {"verdict"} for _, c in families))
    rest = [column for column in claims.columns if column not in used]
    long = claims.melt(id_vars=["case", "arm"], value_vars=rest, var_name="name") if rest else pd.DataFrame()
    if not long.empty:
        long = long.sort_values(["case", "arm"], kind="stable")
    return {
        folder_format.CLAIMS_CSV: claims.reindex(columns=list(folder_format.CLAIM_COLUMNS)),
        folder_format.INTERVALS_CSV: pd.DataFrame(rows, columns=list(folder_format.INTERVAL_COLUMNS)),
        folder_format.DIAGNOSTICS_CSV: long.reindex(columns=list(folder_format.DIAGNOSTIC_COLUMNS)),
    }


def judge(interval: Interval, limit: float | None, control: bool) -> str:
    """The verdict of one interval against ±tolerance, the bar, or else 0."""
    if limit is None:
        return verdicts.direction(interval)
    if control:
        return intervals.control_verdict(interval, limit)
    return intervals.claim_verdict(interval, limit)


def disagreeing_checks(claim: Any) -> list[tuple[str, str]]:
    """The distribution-free checks (name, column prefix) whose verdict differs from the claim's."""
    verdict = str(claim["verdict"])
    return [(c.name, c.prefix) for c in CHECKS if str(claim.get(f"{c.prefix}_verdict", verdict)) != verdict]


# ------------------------------------------------------------------ design diagnostics: drift and order


def _columns(values, arms, index, blocks, second) -> tuple[np.ndarray, list[np.ndarray], int, bool]:
    """log(value) of the finished trials and the regressors: position, arm and slice levels, order flag."""
    y = np.asarray(values, dtype=float).ravel()
    labels = np.asarray(arms).ravel()
    position = np.arange(y.size, dtype=float) if index is None else np.asarray(index, dtype=float).ravel()
    slices = np.zeros(y.size) if blocks is None else np.asarray(blocks).ravel()
    late = None if second is None else np.asarray(second, dtype=bool).ravel()
    if any(a.shape != y.shape for a in (labels, position, slices, y if late is None else late)):
        raise ValueError("need one arm label, one index, one slice label and one order flag per trial")
    finished = np.isfinite(y) & (y > 0)
    y, labels, position, slices = np.log(y[finished]), labels[finished], position[finished], slices[finished]
    steps = list(dict.fromkeys(slices.tolist()))[1:]
    columns = [position] + [(labels == name).astype(float) for name in dict.fromkeys(labels.tolist())]
    columns += [(slices == step).astype(float) for step in steps]
    if late is not None:
        columns.append(late[finished].astype(float))
    return y, columns, len(steps), bool(position.size and np.ptp(position) > 0)


def _coefficient(name, method, level, y, columns, which: int, spread: bool, times: int = 1) -> Interval:
    """Coefficient ``which`` of the least-squares fit, times ``times``, in percent with its t interval."""
    design = np.column_stack(columns)
    df = y.size - design.shape[1]
    reason = "" if spread and df >= 1 else "too few finished trials"
    if not reason:
        coefficients, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
        reason = "" if rank == design.shape[1] else "index confounded with arms, slices or order"
    if reason:
        return Interval(name, method, *(math.nan,) * 3, level, level, y.size, False, reason)
    residual = y - design @ coefficients
    se = math.sqrt(float(residual @ residual) / df * np.linalg.inv(design.T @ design)[which, which])
    value, half = float(coefficients[which]), float(stats.t.ppf(0.5 + level / 2.0, df) * se)
    figures = (100.0 * math.expm1(times * v) for v in (value, value - half, value + half))
    return Interval(name, method, *figures, level, level, y.size, True)


ORDER = "order effect (arm second vs first)"
ORDER_METHOD = "twice the least-squares step of a trial run second, apart from drift and slices, t interval"


def design_effects(
    values: ArrayLike,
    arms: ArrayLike,
    level: float = CONFIDENCE,
    index: ArrayLike | None = None,
    blocks: ArrayLike | None = None,
    second: ArrayLike | None = None,
) -> tuple[Interval, Interval]:
    """Drift (percent per trial, in run order) and the order effect apart from it (percent), one fit.

    Without ``second`` (pairs all in one order) there is no order effect to estimate.
    """
    y, columns, steps, spread = _columns(values, arms, index, blocks, second)
    method = (
        "least-squares slope of log(value) on run position with one level per arm"
        + (" and per slice" if steps else "")
        + (", apart from the order" if second is not None else "")
        + ", t interval"
    )
    trend = _coefficient("drift (percent per trial)", method, level, y, columns, 0, spread)
    if second is None:
        reason = "needs pairs in both orders"
        return trend, Interval(
            ORDER, ORDER_METHOD, *(math.nan,) * 3, level, level, np.size(values), False, reason
        )
    return trend, _coefficient(ORDER, ORDER_METHOD, level, y, columns, -1, spread, times=2)


def design_figures(
    trials: pd.DataFrame, case: Any, arm: Any, group: pd.DataFrame, level: float, metric: str = "value"
) -> tuple[Interval, Interval] | tuple[None, None]:
    """Drift and the order effect of one claim, fitted together on its paired trials in run order."""
    if trials.empty or "index" not in trials:
        return None, None
    baseline_arm = group["baseline_arm"].iloc[0]
    # Run order: by ``started`` where every row carries it, else by index. A slice: the count of resume
    # warm-ups before a row in run order.
    started = pd.to_datetime(trials["started"], errors="coerce", utc=True) if "started" in trials else None
    ran = (trials["index"] if started is None or started.isna().any() else started).rank(method="first")
    resumes = trials.get("warmup_reason", pd.Series("", index=trials.index)).astype(str) == "resume"
    slices = resumes.loc[ran.sort_values().index].cumsum().astype(int).reindex(trials.index)
    ours = measured(trials.assign(slice=slices, ran=ran.astype(int) - 1), metric)
    # A trial's position among the measured trials in run order (every case and arm): warm-ups are no step
    # of drift, and a grown schedule's indices are not the order its trials ran in.
    position = {index: place for place, index in enumerate(ours.sort_values("ran")["index"])}
    late = dict(zip(group["round"], group["arm_second"].astype(bool), strict=True))
    ours = ours[(ours["case"] == case) & ours["arm"].isin([baseline_arm, arm]) & ours["round"].isin(late)]
    ours = ours[~ours["effective"].isna()]
    if ours.empty:
        return None, None
    is_arm = (ours["arm"] == arm).to_numpy()
    arm_late = ours["round"].map(late).to_numpy(dtype=bool)
    values, labels = ours["effective"].to_numpy(dtype=float), ours["arm"].astype(str).to_numpy()
    where = {"index": ours["index"].map(position).to_numpy(dtype=float), "blocks": ours["slice"].to_numpy()}
    second = is_arm == arm_late  # the arm's trial when it ran second, the baseline's when the arm ran first
    single = arm_late.all() or not arm_late.any()  # one order: no order effect to fit or to set apart
    return design_effects(values, labels, level, second=None if single else second, **where)


def claim_table(
    pairs: pd.DataFrame,
    settings: ClaimSettings,
    planned_pairs: int | None = None,
    trials: pd.DataFrame | None = None,
    metric: str = "value",
) -> pd.DataFrame:
    """Per case and non-reference arm: primary interval, checks, verdict and design diagnostics."""
    if pairs.empty:
        return pd.DataFrame(columns=claim_columns())
    trials = pd.DataFrame() if trials is None else trials
    calibration = set(trials["arm"][trials["role"] == CALIBRATION_ROLE]) if "role" in trials else set()
    rows = []
    for (case, arm), group in pairs.groupby(["case", "arm"], sort=False):
        if arm in calibration:
            continue  # read as recovered/known (harness.delay_check), never a claim
        baseline_arm = group["baseline_arm"].iloc[0]
        usable = group[~group["both_failed"].astype(bool)]
        x = usable["log_ratio"].to_numpy(dtype=float)
        reductions = usable["reduction"].to_numpy(dtype=float)
        control = kind_control = settings.is_control(str(arm), str(baseline_arm))
        limit_percent = settings.tolerance_percent if control else settings.bar_percent
        if limit_percent is None and not control and settings.tolerance_percent is not None:
            control, limit_percent = True, settings.tolerance_percent  # no bar: "equivalent within ±T?"
        limit = None if limit_percent is None else limit_percent / 100
        # the median's interval, or with --pairs auto the stopping rule's at its look
        s, decision = settings, None
        if s.sequential and 1 <= x.size <= sequential.looks(s.first_look, s.max_pairs)[-1]:
            ended = f"the log ends here ({x.size} pairs): no more pairs to look at"
            decision = sequential.should_stop(x, s.precision, s.level, s.first_look, s.max_pairs, True, ended)
        chosen = intervals.median_interval(x, s.level) if decision is None else decision.interval
        second = usable["arm_second"].to_numpy(dtype=bool)
        both_failed = len(group) - len(usable)
        row = {
            "case": case,
            "arm": arm,
            "baseline_arm": baseline_arm,
            "kind": "control" if kind_control else "claim",
            "pairs": int(x.size),
            "planned_pairs": planned_pairs,
            "both_failed": both_failed,
            "one_failed": int(np.isinf(x).sum()),
            "estimate": chosen.estimate,
            "ci_level": settings.level,
            "ci_nominal": chosen.nominal_level,  # a sequential look's own level; NaN for a fixed run
            "ci_reason": chosen.reason if x.size else f"no usable pair ({both_failed} with both arms failed)",
            "verdict_basis": "primary",
            **verdicts.failure_rate(trials, case, arm, settings.level),
            "median": chosen.estimate,  # the primary's estimate: one median, whatever the count
            "min": float(reductions.min()) if reductions.size else math.nan,
            "max": float(reductions.max()) if reductions.size else math.nan,
            "bar": limit,
            "verdict": judge(chosen, limit, control),
            "arm_second": int(second.sum()),
            "arm_first": int((~second).sum()),
            "stopping": "" if decision is None else decision.reason,
        }
        for prefix, found in (("ci", chosen), *((c.prefix, c.interval(x, settings.level)) for c in CHECKS)):
            usable_check = bool(found.sufficient and found.computable)
            figures = (
                found.estimate,
                found.low,
                found.high,
                found.attained_level,
                usable_check,
                found.method,
            )
            figures += (judge(found, limit, control),)
            row |= {f"{prefix}_{field}": value for field, value in zip(INTERVAL_FIELDS, figures, strict=True)}
        designs = design_figures(trials, case, arm, group, settings.level, metric)
        for (columns, none), found in zip(DESIGNS, designs, strict=True):
            figures = (
                (found.estimate, found.low, found.high, found.reason) if found else (*(math.nan,) * 3, none)
            )
            row |= dict(zip(columns, figures, strict=True))
        rows.append(row)
    return pd.DataFrame(rows, columns=claim_columns())


def secondary_claims(trials: pd.DataFrame, protocol: Any, metric: str) -> pd.DataFrame:
    """The claims table over a secondary per-trial figure, judged like the primary; it never claims."""
    if trials.empty or metric not in trials or numeric_column(finished(trials), metric).empty:
        return pd.DataFrame(columns=claim_columns())
    pairs = pair_table(trials, metric)
    planned = protocol.pairs if isinstance(protocol.pairs, int) else None
    return claim_table(pairs, ClaimSettings.from_protocol(protocol), planned, trials, metric)
