"""The numerical contract's measurement: two trajectories from identical state, compared step by step.

The contract and its bound: docs/candidate.md."""

from __future__ import annotations

import copy
import math
import struct
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from experiments.arms import make_optimizer
from experiments.fit import embedded
from experiments.workloads import SCALES, build_param_groups, fill_synthetic_grads
from harness.limits import MAX_PAIRS
from harness.schema import option
from optimizers.musgd import muon_momentum
from optimizers.newton_schulz import muon_scale, newton_schulz

BF16_MANTISSA_BITS = 7
# A reordered or zero-padded GEMM rounds differently, which perturbs each Newton-Schulz iterate by about one
# bf16 ulp; the factor 2 allows the perturbation to enter at more than one of the five iterations. Stated,
# not tuned: the measured ratio to the bound is reported by every parity run.
ULP_SENSITIVITY_FACTOR = 2.0
SENSITIVITY_TRIALS = 3
COMPARISONS = ("control", "candidate")
RANKS = "ranks"  # the candidate on N ranks against the one-rank candidate (--gpus N)


@dataclass(frozen=True)
class ParitySettings:
    """The parity tier's own options, each declared once (``harness.schema``): the CLI is made from them."""

    scale: str = option("n", "YOLO26 parameter set: n, s, m, l or x.", choices=SCALES)
    # One trial per step and comparison: the pairs' bound.
    steps: int = option(
        1, "Steps to follow; step one is judged, later ones are reported.", low=1, high=MAX_PAIRS
    )
    fit: bool = option(
        False, "Real forward/backward steps of the embedded fit workload instead.", flag="--fit"
    )
    candidate: str = option("candidate", "Deprecated: --arms baseline,X.", hidden=True, cli_default=None)
    baseline: str = option("baseline")


@dataclass
class StepFigures:
    """How two trajectories compare after one step."""

    comparison: str
    step: int
    buffers_equal: int
    buffers_total: int
    params_equal: int
    params_total: int
    max_abs_diff: float
    max_rel_diff: float
    loss_reference: float | None = None
    loss_other: float | None = None
    loss_bytes_equal: bool | None = None
    ranks_agree: bool | None = None  # ranks comparison: every rank's parameters equal rank 0's


STEP_FIELDS = tuple(f.name for f in fields(StepFigures))


@dataclass
class ParityResult:
    """Every logged step's figures, judged at step one."""

    settings: ParitySettings
    workload: str
    steps: list[StepFigures] = field(default_factory=list)
    bound_worst_ratio: dict[str, float] = field(default_factory=dict)
    bound_largest: float = 0.0
    contract: dict[str, bool] = field(default_factory=dict)
    ranks: int = 1
    ranks_sharing: str = ""  # how the ranks comparison's candidate shared its Newton-Schulz

    @property
    def holds(self) -> bool:
        return bool(self.contract) and all(self.contract.values())

    @classmethod
    def from_rows(cls, settings: ParitySettings, workload: str, rows: list[dict[str, Any]]) -> ParityResult:
        """The result of logged step rows (one per comparison and step), judged at step one."""
        result = cls(
            settings, workload, [StepFigures(**{k: row.get(k) for k in STEP_FIELDS}) for row in rows]
        )
        for row in rows:
            if row["comparison"] == RANKS:
                result.ranks, result.ranks_sharing = int(row.get("ranks") or 1), row.get("sharing_text") or ""
            if row["step"] == 1 and row.get("bound_largest") is not None:
                ratio = row.get("bound_worst_ratio")  # a ratio beyond any bound is logged as null
                result.bound_worst_ratio[row["comparison"]] = math.inf if ratio is None else float(ratio)
                result.bound_largest = max(result.bound_largest, float(row["bound_largest"]))
        if set(COMPARISONS) <= set(result.bound_worst_ratio):
            result.contract = judge(result.steps, result.bound_worst_ratio)
        return result


def judge(steps: list[StepFigures], bound_worst_ratio: dict[str, float]) -> dict[str, bool]:
    """The one-step contract, clause by clause."""
    first = {f.comparison: f for f in steps if f.step == 1}
    control, candidate = first["control"], first["candidate"]
    bound = "within lr·muon·bf16 rounding of the update"
    contract = {
        "control: parameters identical": control.params_equal == control.params_total,
        "control: buffers bit-equal": control.buffers_equal == control.buffers_total,
        "candidate: buffers bit-equal": candidate.buffers_equal == candidate.buffers_total,
        f"candidate: largest difference {bound}": bound_worst_ratio["candidate"] <= 1.0,
    }
    if control.loss_bytes_equal is not None:
        contract["control: loss bytes identical"] = bool(control.loss_bytes_equal)
        contract["candidate: loss bytes identical"] = bool(candidate.loss_bytes_equal)
    if RANKS in first and RANKS in bound_worst_ratio:
        contract["ranks: every rank holds rank 0's parameters"] = bool(first[RANKS].ranks_agree)
        contract[f"ranks: largest difference from one rank {bound}"] = bound_worst_ratio[RANKS] <= 1.0
    return contract


class Workload:
    """A parameter set (or the embedded fit model) to copy, and how to put gradients on a copy."""

    def __init__(self, settings: ParitySettings, device: str = "cpu", seed: int = 0) -> None:
        self.settings, self.device, self.seed = settings, torch.device(device), seed
        self.name = self.describe(settings)
        self._bounds: dict[int, float] | None = None
        if not settings.fit:
            self.groups, self.kwargs = build_param_groups(settings.scale, self.device, torch.float32, seed)
            return
        torch.manual_seed(seed)
        self.embedded = embedded
        self.model = embedded.SmallConvNet().to(device)
        images, labels = embedded.synthetic_images(64, embedded.DEFAULT_IMGSZ, seed)
        self.images, self.labels = images.to(device), labels.to(device)
        self.kwargs = {"muon": embedded.MUON_SCALE, "sgd": embedded.SGD_SCALE}

    @staticmethod
    def describe(settings: ParitySettings) -> str:
        if settings.fit:
            return "embedded fit workload (SmallConvNet, one real forward/backward per step)"
        return f"YOLO26{settings.scale} parameter set, seeded synthetic gradients"

    def copy(self) -> tuple[Any, list[dict[str, Any]]]:
        """A fresh, identical copy (a model in fit mode, param groups otherwise) and its param groups."""
        if self.settings.fit:
            model, fit = copy.deepcopy(self.model), self.embedded
            return model, fit.build_param_groups(model, fit.LR0, fit.MOMENTUM, fit.WEIGHT_DECAY)
        groups = [
            {**g, "params": [torch.nn.Parameter(p.detach().clone(), p.requires_grad) for p in g["params"]]}
            for g in self.groups
        ]
        return groups, groups

    def step_one_bounds(
        self, optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]
    ) -> dict[int, float]:
        """Step one's per-tensor bounds: every comparison starts from this state, so computed once."""
        if self._bounds is None:
            self._bounds = update_bounds(optimizer, groups, self.kwargs.get("muon", 0.2))
        return self._bounds

    def backward(self, state: Any, step: int) -> float | None:
        """Put step ``step``'s gradients on ``state``; in fit mode return the loss (fp32) it was taken from."""
        if not self.settings.fit:
            fill_synthetic_grads(state, self.seed * 1000 + step)
            return None
        state.zero_grad(set_to_none=True)
        batch = slice((step * 16) % 64, (step * 16) % 64 + 16)
        logits = state(self.images[batch].float() / 255)
        loss = torch.nn.functional.cross_entropy(logits, self.labels[batch])
        loss.backward()
        return loss.detach().float().item()


def ulp_sensitivity(matrix: torch.Tensor, trials: int = SENSITIVITY_TRIALS, seed: int = 0) -> float:
    """Largest change of the exact-shape bf16 Newton-Schulz output when each input element moves by ±1 ulp."""
    generator = torch.Generator().manual_seed(seed)
    rounded = matrix.to(torch.bfloat16)
    reference = newton_schulz(rounded).float()
    spread = 0.0
    for _ in range(trials):
        up = torch.rand(rounded.shape, generator=generator) < 0.5
        target = torch.where(up, float("inf"), float("-inf")).bfloat16()
        neighbour = torch.nextafter(rounded.cpu(), target).to(rounded.device)  # one ulp up or down, each
        spread = max(spread, (newton_schulz(neighbour).float() - reference).abs().max().item())
    return spread


def update_bounds(
    optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]], muon: float
) -> dict[int, float]:
    """Per parameter (by position): lr·muon times the bf16 rounding of its Muon update; 0 without Muon."""
    bounds: dict[int, float] = {}
    for index, (group, p) in enumerate((g, p) for g in groups for p in g["params"]):
        if p.grad is None or not group["use_muon"]:
            bounds[index] = 0.0
            continue
        state = optimizer.state.get(p, {})
        buffer = state["momentum_buffer"].clone() if "momentum_buffer" in state else torch.zeros_like(p)
        matrix = muon_momentum(p.grad, buffer, group["momentum"], group["nesterov"])
        matrix = matrix.reshape(len(matrix), -1)
        scale = muon_scale(p.grad.shape)
        largest = newton_schulz(matrix).float().abs().max().item() * scale
        ulp = 2.0 ** (math.floor(math.log2(largest)) - BF16_MANTISSA_BITS) if 0 < largest < math.inf else 0.0
        rounding = max(ulp, ULP_SENSITIVITY_FACTOR * ulp_sensitivity(matrix) * scale)
        bounds[index] = group["lr"] * muon * rounding
    return bounds


class Trajectory:
    """One arm's optimizer over a fresh copy of the workload's parameters."""

    def __init__(self, workload: Workload, spec: str) -> None:
        self.state, self.groups = workload.copy()
        self.optimizer = make_optimizer(spec, self.groups, workload.kwargs)
        self.params = [p for g in self.groups for p in g["params"]]

    def buffers(self) -> list[dict[str, Any]]:
        """Each parameter's optimizer state."""
        return [self.optimizer.state.get(p, {}) for p in self.params]


def compare_tensors(
    name: str, step: int, ref_params: list[torch.Tensor], other_params: list[torch.Tensor], states: list[Any]
) -> tuple[StepFigures, list[float]]:
    """The step's figures from the parameters and (reference, other) states; the other side moved to the
    reference's device, where its tensors came from another process."""
    buffers_equal = buffers_total = params_equal = 0
    max_abs = max_rel = 0.0
    per_param: list[float] = []
    for p_ref, p_other, (ref_state, other_state) in zip(ref_params, other_params, states, strict=True):
        p_ref, p_other = p_ref.detach(), p_other.detach().to(p_ref.device)
        diff = (p_ref.double() - p_other.double()).abs()
        largest = diff.max().item() if diff.numel() else 0.0
        per_param.append(largest)
        params_equal += int(torch.equal(p_ref, p_other))
        max_abs = max(max_abs, largest)
        scale = p_ref.double().abs().clamp_min(torch.finfo(torch.float32).tiny)
        max_rel = max(max_rel, (diff / scale).max().item() if diff.numel() else 0.0)
        for key in sorted(set(ref_state) | set(other_state)):
            buffer, other_buffer = ref_state.get(key), other_state.get(key)
            if isinstance(buffer, torch.Tensor):
                buffers_total += 1
                other_buffer = None if other_buffer is None else other_buffer.to(buffer.device)
                buffers_equal += int(other_buffer is not None and torch.equal(buffer, other_buffer))
    figures = StepFigures(
        name, step, buffers_equal, buffers_total, params_equal, len(ref_params), max_abs, max_rel
    )
    return figures, per_param


def bound_fields(per_param: list[float], bounds: dict[int, float]) -> dict[str, Any]:
    """How the worst tensor of step one stands against its bound, as row fields."""
    ratios = [
        d / b if b > 0 else (0.0 if d == 0 else math.inf)
        for d, b in zip(per_param, bounds.values(), strict=True)
    ]
    worst = max(ratios, default=0.0)
    return {
        "bound_worst_ratio": worst,
        "bound_largest": max(bounds.values(), default=0.0),
        "within_bound": worst <= 1.0,
    }


class Comparison:
    """The reference arm against another, step by step from identical state on identical inputs.

    The ranks comparison holds the one-rank candidate alone: its other side comes saved by the ranks' rank 0."""

    def __init__(self, name: str, workload: Workload, settings: ParitySettings) -> None:
        self.name, self.workload = name, workload
        reference = settings.candidate if name == RANKS else settings.baseline
        others = {"control": [settings.baseline], "candidate": [settings.candidate]}.get(name, [])
        self.sides = [Trajectory(workload, spec) for spec in [reference, *others]]
        self.steps_done = 0
        self.losses: list[float | None] = []
        self.bounds: dict[int, float] | None = None

    def advance(self) -> None:
        """One step of every trajectory here; at step one, the bounds from the reference's gradients."""
        step, workload, reference = self.steps_done + 1, self.workload, self.sides[0]
        self.losses = [workload.backward(side.state, step) for side in self.sides]
        self.bounds = workload.step_one_bounds(reference.optimizer, reference.groups) if step == 1 else None
        for side in self.sides:
            side.optimizer.step()
        if workload.device.type == "cuda":
            torch.cuda.synchronize(workload.device)
        self.steps_done = step

    def step(self, other: tuple[list[torch.Tensor], list[dict[str, Any]]] | None = None) -> dict[str, Any]:
        """One step compared, as a row: against the other trajectory, or ``other`` (parameters, states)."""
        self.advance()
        reference = self.sides[0]
        params, states = other or (self.sides[1].params, self.sides[1].buffers())
        pairs = list(zip(reference.buffers(), states, strict=True))
        figures, per_param = compare_tensors(self.name, self.steps_done, reference.params, params, pairs)
        if len(self.losses) == 2 and self.losses[0] is not None:
            figures.loss_reference, figures.loss_other = self.losses
            figures.loss_bytes_equal = same_bytes(*self.losses)
        row = asdict(figures)
        if self.bounds is not None:
            row.update(bound_fields(per_param, self.bounds))
        return row


def prepare(settings: ParitySettings, device: str) -> None:
    if settings.fit and device.startswith("cuda"):
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def run_parity(settings: ParitySettings, device: str = "cpu", seed: int = 0) -> ParityResult:
    """Run the control and the candidate comparison for ``settings.steps`` steps in memory and judge step one."""
    prepare(settings, device)
    workload = Workload(settings, device, seed)
    rows = []
    for name in COMPARISONS:
        comparison = Comparison(name, workload, settings)
        rows += [comparison.step() for _ in range(settings.steps)]
    return ParityResult.from_rows(settings, workload.name, rows)


def same_bytes(a: float, b: float) -> bool:
    """Whether two losses have the same fp32 bytes."""
    return struct.pack("<f", a) == struct.pack("<f", b)
