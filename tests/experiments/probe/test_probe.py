"""The probe tier: head workload math, chunked = native, the command end to end, bad inputs, OOM as a row."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from experiments.probe.section import share_table, zero_cost_bound
from experiments.probe.trial import (
    DetectHeadWorkload,
    LMHead,
    chunked_loss,
    detect_head_records,
    module_index,
    native_loss,
)
from experiments.workloads import SCALES, load_workload
from harness.cli import main
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import Arm, Case
from harness.tables import Summaries
from tests import ROOT
from tests.argv import ONE_PAIR
from tests.trialfns import runner

# A small softcap makes tanh clearly nonlinear on unit-scale logits (1 - tanh² ≈ 0.8 rather than ≈ 1 at cap
# 30), so a wrong softcap derivative shows up as a large error, not one hidden in rounding.
SMALL_CAP = 2.0


# --- an independent float64 reference of the softcapped cross-entropy --------------------------------------


def reference(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float
) -> dict[str, torch.Tensor]:
    """Loss and gradients written from the calculus, in float64, with no autograd.

    Forward: z = H Wᵀ, t = tanh(z / cap), s = cap·t, loss = mean_i(logsumexp(s_i) − s_i,target).
    Backward: dL/ds = (softmax(s) − onehot) / N, dL/dz = dL/ds · (1 − t²), dW = (dL/dz)ᵀ H, dH = (dL/dz) W.
    """
    h, w = hidden.double(), weight.double()
    rows = h.shape[0]
    squashed = torch.tanh(h @ w.T / cap)
    logits = cap * squashed
    lse = torch.logsumexp(logits, dim=1)
    onehot = torch.nn.functional.one_hot(targets, w.shape[0]).double()
    probs = torch.exp(logits - lse[:, None])
    grad_z = (probs - onehot) / rows * (1 - squashed**2)
    return {
        "loss": (lse - logits.gather(1, targets[:, None]).squeeze(1)).mean(),
        "grad_hidden": grad_z @ w,
        "grad_weight": grad_z.T @ h,
        # what the a-priori error bounds below need
        "probs": probs,
        "onehot": onehot,
        "lse": lse,
        "logits": logits,
    }


def run_variant(
    variant: str, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float, chunk: int
) -> dict[str, torch.Tensor]:
    h = hidden.detach().clone().requires_grad_()
    w = torch.nn.Parameter(weight.detach().clone())
    if variant == "native":
        loss = native_loss(h, w, targets, cap)
    else:
        loss = chunked_loss(h, w, targets, cap, chunk)
    loss.backward()
    return {"loss": loss.detach(), "grad_hidden": h.grad, "grad_weight": w.grad}


def float64_error_bounds(
    ref: dict[str, torch.Tensor], hidden: torch.Tensor, weight: torch.Tensor, cap: float
) -> dict[str, torch.Tensor]:
    """A-priori bounds on float64 rounding error, elementwise.

    Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1: a sum of n terms in any order is off by at
    most γ_n·Σ|terms|. Here γ_n = n·u / (1 − n·u), u the unit roundoff.

    n is the longest chain of dependent roundings any result goes through. Those are the d-term dot product of
    a logit, the V-term normalizer of a row, and the N-term sum of the loss or of dW. Then come the formula's
    elementwise operations: ÷cap, tanh, ×cap, −lse, exp, the one-hot subtraction, ÷N, 1−t², the product with
    it = 9. The magnitudes are the same expressions in absolute values. An error in a logit moves a row's loss
    by at most twice as much: log-sum-exp and the picked logit are each 1-Lipschitz. It moves a softmax weight
    by at most the weight times the logit error. Hence the (1 + B) amplification, B the largest |h_i|·|w_j|
    dot product plus cap.
    """
    rows, dim = hidden.shape
    vocab = weight.shape[0]
    elementwise = 9
    n = dim + vocab + rows + elementwise
    u = torch.finfo(torch.float64).eps / 2
    gamma = n * u / (1 - n * u)
    h_abs, w_abs = hidden.double().abs(), weight.double().abs()
    amplification = 1 + float((h_abs @ w_abs.T).max()) + cap
    weights = (ref["probs"] + ref["onehot"]) / rows
    loss_scale = (ref["lse"].abs() + ref["logits"].abs().max(dim=1).values).mean() + 2 * (amplification - 1)
    return {
        "loss": gamma * loss_scale,
        "grad_hidden": gamma * amplification * (weights @ w_abs),
        "grad_weight": gamma * amplification * (weights.T @ h_abs),
    }


def float64_case(rows: int, vocab: int, dim: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, dim, generator=generator, dtype=torch.float64)
    weight = torch.randn(vocab, dim, generator=generator, dtype=torch.float64) * dim**-0.5
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    return hidden, weight, targets


@pytest.mark.parametrize("variant,chunk", [("native", 0), ("chunked", 16), ("chunked", 7), ("chunked", 1000)])
def test_float64_loss_and_gradients_match_the_reference(variant: str, chunk: int) -> None:
    """Both variants against the calculus, in float64, within the a-priori rounding bound.

    Chunk 7 leaves a ragged last chunk (50 = 7·7 + 1); chunk 1000 is one chunk for all rows.
    """
    hidden, weight, targets = float64_case(rows=50, vocab=40, dim=12)
    ref = reference(hidden, weight, targets, SMALL_CAP)
    bounds = float64_error_bounds(ref, hidden, weight, SMALL_CAP)
    got = run_variant(variant, hidden, weight, targets, SMALL_CAP, chunk)
    for name in ("loss", "grad_hidden", "grad_weight"):
        error = (got[name].double() - ref[name]).abs()
        assert bool((error <= bounds[name]).all()), f"{variant} {name}: error {float(error.max()):.3e}"


def test_float64_bound_rejects_a_wrong_softcap_derivative() -> None:
    """The bound can fail: the gradient without the softcap's (1 − t²) factor lies far outside it."""
    hidden, weight, targets = float64_case(rows=50, vocab=40, dim=12)
    ref = reference(hidden, weight, targets, SMALL_CAP)
    bounds = float64_error_bounds(ref, hidden, weight, SMALL_CAP)
    wrong = ((ref["probs"] - ref["onehot"]) / hidden.shape[0]).T @ hidden
    assert bool(((wrong - ref["grad_weight"]).abs() > bounds["grad_weight"]).any())
    dropped = reference(hidden[:-1], weight, targets[:-1], SMALL_CAP)["loss"]  # a chunk loop that loses a row
    assert float((dropped - ref["loss"]).abs()) > float(bounds["loss"])


# --- bf16, the production precision: chunked against native ------------------------------------------------


def one_ulp_perturbed(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Every element moved by one unit in the last place of its own dtype, up or down at random."""
    up = torch.nextafter(x, torch.full_like(x, math.inf))
    down = torch.nextafter(x, torch.full_like(x, -math.inf))
    return torch.where(torch.rand(x.shape, generator=generator) < 0.5, up, down)


def bf16_inputs(
    rows: int, vocab: int, dim: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A head's hidden states, weight (exactly representable in bf16, so perturbable there) and targets."""
    head = LMHead.build("native", rows, vocab, dim, SMALL_CAP, chunk, "cpu", seed=3)
    return head.hidden.detach(), head.weight.detach().to(torch.bfloat16).float(), head.targets


def native_one_ulp_away(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
) -> dict:
    """The native variant on ``hidden`` and bf16 ``weight``, each moved by one ulp at random."""
    generator = torch.Generator().manual_seed(11)
    moved_hidden = one_ulp_perturbed(hidden, generator)
    moved_weight = one_ulp_perturbed(weight.to(torch.bfloat16), generator).float()
    return run_variant("native", moved_hidden, moved_weight, targets, SMALL_CAP, chunk)


@pytest.mark.parametrize("rows,vocab,dim,chunk", [(96, 40, 16, 40), (1000, 300, 64, 128)])
def test_bf16_chunked_gradients_equal_native_within_input_precision(
    rows: int, vocab: int, dim: int, chunk: int
) -> None:
    """Chunked and native gradients differ by less than one ulp of noise in native's own bf16 inputs moves
    them.

    The tolerance is measured: native runs once more on inputs moved by one bf16 ulp. The Frobenius distance
    between the two native results is how much the data's own precision moves the gradient. The variants round
    at different points, so they may differ, but by less than that. The loss is held to the bound bf16 logits
    allow. Every row's loss is 2-Lipschitz in its logits (max norm). So logits one bf16 ulp apart move the
    mean loss by at most 2·mean_i max_j ulp(s_ij).
    """
    hidden, weight, targets = bf16_inputs(rows, vocab, dim, chunk)
    native = run_variant("native", hidden, weight, targets, SMALL_CAP, chunk)
    chunked = run_variant("chunked", hidden, weight, targets, SMALL_CAP, chunk)
    moved = native_one_ulp_away(hidden, weight, targets, chunk)
    for name in ("grad_hidden", "grad_weight"):
        tolerance = float((moved[name].double() - native[name].double()).norm())
        difference = float((chunked[name].double() - native[name].double()).norm())
        assert tolerance > 0
        assert difference <= tolerance, (
            f"{name}: chunked − native {difference:.3e} > input-ulp spread {tolerance:.3e}"
        )
    with torch.no_grad():
        logits = SMALL_CAP * torch.tanh(hidden @ weight.to(torch.bfloat16).T / SMALL_CAP)
        ulp = (torch.nextafter(logits.abs(), torch.full_like(logits, math.inf)) - logits.abs()).float()
    loss_tolerance = 2 * float(ulp.max(dim=1).values.mean())
    assert abs(float(chunked["loss"]) - float(native["loss"])) <= loss_tolerance


def test_bf16_tolerance_rejects_a_lost_chunk() -> None:
    """The input-ulp spread is tight enough to catch a real defect: dW missing the last chunk's rows."""
    rows, vocab, dim, chunk = 96, 40, 16, 40
    hidden, weight, targets = bf16_inputs(rows, vocab, dim, chunk)
    native = run_variant("native", hidden, weight, targets, SMALL_CAP, chunk)
    moved = native_one_ulp_away(hidden, weight, targets, chunk)
    tolerance = float((moved["grad_weight"] - native["grad_weight"]).norm())
    # what native gives for the last chunk alone, scaled as part of the whole batch
    last = run_variant("native", hidden[80:], weight, targets[80:], SMALL_CAP, chunk)["grad_weight"] * (
        16 / rows
    )
    assert float(last.norm()) > tolerance


def test_chunked_memory_is_streamed() -> None:
    """The chunked forward keeps only per-row normalizers: its autograd graph saves no N×V tensor."""
    head = LMHead.build("chunked", 256, 64, 8, 30.0, 32, "cpu", seed=0)
    saved: list[torch.Size] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        chunked_loss(head.hidden, head.weight, head.targets, 30.0, 32)
    assert saved and all(shape.numel() < 256 * 64 for shape in saved)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        native_loss(head.hidden, head.weight, head.targets, 30.0)
    assert any(shape.numel() >= 256 * 64 for shape in saved)


# --- the detect head from the recorded shapes --------------------------------------------------------------


@pytest.mark.parametrize("scale", SCALES)
def test_detect_head_is_built_from_every_recorded_parameter(scale: str) -> None:
    workload = load_workload(scale)
    records = detect_head_records(workload)
    last = max(i for i in (module_index(p["name"]) for p in workload["params"]) if i is not None)
    assert records and all(module_index(r["name"]) == last for r in records)
    head = DetectHeadWorkload.build(scale, imgsz=32, batch=1, device="cpu", seed=0)
    assert set(head.head.paths) == {r["name"] for r in records}
    assert len({id(p) for p in head.head.parameters()}) == len(records)  # nothing built beyond the records
    for record in records:
        assert list(head.head.recorded(record["name"]).shape) == record["shape"]
    grouped = {id(p): g for g in head.groups for p in g["params"]}
    for record in records:
        group = grouped[id(head.head.recorded(record["name"]))]
        spec = workload["groups"][record["group"]]
        assert (group["lr"], group["use_muon"], group["weight_decay"]) == (
            spec["lr"],
            spec["use_muon"],
            spec["weight_decay"],
        )
    assert sum(len(g["params"]) for g in head.groups) == len(records)


def test_detect_forward_backward_reaches_every_parameter() -> None:
    head = DetectHeadWorkload.build("n", imgsz=64, batch=2, device="cpu", seed=0)
    assert [tuple(f.shape[2:]) for f in head.features] == [(8, 8), (4, 4), (2, 2)]
    loss = head.forward_backward()
    assert torch.isfinite(loss)
    for group in head.groups:
        for p in group["params"]:
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    assert all(f.grad is not None for f in head.features)


# --- stage share --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("share,bound", [(0.0982, 10), (0.10, 11), (0.0037, 0.4), (0.5, 51)])
def test_zero_cost_bound_is_strictly_above_the_share(share: float, bound: float) -> None:
    assert zero_cost_bound(share) == pytest.approx(bound)
    assert zero_cost_bound(share) > 100 * share


def test_share_table_states_share_and_saving_and_skips_failed_heads() -> None:
    arms = (Arm("baseline", "baseline", "baseline"), Arm("candidate", "candidate", "candidate"))
    plan = Plan(
        "probe",
        ProtocolOptions(arms, warmup=0, pairs=1),
        [Case("lm-native", {}, arms), Case("lm-chunked", {}, arms)],
        "ms",
        "head step time",
    )
    table = pd.DataFrame(
        [
            {"case": "lm-native", "arm": "baseline", "median": 28.31},
            {"case": "lm-native", "arm": "candidate", "median": 20.0},
            {"case": "lm-chunked", "arm": "baseline", "median": math.inf},
            {"case": "lm-chunked", "arm": "candidate", "median": 30.0},
        ]
    )
    empty = pd.DataFrame()
    shares = share_table(plan, Summaries(empty, table, empty, empty), learner_ms=288.6).set_index(
        ["case", "arm"]
    )
    assert shares.loc[("lm-native", "baseline"), "head_share"] == pytest.approx(28.31 / 288.6)
    assert shares.loc[("lm-native", "baseline"), "zero_cost_saving_under_percent"] == 10
    assert shares.loc[("lm-native", "candidate"), "learner_step_reduction"] == pytest.approx(8.31 / 288.6)
    assert math.isnan(shares.loc[("lm-chunked", "baseline"), "head_share"])
    assert math.isnan(shares.loc[("lm-chunked", "candidate"), "learner_step_reduction"])


def test_section_with_device_memory_figures_and_failures(tmp_path: Path) -> None:
    """The section's CUDA side, on the CPU, from rows shaped like a CUDA run's.

    It checks the memory table, the fit and failure sentences, the memory and stage-share plots, and both tidy
    CSVs.
    """
    from experiments.probe.plan import ProbeSettings, make_plan
    from experiments.probe.section import report_section
    from experiments.tiers import TIERS
    from harness.options import protocol_options
    from harness.present.model import markdown
    from harness.tier import Run

    gib = 2**30
    settings = ProbeSettings(head="lm", tokens=64, vocab=32, dim=8, chunk=24, learner_ms=288.6)
    plan = make_plan(protocol_options(warmup=0, pairs=2, device="cpu"), settings)
    plan.protocol = dataclasses.replace(plan.protocol, budget=6 * gib)
    plan.settings["reserve_bytes"] = 1 * gib
    plan.in_process = False  # the runner caps device memory only for in-process runs; there is no device here
    message = (
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 130.00 "
        "GiB is free. Of the allocated memory 4.50 GiB is allocated by PyTorch, and 0.20 GiB is reserved by "
        "PyTorch but unallocated. 6.00 GiB allowed; ..."
    )

    def trial(ctx):
        if ctx.case.params["variant"] == "native":
            raise torch.OutOfMemoryError(message)
        fast = ctx.arm.role == "candidate"
        return {
            "value": 30.0 if fast else 32.0,
            "fwd_bwd_ms": 25.0,
            "step_ms": 5.0 if fast else 7.0,
            "peak_allocated": int(2.1 * gib),
            "peak_reserved": int(2.4 * gib),
            "allocated_at_start": gib + 2**27,
            "head_extra_peak": int(0.9 * gib),
            "step_extra_peak": 2**25,
            "reserve_bytes": gib,
        }

    folder = runner(tmp_path, tiers=TIERS).start(plan, trial).folder
    text = "\n".join(markdown(report_section(Run.load(folder, folder.path / "figures"))))
    assert (
        "lm-native · baseline: out of memory in 2 of 2 measured trials (a 2.00 GiB allocation refused" in text
    )
    assert "so the budget refused it" in text  # 130 GiB free on the card: the 6 GiB budget said no
    assert "which would take 0.69% off a learner step" in text  # (32 − 30) / 288.6
    assert "lm-chunked · candidate: fits the 6.00 GiB budget in all 2 measured trials" in text
    assert "even a zero-cost head would save under 12% of the whole run" in text  # 32 / 288.6 = 11.09%
    assert (folder.path / "figures" / "probe-memory.png").stat().st_size > 0
    assert (folder.path / "figures" / "probe-stage-share.png").stat().st_size > 0
    memory = pd.read_csv(folder.file("probe_memory.csv")).set_index(["case", "arm"])
    assert memory.loc[("lm-chunked", "baseline"), "step_extra_peak_median"] == 2**25
    assert memory.loc[("lm-native", "baseline"), "oom_requested_median"] == 2 * gib
    shares = pd.read_csv(folder.file("stage_share.csv")).set_index(["case", "arm"])
    assert math.isnan(shares.loc[("lm-native", "baseline"), "head_share"])
    assert shares.loc[("lm-chunked", "candidate"), "learner_step_reduction"] == pytest.approx(2.0 / 288.6)


# --- the command ------------------------------------------------------------------------------------------

TINY_LM = ["--tokens", "64", "--vocab", "32", "--dim", "8", "--chunk", "24"]


def run_folders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []


def the_run(root: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The one run folder under ``root`` and its log's rows, parsed line by line."""
    (folder,) = run_folders(root)
    return folder, [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]


def test_probe_lm_on_cpu_writes_rows_csvs_and_report(tmp_path: Path) -> None:
    argv = ["probe", "--head", "lm", *TINY_LM, "--warmup", "1", "--pairs", "2", "--learner-ms", "400"]
    assert main([*argv, "--out", str(tmp_path), "--quiet"]) == 0
    folder, rows = the_run(tmp_path)
    assert len(rows) == 2 * (1 + 2 * 2)
    assert {r["case"] for r in rows} == {"lm-native", "lm-chunked"}
    assert all(r["status"] == "ok" and r["value"] > 0 for r in rows)
    assert all(r["fwd_bwd_ms"] > 0 and r["step_ms"] > 0 and math.isfinite(r["loss"]) for r in rows)
    assert all(r["peak_allocated"] is None for r in rows)  # no allocator counters on the CPU
    # paired arms see the same data: same loss within a measured round
    measured = pd.DataFrame([r for r in rows if r["phase"] == "measured"])
    assert (measured.groupby(["case", "round"])["loss"].nunique() == 1).all()
    shares = pd.read_csv(folder / "stage_share.csv")
    arms = pd.read_csv(folder / "arms.csv")
    merged = shares.merge(arms, on=["case", "arm"])
    assert (merged["head_share"] - merged["median"] / 400).abs().max() < 1e-12
    assert (folder / "probe_memory.csv").is_file()
    report = (folder / "report.md").read_text()
    assert "### Head probe" in report and "even a zero-cost head would save under" in report
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["tier"] == "probe" and "factory" not in plan and "sections" not in plan  # data, never code


def test_probe_detect_on_cpu(tmp_path: Path) -> None:
    argv = ["probe", "--head", "detect", "--scale", "n", "--imgsz", "64", "--batch", "1", *ONE_PAIR]
    assert main([*argv, "--out", str(tmp_path), "--quiet", "--no-report"]) == 0
    _, rows = the_run(tmp_path)
    assert [r["case"] for r in rows] == ["yolo26n-detect"] * 2
    assert all(r["status"] == "ok" and r["value"] > 0 for r in rows)


def test_a_head_whose_loss_is_not_finite_is_a_failed_trial(tmp_path: Path) -> None:
    """A softcap past bf16's range makes the LM head's loss NaN: each trial is an `error` row, as a NaN fit
    is.
    """
    out = tmp_path / "runs"
    argv = ["probe", *TINY_LM, "--variants", "chunked", "--cap", "1e308", "--device", "cpu"]
    assert main([*argv, *ONE_PAIR, "--quiet", "--no-report", "--out", str(out)]) == 3
    _, rows = the_run(out)
    assert rows and {r["status"] for r in rows} == {"error"}
    assert all("loss" in r["message"] and "nan" in r["message"] for r in rows), rows


@pytest.mark.parametrize(
    "args,says",
    [
        (["--head", "mlp"], "--head 'mlp'"),
        (["--variants", "streamed"], "--variants 'streamed'"),
        (["--head", "detect", "--variants", "chunked"], "--variants 'chunked'"),
        (["--variants", "native,native"], "twice"),
        (["--tokens", "0"], "--tokens"),
        (["--vocab", "-3"], "--vocab"),
        (["--dim", "0"], "--dim"),
        (["--chunk", "0"], "--chunk"),
        (["--cap", "0"], "--cap"),
        (["--head", "detect", "--imgsz", "100"], "--imgsz 100"),
        (["--head", "detect", "--batch", "0"], "--batch"),
        (["--head", "detect", "--batch", "1", "--imgsz", "32"], "batch norm"),
        (["--head", "detect", "--scale", "q"], "--scale 'q'"),
        (["--reserve", "1GiB"], "--reserve needs a CUDA device"),
        (["--learner-ms", "0"], "--learner-ms"),
        (["--learner-ms", "nan"], "--learner-ms"),
        (["--budget", "6GiB"], "--budget needs a CUDA device"),
        (["--arms", "baseline,nosuch"], "unknown arm 'nosuch'"),
    ],
)
def test_bad_inputs_exit_2_with_one_line_and_no_run_folder(
    tmp_path: Path, bench, args: list[str], says: str
) -> None:
    lm_options = [] if "detect" in args else TINY_LM  # refused with the detect head
    argv = ["probe", *lm_options, "--device", "cpu", "--pairs", "1", "--out", str(tmp_path / "runs"), *args]
    bench.refused(argv, says)
    assert not (tmp_path / "runs").exists()


# --- CUDA: a budget too small for native is a recorded failure, and the run goes on ------------------------


BUDGET_RUN = """
import json, sys
import torch
from harness.cli import main
out, tiny, budget_run = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
warm = main(["probe", "--head", "lm", *tiny, "--device", "cuda", "--warmup", "0", "--pairs", "1",
             "--out", out + "/warm", "--quiet", "--no-report"])
torch.cuda.synchronize()
before = torch.cuda.memory_allocated()
code = main([*budget_run, "--out", out + "/runs"])
torch.cuda.synchronize()
print(json.dumps({"warm": warm, "code": code, "before": before, "after": torch.cuda.memory_allocated()}))
"""


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_budget_too_small_for_native_is_a_resource_failure_and_chunked_fits(tmp_path: Path) -> None:
    """N=32768, V=8192, d=256 under 1 GiB with 256 MiB reserved: native runs out of memory, and chunked fits.

    Native must hold N×V logits: 512 MiB in bf16, then their softcap, fp32 copy and log-probabilities. Chunks
    of 1024 rows need a few hundred MiB. The run records native's failures and goes on.

    The budget caps everything the process holds, so the run gets a process of its own, as `bench` does. In
    the test process, memory other CUDA tests hold would count against the 1 GiB. The cuBLAS library keeps
    workspaces per handle and stream in the caching allocator for the life of the process. A tiny probe through the same code
    paths creates them before the baseline is taken. What is left after the run is then only what its trials
    leaked.
    """
    import subprocess
    import sys

    rows, vocab = 32768, 8192
    budget_run = [
        "probe", "--head", "lm", "--tokens", str(rows), "--vocab", str(vocab), "--dim", "256",
        "--chunk", "1024", "--device", "cuda", "--budget", "1GiB", "--reserve", "256MiB",
        "--warmup", "1", "--pairs", "2", "--quiet",
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", BUDGET_RUN, str(tmp_path), json.dumps(TINY_LM), json.dumps(budget_run)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["warm"] == 0 and figures["code"] == 0
    (folder,) = run_folders(tmp_path / "runs")
    trials = pd.read_csv(folder / "trials.csv")
    assert len(trials) == 2 * (1 + 2 * 2)  # every scheduled trial ran: the run went on after each failure
    native, chunked = trials[trials["case"] == "lm-native"], trials[trials["case"] == "lm-chunked"]
    assert (native["status"] == "resource_failure").all()
    assert (native["oom_requested"] >= rows * vocab * 2).all()  # an N×V bf16 tensor (or larger) did not fit
    assert (native["oom_budget"] == 2**30).all()
    assert (chunked["status"] == "ok").all(), chunked["message"].tolist()
    assert (chunked["head_extra_peak"] < rows * vocab * 2).all()  # never held an N×V bf16 tensor
    assert (chunked["allocated_at_start"] >= 256 * 2**20).all()  # the reserve was held during the step
    assert (chunked["step_extra_peak"] > 0).all()
    assert (folder / "report.md").is_file()
    assert figures["after"] == figures["before"]  # every trial freed what it held
