"""One probe trial: a head workload and the arm's optimizer, primed, then one timed head step."""

from __future__ import annotations

import contextlib
import math
import traceback
from typing import Any, Protocol

import torch

from experiments.arms import make_optimizer
from experiments.finite import check_finite_step
from experiments.probe.detect import DetectHeadWorkload
from experiments.probe.lm import LMHead
from harness.plan import Plan
from harness.timing import StageClock, SyncTimer, current_allocated, is_cuda, read_peaks, reset_peaks
from harness.trial import TrialContext, TrialFunction


class HeadWorkload(Protocol):
    """What a head offers the trial: its groups, the optimizer's extra arguments and one forward/backward."""

    def param_groups(self) -> list[dict[str, Any]]: ...

    def optimizer_kwargs(self) -> dict[str, Any]: ...

    def forward_backward(self) -> torch.Tensor: ...

    def clear_input_grads(self) -> None: ...


def build_workload(params: dict[str, Any], device: str, seed: int) -> HeadWorkload:
    """The head a case describes (``case.params``), seeded so both arms of a pair see the same data."""
    if params["head"] == "lm":
        shape = [params[key] for key in ("variant", "tokens", "vocab", "dim", "cap")]
        return LMHead.build(*shape, params.get("chunk") or params["tokens"], device, seed)
    if params["head"] == "detect":
        return DetectHeadWorkload.build(params["scale"], params["imgsz"], params["batch"], device, seed)
    raise ValueError(f"unknown head '{params['head']}'")


def _difference(high: int | None, low: int | None) -> int | None:
    return None if high is None or low is None else high - low


def run_head_trial(
    params: dict[str, Any], spec: str, device: str, seed: int, reserve_bytes: int | None
) -> dict[str, Any]:
    """One probe trial of arm ``spec`` on the head ``params`` describes, its device current; returns its figures."""
    try:
        with torch.cuda.device(torch.device(device)) if is_cuda(device) else contextlib.nullcontext():
            return _measure(params, spec, device, seed, reserve_bytes)
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)
        raise


def _measure(
    params: dict[str, Any], spec: str, device: str, seed: int, reserve_bytes: int | None
) -> dict[str, Any]:
    reserve = torch.empty(reserve_bytes, dtype=torch.uint8, device=device) if reserve_bytes else None
    workload = build_workload(params, device, seed)
    optimizer = make_optimizer(spec, workload.param_groups(), workload.optimizer_kwargs())
    workload.forward_backward()  # priming step: untimed
    optimizer.step()
    _drop_grads(optimizer, workload)

    workload.forward_backward()  # attribution step: untimed, the optimizer step's own extra peak
    before_step = current_allocated(device)
    reset_peaks(device)
    optimizer.step()
    step_peak, _ = read_peaks(device)
    _drop_grads(optimizer, workload)

    clock = StageClock(device, synchronized=False)
    at_start = current_allocated(device)
    reset_peaks(device)
    with SyncTimer(device) as timer:
        clock.start()
        loss = workload.forward_backward()
        clock.mark("forward_backward")
        optimizer.step()
        clock.mark("step")
    peak_allocated, peak_reserved = read_peaks(device)
    if not math.isfinite(float(loss)):  # a head that computed nothing is a failed trial, never a fast one
        raise FloatingPointError(f"the head's loss is {float(loss)}")
    check_finite_step(optimizer, "the timed step")
    totals = clock.totals()
    fwd_bwd_ms, step_ms = 1e3 * totals["forward_backward"], 1e3 * totals["step"]
    del reserve
    return {
        "value": timer.seconds * 1000.0,
        "fwd_bwd_ms": fwd_bwd_ms,
        "step_ms": step_ms,
        "loss": float(loss),
        "peak_allocated": peak_allocated,
        "peak_reserved": peak_reserved,
        "allocated_at_start": at_start,
        "head_extra_peak": _difference(peak_allocated, at_start),
        "step_extra_peak": _difference(step_peak, before_step),
        "reserve_bytes": reserve_bytes or 0,
    }


def _drop_grads(optimizer: torch.optim.Optimizer, workload: HeadWorkload) -> None:
    """What a trainer's ``zero_grad`` does between steps (gradients freed, not zeroed)."""
    optimizer.zero_grad(set_to_none=True)
    workload.clear_input_grads()


def trial_function(plan: Plan) -> TrialFunction:
    """The probe's trial function: one head step of the case's head with the trial's arm."""
    reserve_bytes = plan.settings.get("reserve_bytes")

    def trial(ctx: TrialContext) -> dict[str, Any]:
        return run_head_trial(ctx.case.params, ctx.arm.spec, ctx.device, ctx.seed, reserve_bytes)

    return trial
