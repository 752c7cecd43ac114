"""One probe trial: a head workload (lm or detect) and the arm's optimizer, primed, then one timed head step."""

from __future__ import annotations

import contextlib
import math
import re
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from experiments.arms import make_optimizer
from experiments.finite import check_finite_step
from experiments.workloads import GROUP_KEYS, load_workload
from harness.plan import Plan
from harness.timing import StageClock, SyncTimer, current_allocated, is_cuda, read_peaks, reset_peaks
from harness.trial import TrialContext, TrialFunction

LM_VARIANTS = ("native", "chunked")
# The YOLO26 trainer's Muon group and MuSGD gains: the head's step is the arms' step on a real Muon matrix.
HEAD_GROUP: dict[str, Any] = dict(
    lr=0.01, momentum=0.937, nesterov=True, weight_decay=0.0005, use_muon=True, param_group="muon"
)
OPTIMIZER_KWARGS: dict[str, Any] = {"muon": 0.2, "sgd": 1.0}
FIRST_STRIDE = 8  # P3; each further level halves the map (P4 stride 16, P5 stride 32)
_HEAD_PARAM = re.compile(
    r"^model\.(?P<module>\d+)\.(?P<branch>[A-Za-z_]\w*)\.(?P<level>\d+)\.(?P<layer>(?:\d+\.)*)"
    r"(?P<kind>conv\.weight|bn\.weight|bn\.bias|weight|bias)$"
)
# A layer's recorded parameter kinds → their paths in the built layer: with batch norm, and a plain convolution.
_PATHS = {
    True: {"conv.weight": "conv.weight", "bn.weight": "bn.weight", "bn.bias": "bn.bias"},
    False: {"weight": "conv.weight", "bias": "conv.bias"},
}


class HeadWorkload:
    """One seeded head on a device: the optimizer's parameter groups and extra arguments, one forward/backward."""

    groups: list[dict[str, Any]]
    kwargs: dict[str, Any]

    def loss(self) -> torch.Tensor:
        raise NotImplementedError

    def inputs(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def forward_backward(self) -> torch.Tensor:
        loss = self.loss()
        loss.backward()
        return loss.detach()

    def clear_input_grads(self) -> None:
        for tensor in self.inputs():
            tensor.grad = None


# --- the language-model head: softcapped logits and cross-entropy, native or streamed in chunks ---------------


def loss_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The cross-entropy's dtype: fp32 for half-precision compute (as ``F.cross_entropy`` under AMP), else itself."""
    return torch.promote_types(compute_dtype, torch.float32)


def softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(logits / cap)``: bounds the logits to (−cap, cap), near-identity for small ones."""
    return cap * torch.tanh(logits / cap)


def native_loss(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float
) -> torch.Tensor:
    """The head loss written plainly; autograd materializes every N×V intermediate it needs."""
    logits = softcap(hidden @ weight.to(hidden.dtype).T, cap)
    return F.cross_entropy(logits.to(loss_dtype(hidden.dtype)), targets)


class ChunkedSoftcapCrossEntropy(torch.autograd.Function):
    """The same loss with O(chunk·V) extra memory: stream rows forward, recompute them backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float, chunk: int
    ) -> torch.Tensor:
        accumulate, head, rows = loss_dtype(hidden.dtype), weight.to(hidden.dtype), hidden.shape[0]
        log_norms = torch.empty(rows, dtype=accumulate, device=hidden.device)
        total = torch.zeros((), dtype=accumulate, device=hidden.device)
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            logits = softcap(hidden[part] @ head.T, cap).to(accumulate)
            log_norms[part] = torch.logsumexp(logits, dim=1)
            picked = logits.gather(1, targets[part, None]).squeeze(1)
            total += (log_norms[part] - picked).sum()
            del logits, picked
        ctx.save_for_backward(hidden, weight, targets, log_norms)
        ctx.cap, ctx.chunk = cap, chunk
        return total / rows

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, targets, log_norms = ctx.saved_tensors
        cap, chunk = ctx.cap, ctx.chunk
        compute, accumulate = hidden.dtype, loss_dtype(hidden.dtype)
        head, rows = weight.to(compute), hidden.shape[0]
        scale = grad_loss.to(accumulate) / rows
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.promote_types(weight.dtype, accumulate))
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            squashed = torch.tanh((hidden[part] @ head.T) / cap)
            # softmax − one-hot, in the loss dtype, from the forward's log-sum-exp (no second reduction).
            grad_logits = (cap * squashed).to(accumulate).sub_(log_norms[part, None]).exp_()
            grad_logits.scatter_add_(1, targets[part, None], torch.full_like(grad_logits[:, :1], -1.0))
            grad_logits.mul_(scale)
            # The native backward's order and dtypes: to compute dtype, ×cap, tanh', ÷cap.
            grad_z = torch.ops.aten.tanh_backward(grad_logits.to(compute).mul_(cap), squashed).div_(cap)
            del grad_logits, squashed
            if grad_hidden is not None:
                grad_hidden[part] = grad_z @ head
            grad_weight.add_(grad_z.T @ hidden[part])
            del grad_z
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


def chunked_loss(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, cap: float, chunk: int
) -> torch.Tensor:
    """The head loss streamed in chunks of ``chunk`` rows (see ``ChunkedSoftcapCrossEntropy``)."""
    return ChunkedSoftcapCrossEntropy.apply(hidden, weight, targets, cap, chunk)


@dataclass
class LMHead(HeadWorkload):
    """One seeded lm head workload on a device: the inputs, the fp32 master weight and the variant."""

    variant: str
    hidden: torch.Tensor
    weight: torch.nn.Parameter
    targets: torch.Tensor
    cap: float
    chunk: int

    def __post_init__(self) -> None:
        if self.variant not in LM_VARIANTS:
            raise ValueError(f"unknown lm head variant '{self.variant}'; use one of {', '.join(LM_VARIANTS)}")
        self.groups, self.kwargs = [{"params": [self.weight], **HEAD_GROUP}], dict(OPTIMIZER_KWARGS)

    @classmethod
    def build(
        cls,
        variant: str,
        tokens: int,
        vocab: int,
        dim: int,
        cap: float,
        chunk: int,
        device: str | torch.device,
        seed: int,
    ) -> LMHead:
        """Hidden states ~ N(0, 1), weight ~ N(0, 1/d) (logits of unit scale), uniform targets; all seeded."""
        generator = torch.Generator(device=device).manual_seed(seed)
        hidden = torch.randn(tokens, dim, generator=generator, device=device).to(torch.bfloat16)
        weight = torch.randn(vocab, dim, generator=generator, device=device).mul_(dim**-0.5)
        targets = torch.randint(0, vocab, (tokens,), generator=generator, device=device)
        return cls(variant, hidden.requires_grad_(), torch.nn.Parameter(weight), targets, cap, chunk)

    def loss(self) -> torch.Tensor:
        if self.variant == "native":
            return native_loss(self.hidden, self.weight, self.targets, self.cap)
        return chunked_loss(self.hidden, self.weight, self.targets, self.cap, self.chunk)

    def inputs(self) -> list[torch.Tensor]:
        return [self.hidden]


# --- the YOLO26 detect head, rebuilt from the recorded parameter shapes ---------------------------------------


def module_index(name: str) -> int | None:
    """The module index of a parameter named ``model.<i>.…`` (None for other names)."""
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "model" and parts[1].isdigit() else None


def detect_head_records(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorded parameters of the model's last module (the detect head), in optimizer order."""
    indices = [module_index(p["name"]) for p in workload["params"]]
    known = [i for i in indices if i is not None]
    if not known:
        raise ValueError("the workload names no parameter 'model.<index>.…'; cannot find the detect head")
    records = [p for p, i in zip(workload["params"], indices, strict=True) if i == max(known)]
    return sorted(records, key=lambda p: p["order"])


def chain_specs(records: list[dict[str, Any]]) -> dict[tuple[int, str], list[dict[str, dict[str, Any]]]]:
    """The head's chains, keyed by (level, branch): each an ordered list of layers, a layer its records by kind."""
    layers: dict[tuple[int, str, tuple[int, ...], str], dict[str, dict[str, Any]]] = {}
    for record in records:
        match = _HEAD_PARAM.match(record["name"])
        if match is None:
            raise ValueError(
                f"detect-head parameter '{record['name']}' does not fit <branch>.<level>.<layer>"
            )
        order = tuple(int(i) for i in match["layer"].split(".") if i)
        key = (int(match["level"]), match["branch"], order, record["name"][: match.start("kind")])
        layers.setdefault(key, {})[match["kind"]] = record
    chains: dict[tuple[int, str], list[dict[str, dict[str, Any]]]] = {}
    for (level, branch, _, prefix), layer in sorted(layers.items()):
        if "conv.weight" not in layer and "weight" not in layer:
            raise ValueError(f"detect-head layer '{prefix}' has no convolution weight")
        chains.setdefault((level, branch), []).append(layer)
    return chains


def _weight(layer: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return layer.get("conv.weight") or layer["weight"]


class ChainLayer(nn.Module):
    """A convolution (same padding, stride 1) with, for normalized layers, batch norm and SiLU."""

    def __init__(self, layer: dict[str, dict[str, Any]], in_channels: int) -> None:
        super().__init__()
        normalized, weight = "conv.weight" in layer, _weight(layer)
        out_channels, per_group, kh, kw = weight["shape"]
        if in_channels % per_group or out_channels % (in_channels // per_group):
            prefix = weight["name"].removesuffix("conv.weight" if normalized else "weight")
            raise ValueError(
                f"'{prefix}': weight {weight['shape']} does not take {in_channels} input channels"
            )
        groups, bias = in_channels // per_group, not normalized and "bias" in layer
        self.conv = nn.Conv2d(
            in_channels, out_channels, (kh, kw), padding=(kh // 2, kw // 2), groups=groups, bias=bias
        )
        self.bn = nn.BatchNorm2d(out_channels) if normalized else None
        self.out_channels = out_channels
        self.paths: dict[str, str] = {}  # recorded name → attribute path within the layer (shapes checked)
        for kind, record in layer.items():
            path = _PATHS[normalized].get(kind)
            param = self.get_parameter(path) if path else None
            if param is None or list(param.shape) != list(record["shape"]):
                built = None if param is None else list(param.shape)
                raise ValueError(f"'{record['name']}': built {built}, recorded {record['shape']}")
            self.paths[record["name"]] = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x if self.bn is None else nn.functional.silu(self.bn(x))


class DetectHead(nn.Module):
    """Every chain of the recorded head; ``forward(features)`` returns every chain's output."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        super().__init__()
        chains = chain_specs(records)
        levels = sorted({level for level, _ in chains})
        if levels != list(range(len(levels))):
            raise ValueError(f"detect-head levels {levels} are not 0, 1, …")
        self.level_channels = [
            max(_weight(layers[0])["shape"][1] for (lvl, _), layers in chains.items() if lvl == level)
            for level in levels
        ]
        self.keys = list(chains)
        self.chains = nn.ModuleList()
        self.paths: dict[str, str] = {}  # recorded name → path in this module (stable across .to())
        for index, (level, branch) in enumerate(self.keys):
            channels, layers = self.level_channels[level], nn.Sequential()
            for position, spec in enumerate(chains[(level, branch)]):
                layer = ChainLayer(spec, channels)
                self.paths |= {
                    name: f"chains.{index}.{position}.{path}" for name, path in layer.paths.items()
                }
                layers.append(layer)
                channels = layer.out_channels
            self.chains.append(layers)
        missing = {r["name"] for r in records} - set(self.paths)
        if missing:
            raise ValueError(f"detect-head parameters not built: {sorted(missing)[:5]}")

    def recorded(self, name: str) -> nn.Parameter:
        """The parameter a recorded name (``model.23.cv2.0.0.conv.weight``) stands for."""
        return self.get_parameter(self.paths[name])

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        return [chain(features[level]) for (level, _), chain in zip(self.keys, self.chains, strict=True)]


@dataclass
class DetectHeadWorkload(HeadWorkload):
    """One seeded detect-head workload on a device: module, features, recorded groups, AMP setting."""

    scale: str
    head: DetectHead
    features: list[torch.Tensor]
    groups: list[dict[str, Any]]
    kwargs: dict[str, Any]
    autocast: bool

    @classmethod
    def build(
        cls, scale: str, imgsz: int, batch: int, device: str | torch.device, seed: int
    ) -> DetectHeadWorkload:
        device = torch.device(device)
        workload = load_workload(scale)
        records = detect_head_records(workload)
        torch.manual_seed(seed)  # the layers' default initialization draws from the global generator
        on_cuda = device.type == "cuda"
        memory_format = torch.channels_last if on_cuda else torch.contiguous_format
        head = DetectHead(records).to(device=device, memory_format=memory_format)
        for record in records:
            head.recorded(record["name"]).requires_grad_(bool(record["requires_grad"]))
        generator = torch.Generator(device=device).manual_seed(seed)
        dtype = torch.bfloat16 if on_cuda else torch.float32
        sizes = [imgsz // (FIRST_STRIDE * 2**level) for level in range(len(head.level_channels))]
        features = [  # P3, P4, P5, …: strides 8, 16, 32, … at imgsz
            torch.randn((batch, channels, size, size), generator=generator, device=device, dtype=dtype)
            .contiguous(memory_format=memory_format)
            .requires_grad_()
            for channels, size in zip(head.level_channels, sizes, strict=True)
        ]
        groups = []
        for spec in workload["groups"]:
            members = [head.recorded(r["name"]) for r in records if r["group"] == spec["index"]]
            if members:
                groups.append({"params": members, **{key: spec[key] for key in GROUP_KEYS}})
        return cls(scale, head, features, groups, dict(workload["optimizer_kwargs"]), on_cuda)

    def loss(self) -> torch.Tensor:
        with torch.autocast(self.features[0].device.type, dtype=torch.bfloat16, enabled=self.autocast):
            outputs = self.head(self.features)
        return sum(out.float().square().mean() for out in outputs) / 2

    def inputs(self) -> list[torch.Tensor]:
        return self.features


# --- one trial --------------------------------------------------------------------------------------------------


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


def _measure(
    params: dict[str, Any], spec: str, device: str, seed: int, reserve_bytes: int | None
) -> dict[str, Any]:
    reserve = torch.empty(reserve_bytes, dtype=torch.uint8, device=device) if reserve_bytes else None
    workload = build_workload(params, device, seed)
    optimizer = make_optimizer(spec, workload.groups, dict(workload.kwargs))

    def drop_grads() -> None:  # what a trainer's zero_grad does between steps (gradients freed, not zeroed)
        optimizer.zero_grad(set_to_none=True)
        workload.clear_input_grads()

    workload.forward_backward()  # priming step: untimed
    optimizer.step()
    drop_grads()
    workload.forward_backward()  # attribution step: untimed, the optimizer step's own extra peak
    before_step = current_allocated(device)
    reset_peaks(device)
    optimizer.step()
    step_peak, _ = read_peaks(device)
    drop_grads()

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
    del reserve
    return {
        "value": timer.seconds * 1000.0,
        "fwd_bwd_ms": 1e3 * totals["forward_backward"],
        "step_ms": 1e3 * totals["step"],
        "loss": float(loss),
        "peak_allocated": peak_allocated,
        "peak_reserved": peak_reserved,
        "allocated_at_start": at_start,
        "head_extra_peak": _difference(peak_allocated, at_start),
        "step_extra_peak": _difference(step_peak, before_step),
        "reserve_bytes": reserve_bytes or 0,
    }


def trial_function(plan: Plan) -> TrialFunction:
    """The probe's trial function: one head step of the case's head with the trial's arm, its device current."""
    reserve_bytes = plan.settings.get("reserve_bytes")

    def trial(ctx: TrialContext) -> dict[str, Any]:
        try:
            with (
                torch.cuda.device(torch.device(ctx.device))
                if is_cuda(ctx.device)
                else contextlib.nullcontext()
            ):
                return _measure(ctx.case.params, ctx.arm.spec, ctx.device, ctx.seed, reserve_bytes)
        except BaseException as exc:
            traceback.clear_frames(exc.__traceback__)
            raise

    return trial
