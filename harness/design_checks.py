"""Design diagnostics of a paired run: drift and the order effect, fitted together (docs/methods.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from harness.inference import CONFIDENCE


@dataclass(frozen=True)
class Diagnostic:
    """A design diagnostic in percent with its t interval (NaN with a reason when not computable)."""

    name: str
    method: str
    estimate: float
    low: float
    high: float
    level: float
    n: int
    reason: str = ""

    @property
    def computable(self) -> bool:
        return not math.isnan(self.estimate)


def _columns(values, arms, index, blocks, second) -> tuple[np.ndarray, list[np.ndarray], int, bool]:
    y = np.asarray(values, dtype=float).ravel()
    labels = np.asarray(arms).ravel()
    position = np.arange(y.size, dtype=float) if index is None else np.asarray(index, dtype=float).ravel()
    slices = np.zeros(y.size) if blocks is None else np.asarray(blocks).ravel()
    late = None if second is None else np.asarray(second, dtype=bool).ravel()
    if any(a.shape != y.shape for a in (labels, position, slices, y if late is None else late)):
        raise ValueError("need one arm label, one index, one slice label and one order flag per trial")
    finished = np.isfinite(y) & (y > 0)
    y, labels, position, slices = np.log(y[finished]), labels[finished], position[finished], slices[finished]
    names = list(dict.fromkeys(labels.tolist()))
    steps = list(dict.fromkeys(slices.tolist()))[1:]
    columns = [position] + [(labels == name).astype(float) for name in names]
    columns += [(slices == step).astype(float) for step in steps]
    if late is not None:
        columns.append(late[finished].astype(float))
    return y, columns, len(steps), bool(position.size and np.ptp(position) > 0)


def drift(
    values: ArrayLike,
    arms: ArrayLike,
    level: float = CONFIDENCE,
    index: ArrayLike | None = None,
    blocks: ArrayLike | None = None,
    second: ArrayLike | None = None,
) -> Diagnostic:
    """Drift over the measured trials in run order, in percent per trial, with its t interval."""
    y, columns, steps, spread = _columns(values, arms, index, blocks, second)
    name = "drift (percent per trial)"
    method = (
        "least-squares slope of log(value) on run position with one level per arm"
        + (" and per slice" if steps else "")
        + (", apart from the order" if second is not None else "")
        + ", t interval"
    )
    return _diagnostic(name, method, level, y, columns, 0, spread)


def _diagnostic(name, method, level, y, columns, which: int, spread: bool, times: int = 1) -> Diagnostic:
    """Coefficient ``which`` of the least-squares fit, times ``times``, in percent with its t interval."""
    design = np.column_stack(columns)
    df = y.size - design.shape[1]
    reason = "" if spread and df >= 1 else "too few finished trials"
    if not reason:
        coefficients, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
        reason = "" if rank == design.shape[1] else "index confounded with arms, slices or order"
    if reason:
        return Diagnostic(name, method, math.nan, math.nan, math.nan, level, y.size, reason)
    residual = y - design @ coefficients
    se = math.sqrt(float(residual @ residual) / df * np.linalg.inv(design.T @ design)[which, which])
    value, half = float(coefficients[which]), float(stats.t.ppf(0.5 + level / 2.0, df) * se)
    figures = (100.0 * math.expm1(times * v) for v in (value, value - half, value + half))
    return Diagnostic(name, method, *figures, level, y.size)


ORDER = "order effect (arm second vs first)"
ORDER_METHOD = "twice the least-squares step of a trial run second, apart from drift and slices, t interval"


def one_order(level: float, n: int) -> Diagnostic:
    """The order effect of pairs all run in one order: none to estimate."""
    return Diagnostic(ORDER, ORDER_METHOD, *(math.nan,) * 3, level, n, "needs pairs in both orders")


def order_effect(
    values: ArrayLike,
    arms: ArrayLike,
    second: ArrayLike,
    level: float = CONFIDENCE,
    index: ArrayLike | None = None,
    blocks: ArrayLike | None = None,
) -> Diagnostic:
    """The order effect apart from drift, in percent, with its t interval."""
    y, columns, _, spread = _columns(values, arms, index, blocks, second)
    return _diagnostic(ORDER, ORDER_METHOD, level, y, columns, len(columns) - 1, spread, times=2)
