"""The YOLO26 detect head, rebuilt from the recorded parameter shapes, as a real forward and backward."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from experiments.workloads import GROUP_KEYS, load_workload

_HEAD_PARAM = re.compile(
    r"^model\.(?P<module>\d+)\.(?P<branch>[A-Za-z_]\w*)\.(?P<level>\d+)\.(?P<layer>(?:\d+\.)*)"
    r"(?P<kind>conv\.weight|bn\.weight|bn\.bias|weight|bias)$"
)
FIRST_STRIDE = 8  # P3; each further level halves the map (P4 stride 16, P5 stride 32)


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
    head = max(known)
    records = [p for p, i in zip(workload["params"], indices, strict=True) if i == head]
    return sorted(records, key=lambda p: p["order"])


@dataclass
class LayerSpec:
    """One layer of a chain: its name prefix and the records of its parameters by kind."""

    prefix: str
    order: tuple[int, ...]
    records: dict[str, dict[str, Any]]

    @property
    def normalized(self) -> bool:
        return "conv.weight" in self.records

    @property
    def weight(self) -> dict[str, Any]:
        return self.records["conv.weight" if self.normalized else "weight"]


def chain_specs(records: list[dict[str, Any]]) -> dict[tuple[int, str], list[LayerSpec]]:
    """The head's chains, keyed by (level, branch), each an ordered list of layers."""
    layers: dict[tuple[int, str, tuple[int, ...]], LayerSpec] = {}
    for record in records:
        match = _HEAD_PARAM.match(record["name"])
        if match is None:
            raise ValueError(
                f"detect-head parameter '{record['name']}' does not fit <branch>.<level>.<layer>"
            )
        order = tuple(int(i) for i in match["layer"].split(".") if i)
        key = (int(match["level"]), match["branch"], order)
        prefix = record["name"][: match.start("kind")]
        layer = layers.setdefault(key, LayerSpec(prefix, order, {}))
        layer.records[match["kind"]] = record
    chains: dict[tuple[int, str], list[LayerSpec]] = {}
    for (level, branch, _), layer in sorted(layers.items()):
        if "conv.weight" not in layer.records and "weight" not in layer.records:
            raise ValueError(f"detect-head layer '{layer.prefix}' has no convolution weight")
        chains.setdefault((level, branch), []).append(layer)
    return chains


class ChainLayer(nn.Module):
    """A convolution (same padding, stride 1) with, for normalized layers, batch norm and SiLU."""

    def __init__(self, spec: LayerSpec, in_channels: int) -> None:
        super().__init__()
        out_channels, per_group, kh, kw = spec.weight["shape"]
        if in_channels % per_group or out_channels % (in_channels // per_group):
            raise ValueError(
                f"'{spec.prefix}': weight {spec.weight['shape']} does not take {in_channels} input channels"
            )
        groups = in_channels // per_group
        self.conv = nn.Conv2d(
            in_channels,
            out_channels,
            (kh, kw),
            padding=(kh // 2, kw // 2),
            groups=groups,
            bias=not spec.normalized and "bias" in spec.records,
        )
        self.bn = nn.BatchNorm2d(out_channels) if spec.normalized else None
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x if self.bn is None else nn.functional.silu(self.bn(x))

    def recorded_paths(self, spec: LayerSpec) -> dict[str, str]:
        """This layer's parameters: recorded name → attribute path within the layer (shapes checked)."""
        paths = (
            {"conv.weight": "conv.weight", "bn.weight": "bn.weight", "bn.bias": "bn.bias"}
            if spec.normalized
            else {"weight": "conv.weight", "bias": "conv.bias"}
        )
        found = {}
        for kind, record in spec.records.items():
            param = self.get_parameter(paths[kind]) if kind in paths else None
            if param is None or list(param.shape) != list(record["shape"]):
                built = None if param is None else list(param.shape)
                raise ValueError(f"'{record['name']}': built {built}, recorded {record['shape']}")
            found[record["name"]] = paths[kind]
        return found


class DetectHead(nn.Module):
    """Every chain of the recorded head; ``forward(features)`` returns every chain's output."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        super().__init__()
        chains = chain_specs(records)
        levels = sorted({level for level, _ in chains})
        if levels != list(range(len(levels))):
            raise ValueError(f"detect-head levels {levels} are not 0, 1, …")
        self.level_channels: list[int] = []
        for level in levels:
            firsts = [layers[0].weight["shape"][1] for (lvl, _), layers in chains.items() if lvl == level]
            self.level_channels.append(max(firsts))
        self.keys = list(chains)
        self.chains = nn.ModuleList()
        self.paths: dict[str, str] = {}  # recorded name → path in this module (stable across .to())
        for index, (level, branch) in enumerate(self.keys):
            channels, layers = self.level_channels[level], nn.Sequential()
            for position, spec in enumerate(chains[(level, branch)]):
                layer = ChainLayer(spec, channels)
                for name, path in layer.recorded_paths(spec).items():
                    self.paths[name] = f"chains.{index}.{position}.{path}"
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


def feature_shapes(level_channels: list[int], batch: int, imgsz: int) -> list[tuple[int, int, int, int]]:
    """(batch, channels, h, w) of P3, P4, P5, …: strides 8, 16, 32, … at ``imgsz``."""
    return [
        (batch, channels, imgsz // (FIRST_STRIDE * 2**level), imgsz // (FIRST_STRIDE * 2**level))
        for level, channels in enumerate(level_channels)
    ]


@dataclass
class DetectHeadWorkload:
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
        features = [
            torch.randn(shape, generator=generator, device=device, dtype=dtype)
            .contiguous(memory_format=memory_format)
            .requires_grad_()
            for shape in feature_shapes(head.level_channels, batch, imgsz)
        ]
        groups = []
        for spec in workload["groups"]:
            members = [head.recorded(r["name"]) for r in records if r["group"] == spec["index"]]
            if members:
                groups.append({"params": members, **{key: spec[key] for key in GROUP_KEYS}})
        return cls(scale, head, features, groups, dict(workload["optimizer_kwargs"]), on_cuda)

    def param_groups(self) -> list[dict[str, Any]]:
        return self.groups

    def optimizer_kwargs(self) -> dict[str, Any]:
        return dict(self.kwargs)

    def forward_backward(self) -> torch.Tensor:
        device_type = self.features[0].device.type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.autocast):
            outputs = self.head(self.features)
        loss = sum(out.float().square().mean() for out in outputs) / 2
        loss.backward()
        return loss.detach()

    def clear_input_grads(self) -> None:
        for feature in self.features:
            feature.grad = None
