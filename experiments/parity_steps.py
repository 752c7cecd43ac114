"""The numerical contract's measurement: two trajectories from identical state, compared step by step.

The contract and its bound: docs/candidate.md."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from experiments.arms import make_optimizer, same_path_as_baseline
from experiments.workloads import SCALES, build_param_groups, fill_synthetic_grads
from harness.limits import MAX_PAIRS
from harness.present.model import Section, Table
from harness.schema import option
from optimizers.musgd import muon_momentum
from optimizers.newton_schulz import muon_scale, newton_schulz

if TYPE_CHECKING:
    import pandas as pd

BF16_MANTISSA_BITS = 7
# A reordered or zero-padded GEMM rounds differently, which perturbs each Newton-Schulz iterate by about one
# bf16 ulp; the factor 2 allows the perturbation to enter at more than one of the five iterations. Stated,
# not tuned: the measured ratio to the bound is reported by every parity run.
ULP_SENSITIVITY_FACTOR = 2.0
SENSITIVITY_TRIALS = 3


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
        steps = [StepFigures(**{k: row.get(k) for k in STEP_FIELDS}) for row in rows]
        result = cls(settings, workload, steps)
        for row in rows:
            if row["comparison"] == RANKS:
                result.ranks, result.ranks_sharing = int(row.get("ranks") or 1), row.get("sharing_text") or ""
            if (
                row["step"] == 1 and row.get("bound_largest") is not None
            ):  # a ratio beyond any bound is logged as null
                ratio = row.get("bound_worst_ratio")
                result.bound_worst_ratio[row["comparison"]] = math.inf if ratio is None else float(ratio)
                result.bound_largest = max(result.bound_largest, float(row["bound_largest"]))
        if set(COMPARISONS) <= set(result.bound_worst_ratio):
            result.contract = judge(result.steps, result.bound_worst_ratio)
        return result


class Workload:
    """Two identical copies of a parameter set and how to put gradients on them (and compute a loss)."""

    def __init__(self, settings: ParitySettings, device: str = "cpu", seed: int = 0) -> None:
        self.settings, self.device, self.seed = settings, torch.device(device), seed
        self._bounds: dict[int, float] | None = None
        if settings.fit:
            # The fit tier's whole package: a parity rank imports it only with --fit.
            from experiments.fit import embedded

            torch.manual_seed(seed)
            self.model = embedded.SmallConvNet().to(device)
            self.images, self.labels = embedded.synthetic_images(64, embedded.DEFAULT_IMGSZ, seed)
            self.images, self.labels = self.images.to(device), self.labels.to(device)
            self.groups_of: Callable[[torch.nn.Module], list[dict[str, Any]]] = lambda m: (
                embedded.build_param_groups(m, embedded.LR0, embedded.MOMENTUM, embedded.WEIGHT_DECAY)
            )
            self.kwargs = {"muon": embedded.MUON_SCALE, "sgd": embedded.SGD_SCALE}
            self.name = self.describe(settings)
        else:
            self.groups, self.kwargs = build_param_groups(settings.scale, self.device, torch.float32, seed)
            self.name = self.describe(settings)

    @staticmethod
    def describe(settings: ParitySettings) -> str:
        if settings.fit:
            return "embedded fit workload (SmallConvNet, one real forward/backward per step)"
        return f"YOLO26{settings.scale} parameter set, seeded synthetic gradients"

    def copy(self) -> Any:
        """A fresh, identical copy of the parameters (a model in fit mode, param groups otherwise)."""
        if self.settings.fit:
            return copy.deepcopy(self.model)
        return [
            {**g, "params": [torch.nn.Parameter(p.detach().clone(), p.requires_grad) for p in g["params"]]}
            for g in self.groups
        ]

    def step_one_bounds(
        self, optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]
    ) -> dict[int, float]:
        """The per-tensor bounds of step one, from the reference optimizer: the same for every comparison (they
        all start from this workload's state), so computed once."""
        if self._bounds is None:
            self._bounds = update_bounds(optimizer, groups, self.kwargs.get("muon", 0.2))
        return self._bounds

    def groups_for(self, state: Any) -> list[dict[str, Any]]:
        return self.groups_of(state) if self.settings.fit else state

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


def params_of(groups: list[dict[str, Any]]) -> list[torch.Tensor]:
    return [p for g in groups for p in g["params"]]


def _ulp_bf16(magnitude: float) -> float:
    """One bf16 rounding step at ``magnitude`` (0 for 0)."""
    if magnitude == 0 or not math.isfinite(magnitude):
        return 0.0
    return 2.0 ** (math.floor(math.log2(magnitude)) - BF16_MANTISSA_BITS)


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
        rounding = max(_ulp_bf16(largest), ULP_SENSITIVITY_FACTOR * ulp_sensitivity(matrix) * scale)
        bounds[index] = group["lr"] * muon * rounding
    return bounds


class Trajectory:
    """One arm's optimizer over a fresh copy of the workload's parameters."""

    def __init__(self, workload: Workload, spec: str) -> None:
        self.state = workload.copy()
        self.groups = workload.groups_for(self.state)
        self.optimizer = make_optimizer(spec, self.groups, workload.kwargs)
        self.params = params_of(self.groups)

    def buffers(self) -> list[dict[str, Any]]:
        """Each parameter's optimizer state."""
        return [self.optimizer.state.get(p, {}) for p in self.params]


def compare_tensors(
    name: str, step: int, ref_params: list[torch.Tensor], other_params: list[torch.Tensor], states: list[Any]
) -> tuple[StepFigures, list[float]]:
    """The step's figures from the parameters and (reference, other) optimizer states, tensor by tensor."""
    buffers_equal = buffers_total = params_equal = 0
    max_abs = max_rel = 0.0
    per_param: list[float] = []
    for p_ref, p_other, (ref_state, other_state) in zip(ref_params, other_params, states, strict=True):
        diff = (p_ref.detach().double() - p_other.detach().double()).abs()
        largest = diff.max().item() if diff.numel() else 0.0
        per_param.append(largest)
        params_equal += int(torch.equal(p_ref, p_other))
        max_abs = max(max_abs, largest)
        scale = p_ref.detach().double().abs().clamp_min(torch.finfo(torch.float32).tiny)
        max_rel = max(max_rel, (diff / scale).max().item() if diff.numel() else 0.0)
        for key in sorted(set(ref_state) | set(other_state)):
            if not isinstance(ref_state.get(key), torch.Tensor):
                continue
            buffers_total += 1
            other_buffer = other_state.get(key)
            buffers_equal += int(other_buffer is not None and torch.equal(ref_state[key], other_buffer))
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
    """One comparison (the reference arm against another) followed step by step from identical state."""

    def __init__(self, name: str, workload: Workload, reference: str, other: str) -> None:
        self.name, self.workload = name, workload
        self.sides = Trajectory(workload, reference), Trajectory(workload, other)
        self.steps_done = 0

    def step(self) -> dict[str, Any]:
        """One step of both trajectories: their figures, and at step one how the worst tensor meets its bound."""
        step, workload, (ref, other) = self.steps_done + 1, self.workload, self.sides
        losses = [workload.backward(side.state, step) for side in self.sides]
        bounds = workload.step_one_bounds(ref.optimizer, ref.groups) if step == 1 else None
        for side in self.sides:
            side.optimizer.step()
        if workload.device.type == "cuda":
            torch.cuda.synchronize(workload.device)
        self.steps_done = step
        states = list(zip(ref.buffers(), other.buffers(), strict=True))
        figures, per_param = compare_tensors(self.name, step, ref.params, other.params, states)
        if losses[0] is not None:
            figures.loss_reference, figures.loss_other = losses
            figures.loss_bytes_equal = same_bytes(losses[0], losses[1])
        row = asdict(figures)
        if bounds is not None:
            row.update(bound_fields(per_param, bounds))
        return row


def prepare(settings: ParitySettings, device: str) -> None:
    if settings.fit and device.startswith("cuda"):
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


COMPARISONS = ("control", "candidate")
RANKS = "ranks"  # the candidate on N ranks against the one-rank candidate (--gpus N)


def other_arm(settings: ParitySettings, comparison: str) -> str:
    return settings.baseline if comparison == "control" else settings.candidate


def run_parity(settings: ParitySettings, device: str = "cpu", seed: int = 0) -> ParityResult:
    """Run the control and the candidate comparison for ``settings.steps`` steps in memory and judge step one."""
    prepare(settings, device)
    workload = Workload(settings, device, seed)
    rows = []
    for name in COMPARISONS:
        comparison = Comparison(name, workload, settings.baseline, other_arm(settings, name))
        rows += [comparison.step() for _ in range(settings.steps)]
    return ParityResult.from_rows(settings, workload.name, rows)


def same_bytes(a: float, b: float) -> bool:
    return (
        torch.tensor(a, dtype=torch.float32).view(torch.int32).item()
        == torch.tensor(b, dtype=torch.float32).view(torch.int32).item()
    )


def judge(steps: list[StepFigures], bound_worst_ratio: dict[str, float]) -> dict[str, bool]:
    """The one-step contract, clause by clause."""
    first = {f.comparison: f for f in steps if f.step == 1}
    control, candidate = first["control"], first["candidate"]
    contract = {
        "control: parameters identical": control.params_equal == control.params_total,
        "control: buffers bit-equal": control.buffers_equal == control.buffers_total,
        "candidate: buffers bit-equal": candidate.buffers_equal == candidate.buffers_total,
        "candidate: largest difference within lr·muon·bf16 rounding of the update": bound_worst_ratio[
            "candidate"
        ]
        <= 1.0,
    }
    if control.loss_bytes_equal is not None:
        contract["control: loss bytes identical"] = bool(control.loss_bytes_equal)
        contract["candidate: loss bytes identical"] = bool(candidate.loss_bytes_equal)
    if RANKS in first and RANKS in bound_worst_ratio:
        ranks = first[RANKS]
        contract["ranks: every rank holds rank 0's parameters"] = bool(ranks.ranks_agree)
        contract["ranks: largest difference from one rank within lr·muon·bf16 rounding of the update"] = (
            bound_worst_ratio[RANKS] <= 1.0
        )
    return contract


def divergence_table(result: ParityResult) -> pd.DataFrame:
    import pandas as pd  # here, not at the top: a parity rank imports this module and needs no pandas

    return pd.DataFrame([asdict(f) for f in result.steps])


def figure_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


TITLE = "Parity: candidate against baseline"


def parity_section(result: ParityResult, device: str, seed: int) -> Section:
    """The parity section: verdict, one-step figures, the bound and the divergence table."""
    s, text = result.settings, figure_text
    first = {f.comparison: f for f in result.steps if f.step == 1}
    lines: list[Any] = [
        f"Workload: {result.workload}; device `{device}`; seed {seed}; {s.steps} step(s). Baseline arm "
        f"`{s.baseline}`, candidate arm `{s.candidate}`.",
        "",
    ]
    if not set(COMPARISONS) <= set(first):
        return Section.of_lines(TITLE, lines + ["Step one has not run for both comparisons yet: no verdict."])
    clauses = [(clause, "yes" if ok else "**no**") for clause, ok in result.contract.items()]
    judged = [n for n in (*COMPARISONS, RANKS) if n in first and n in result.bound_worst_ratio]
    one_step = [
        [
            name,
            f"{f.buffers_equal} of {f.buffers_total}",
            f"{f.params_equal} of {f.params_total}",
            text(f.max_abs_diff),
            text(f.max_rel_diff),
            text(result.bound_worst_ratio[name]),
            "n/a" if f.loss_bytes_equal is None else ("yes" if f.loss_bytes_equal else "no"),
        ]
        for name, f in ((n, first[n]) for n in judged)
    ]
    headers = (
        "comparison,buffers bit-equal,parameters identical,largest abs diff,largest rel diff,diff / bound"
    )
    lines += [
        f"**One-step contract: {'holds' if result.holds else 'BROKEN'}.**",
        "",
        Table(["clause", "holds"], clauses),
        "",
        "#### After one step from identical state",
        "",
        Table([*headers.split(","), "loss bytes equal"], one_step),
        "",
        "The bound per tensor is lr·muon times the bf16 rounding of the baseline's own Muon update: the larger of "
        f"one ulp of its largest entry and {ULP_SENSITIVITY_FACTOR:g}× the output's spread under ±1-ulp "
        "perturbations of its bf16 Newton-Schulz input (0 for tensors without a Muon part); the largest bound "
        f"here is {text(result.bound_largest)}. 'diff / bound' is the worst tensor's ratio (≤ 1 holds).",
    ]
    if RANKS in first:
        f = first[RANKS]
        verdict = (
            "bit for bit"
            if f.params_equal == f.params_total
            else f"within {text(result.bound_worst_ratio.get(RANKS))} of the bound (largest difference "
            f"{text(f.max_abs_diff)})"
        )
        lines += [
            "",
            f"ranks: the candidate on {result.ranks} ranks against the one-rank candidate in this process, from "
            f"identical state on identical inputs; after one step they agree {verdict}; "
            f"{result.ranks_sharing or 'no sharing recorded'}.",
        ]
    if s.steps > 1:
        lines += [
            "",
            f"#### Divergence over {s.steps} steps (reported, not claimed)",
            "",
            _divergence(result),
        ]
    lines += ["", "Not claimed: identical multi-step training."]
    same = same_path_as_baseline(s.candidate, device, s.baseline)
    if same:
        lines[-1] += (
            f" Here {same}, so this run checks the plumbing; the batched path is exercised on CUDA, or on the "
            "CPU with `--candidate candidate-cpu`."
        )
    return Section.of_lines(TITLE, lines)


def _divergence(result: ParityResult) -> Table:
    """Each step's largest differences, per comparison, as a markdown table."""
    ranked = any(f.comparison == RANKS and f.step == 1 for f in result.steps)
    by_step: dict[int, dict[str, StepFigures]] = {}
    for f in result.steps:
        by_step.setdefault(f.step, {})[f.comparison] = f
    rows = [
        [step, figure_text(pair["control"].max_abs_diff), figure_text(pair["candidate"].max_abs_diff)]
        + [f"{pair['candidate'].buffers_equal} of {pair['candidate'].buffers_total}"]
        + ([figure_text(pair[RANKS].max_abs_diff) if RANKS in pair else "n/a"] if ranked else [])
        for step, pair in sorted(by_step.items())
        if set(COMPARISONS) <= set(pair)
    ]
    headers = ["step", "control max abs diff", "candidate max abs diff", "candidate buffers bit-equal"]
    return Table(headers + (["ranks max abs diff"] if ranked else []), rows)


# --- the tier ---------------------------------------------------------------------------------------------
