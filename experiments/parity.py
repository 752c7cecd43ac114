"""The numerical contract of GUIDE §6, as a command: does the candidate still compute the same thing?

Two comparisons run from identical state on identical inputs: the baseline against itself (the control,
which must show exactly zero) and the candidate against the baseline. After one step the contract is:
identical loss bytes (fit mode), momentum buffers equal bit for bit, and a largest parameter difference no
larger than the bf16 rounding of the Muon update times lr·muon, tensor by tensor (zero for parameters with no
Muon part). "bf16 rounding of the update" is measured, not picked: the larger of one bf16 ulp of the update's
largest entry and ``ULP_SENSITIVITY_FACTOR`` times the baseline's own sensitivity to a ±1-ulp perturbation of
its bf16 Newton-Schulz input (``ulp_sensitivity``), since a reordered or zero-padded GEMM perturbs the
iterates by about that much.

The buffer clause is GUIDE §6's claim, judged literally: every buffer bit-equal. It is stricter than the bound:
the SGD buffer of a weight-decayed Muon parameter reads p after its Muon update, so a Muon update that
differs within the bound can make that buffer differ by weight decay times the difference (the batched-path
tests allow exactly that slack). On the H200 the one-step difference was zero, so both clauses held. Over ``--steps N`` the trajectories are followed and their divergence is
reported step by step; no agreement is claimed there (BF16 trajectories drift apart).

Inputs: the YOLO26 parameter set of a scale with seeded synthetic gradients (default), or with ``--fit`` a
real forward/backward step of the embedded fit workload (a small conv net with the trainer's MuSGD groups).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from experiments.arms import make_optimizer
from experiments.workloads import build_param_groups, fill_synthetic_grads
from harness import env
from harness.run import new_run_folder
from harness.tables import RunFolder, write_json_atomic
from optimizers.musgd import muon_momentum
from optimizers.newton_schulz import muon_scale, newton_schulz

BF16_MANTISSA_BITS = 7
# A reordered or zero-padded GEMM rounds differently, which perturbs each Newton-Schulz iterate by about one
# bf16 ulp; the factor 2 allows the perturbation to enter at more than one of the five iterations. Stated,
# not tuned: the measured ratio to the bound is reported by every parity run.
ULP_SENSITIVITY_FACTOR = 2.0
SENSITIVITY_TRIALS = 3


@dataclass(frozen=True)
class ParitySettings:
    scale: str = "n"
    device: str = "cpu"
    steps: int = 1
    seed: int = 0
    fit: bool = False
    candidate: str = "candidate"
    baseline: str = "baseline"


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


@dataclass
class ParityResult:
    settings: ParitySettings
    workload: str
    steps: list[StepFigures] = field(default_factory=list)
    bound_worst_ratio: dict[str, float] = field(default_factory=dict)
    bound_largest: float = 0.0
    contract: dict[str, bool] = field(default_factory=dict)
    gpus_start: list[dict[str, Any]] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return all(self.contract.values())


class Workload:
    """Two identical copies of a parameter set and how to put gradients on them (and compute a loss)."""

    def __init__(self, settings: ParitySettings) -> None:
        self.settings = settings
        device = torch.device(settings.device)
        if settings.fit:
            from experiments.fit import embedded

            torch.manual_seed(settings.seed)
            self.model = embedded.SmallConvNet().to(device)
            self.images, self.labels = embedded.synthetic_images(64, embedded.DEFAULT_IMGSZ, settings.seed)
            self.images, self.labels = self.images.to(device), self.labels.to(device)
            self.groups_of: Callable[[torch.nn.Module], list[dict[str, Any]]] = lambda m: (
                embedded.build_param_groups(m, embedded.LR0, embedded.MOMENTUM, embedded.WEIGHT_DECAY)
            )
            self.kwargs = {"muon": embedded.MUON_SCALE, "sgd": embedded.SGD_SCALE}
            self.name = "embedded fit workload (SmallConvNet, one real forward/backward per step)"
        else:
            self.groups, self.kwargs = build_param_groups(
                settings.scale, device, torch.float32, settings.seed
            )
            self.name = f"YOLO26{settings.scale} parameter set, seeded synthetic gradients"

    def copy(self) -> Any:
        """A fresh, identical copy of the parameters (a model in fit mode, param groups otherwise)."""
        if self.settings.fit:
            return copy.deepcopy(self.model)
        return [
            {**g, "params": [torch.nn.Parameter(p.detach().clone(), p.requires_grad) for p in g["params"]]}
            for g in self.groups
        ]

    def groups_for(self, state: Any) -> list[dict[str, Any]]:
        return self.groups_of(state) if self.settings.fit else state

    def backward(self, state: Any, step: int) -> float | None:
        """Put step ``step``'s gradients on ``state``; in fit mode return the loss (fp32) it was taken from."""
        if not self.settings.fit:
            fill_synthetic_grads(state, self.settings.seed * 1000 + step)
            return None
        state.zero_grad(set_to_none=True)
        batch = slice((step * 16) % 64, (step * 16) % 64 + 16)
        logits = state(self.images[batch].float() / 255)
        loss = torch.nn.functional.cross_entropy(logits, self.labels[batch])
        loss.backward()
        return loss.detach().float().item()


def _params(groups: list[dict[str, Any]]) -> list[torch.Tensor]:
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
    """Per parameter (by position): lr·muon times the bf16 rounding of its Muon update; 0 without Muon.

    Computed from the baseline's own building blocks on a copy of the pre-step buffer: the update's largest
    entry gives one ulp, the 1-ulp sensitivity of its Newton-Schulz input gives the GEMM-rounding scale.
    """
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


def _compare(
    name: str,
    step: int,
    reference: tuple[torch.optim.Optimizer, list[torch.Tensor]],
    other: tuple[torch.optim.Optimizer, list[torch.Tensor]],
) -> tuple[StepFigures, list[float]]:
    (ref_opt, ref_params), (other_opt, other_params) = reference, other
    buffers_equal = buffers_total = params_equal = 0
    max_abs = max_rel = 0.0
    per_param: list[float] = []
    for p_ref, p_other in zip(ref_params, other_params, strict=True):
        diff = (p_ref.detach().double() - p_other.detach().double()).abs()
        largest = diff.max().item() if diff.numel() else 0.0
        per_param.append(largest)
        params_equal += int(torch.equal(p_ref, p_other))
        max_abs = max(max_abs, largest)
        scale = p_ref.detach().double().abs().clamp_min(torch.finfo(torch.float32).tiny)
        max_rel = max(max_rel, (diff / scale).max().item() if diff.numel() else 0.0)
        ref_state, other_state = ref_opt.state.get(p_ref, {}), other_opt.state.get(p_other, {})
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


def run_parity(settings: ParitySettings) -> ParityResult:
    """Run the control and the candidate comparison for ``settings.steps`` steps and judge step one."""
    if settings.fit and settings.device.startswith("cuda"):
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    workload = Workload(settings)
    result = ParityResult(settings, workload.name, gpus_start=env.gpu_snapshot())
    bounds: dict[int, float] | None = None
    for comparison, other_spec in (("control", settings.baseline), ("candidate", settings.candidate)):
        states = workload.copy(), workload.copy()
        groups = workload.groups_for(states[0]), workload.groups_for(states[1])
        optimizers = (
            make_optimizer(settings.baseline, groups[0], workload.kwargs),
            make_optimizer(other_spec, groups[1], workload.kwargs),
        )
        params = _params(groups[0]), _params(groups[1])
        for step in range(1, settings.steps + 1):
            losses = [workload.backward(state, step) for state in states]
            if step == 1 and bounds is None:  # the same for both comparisons: identical reference state
                bounds = update_bounds(optimizers[0], groups[0], workload.kwargs.get("muon", 0.2))
            for optimizer in optimizers:
                optimizer.step()
            if workload.settings.device.startswith("cuda"):
                torch.cuda.synchronize()
            figures, per_param = _compare(
                comparison, step, (optimizers[0], params[0]), (optimizers[1], params[1])
            )
            if losses[0] is not None:
                figures.loss_reference, figures.loss_other = losses
                figures.loss_bytes_equal = _same_bytes(losses[0], losses[1])
            result.steps.append(figures)
            if step == 1:
                ratios = [
                    d / b if b > 0 else (0.0 if d == 0 else math.inf)
                    for d, b in zip(per_param, bounds.values(), strict=True)
                ]
                result.bound_worst_ratio[comparison] = max(ratios, default=0.0)
                result.bound_largest = max(result.bound_largest, max(bounds.values(), default=0.0))
    _judge(result)
    return result


def _same_bytes(a: float, b: float) -> bool:
    return (
        torch.tensor(a, dtype=torch.float32).view(torch.int32).item()
        == torch.tensor(b, dtype=torch.float32).view(torch.int32).item()
    )


def _judge(result: ParityResult) -> None:
    """The one-step contract, clause by clause."""
    first = {f.comparison: f for f in result.steps if f.step == 1}
    control, candidate = first["control"], first["candidate"]
    result.contract = {
        "control: parameters identical": control.params_equal == control.params_total,
        "control: buffers bit-equal": control.buffers_equal == control.buffers_total,
        "candidate: buffers bit-equal": candidate.buffers_equal == candidate.buffers_total,
        "candidate: largest difference within lr·muon·bf16 rounding of the update": result.bound_worst_ratio[
            "candidate"
        ]
        <= 1.0,
    }
    if control.loss_bytes_equal is not None:
        result.contract["control: loss bytes identical"] = bool(control.loss_bytes_equal)
        result.contract["candidate: loss bytes identical"] = bool(candidate.loss_bytes_equal)


def divergence_table(result: ParityResult) -> pd.DataFrame:
    return pd.DataFrame([asdict(f) for f in result.steps])


def write_parity_folder(result: ParityResult, runs_root: Path, command: str) -> RunFolder:
    """A parity run folder: parity.json (settings, contract, figures), divergence.csv, env.json, report.md."""
    folder = new_run_folder(runs_root, "parity")
    record = env.collect()
    record["gpus_start"] = result.gpus_start
    record["gpus_end"] = env.gpu_snapshot()
    write_json_atomic(folder.file("env.json"), record)
    summary = {
        "command": command,
        "settings": asdict(result.settings),
        "workload": result.workload,
        "contract": result.contract,
        "contract_holds": result.holds,
        "bound_largest": result.bound_largest,
        "bound_worst_ratio": result.bound_worst_ratio,
    }
    write_json_atomic(folder.file("parity.json"), summary)
    folder.write_csv("divergence.csv", divergence_table(result))
    folder.file("report.md").write_text(parity_markdown(result, record, command))
    return folder


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def parity_markdown(result: ParityResult, record: dict[str, Any], command: str) -> str:
    """The parity report: verdict, one-step figures, the bound, the divergence table, the environment."""
    s = result.settings
    first = {f.comparison: f for f in result.steps if f.step == 1}
    lines = [
        "# Parity: candidate against baseline",
        "",
        f"Command: `{command}`",
        "",
        f"Workload: {result.workload}; device `{s.device}`; seed {s.seed}; {s.steps} step(s). Baseline arm "
        f"`{s.baseline}`, candidate arm `{s.candidate}`.",
        "",
        f"**One-step contract: {'holds' if result.holds else 'BROKEN'}.**",
        "",
        "| clause | holds |",
        "| --- | --- |",
        *[f"| {clause} | {'yes' if ok else '**no**'} |" for clause, ok in result.contract.items()],
        "",
        "## After one step from identical state",
        "",
        "| comparison | buffers bit-equal | parameters identical | largest abs diff | largest rel diff | diff / bound | loss bytes equal |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in ("control", "candidate"):
        f = first[name]
        loss = "n/a" if f.loss_bytes_equal is None else ("yes" if f.loss_bytes_equal else "no")
        lines.append(
            f"| {name} | {f.buffers_equal} of {f.buffers_total} | {f.params_equal} of {f.params_total} | "
            f"{_g(f.max_abs_diff)} | {_g(f.max_rel_diff)} | {_g(result.bound_worst_ratio[name])} | {loss} |"
        )
    lines += [
        "",
        "The bound per tensor is lr·muon times the bf16 rounding of the baseline's own Muon update: the larger of "
        f"one ulp of its largest entry and {ULP_SENSITIVITY_FACTOR:g}× the output's spread under ±1-ulp "
        "perturbations of its bf16 Newton-Schulz input (0 for tensors without a Muon part); the largest bound "
        f"here is {_g(result.bound_largest)}. 'diff / bound' is the worst tensor's ratio (≤ 1 holds).",
        "",
    ]
    if s.steps > 1:
        lines += [
            f"## Divergence over {s.steps} steps (reported, not claimed)",
            "",
            "| step | control max abs diff | candidate max abs diff | candidate buffers bit-equal |",
            "| --- | --- | --- | --- |",
        ]
        by_step: dict[int, dict[str, StepFigures]] = {}
        for f in result.steps:
            by_step.setdefault(f.step, {})[f.comparison] = f
        for step, pair in sorted(by_step.items()):
            c, k = pair["control"], pair["candidate"]
            lines.append(
                f"| {step} | {_g(c.max_abs_diff)} | {_g(k.max_abs_diff)} | {k.buffers_equal} of {k.buffers_total} |"
            )
        lines.append("")
    lines += [
        "## Environment",
        "",
        "| field | value |",
        "| --- | --- |",
        *[
            f"| {key} | {'not recorded' if record.get(key) is None else record.get(key)} |"
            for key in (
                "gpu_names",
                "driver_version",
                "cuda_runtime",
                "cudnn",
                "torch",
                "python",
                "cpu_model",
                "git_revision",
                "git_dirty",
            )
        ],
        "",
        "Not claimed: identical multi-step training. On the CPU the candidate keeps the baseline's per-parameter "
        "path, so a CPU parity run checks the plumbing; the batched path is exercised on CUDA.",
        "",
    ]
    return "\n".join(lines)
