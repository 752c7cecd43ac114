"""The probe tier's plan: its options, their checks, and one case per head variant or scale."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from experiments.arms import arm_code, checked_optimizer
from experiments.probe.trial import FIRST_STRIDE, LM_VARIANTS, OPTIMIZER_KWARGS
from experiments.workloads import parse_scales
from harness.errors import InputError
from harness.formatting import format_bytes
from harness.options import split_list
from harness.plan import Plan
from harness.protocol_options import ProtocolOptions
from harness.schedule import Case
from harness.schema import check_fields, finite, option, require
from harness.timing import parse_bytes
from harness.validation import settings_problem, shape_problem

HEADS = ("lm", "detect")
VARIANTS = {"lm": LM_VARIANTS, "detect": ("native",)}
DEFAULT_VARIANTS = {"lm": "native,chunked", "detect": "native"}
# Each head's own options: given with the other head they would be ignored, so they are refused.
HEAD_OPTIONS = {"lm": ("tokens", "vocab", "dim", "cap", "chunk"), "detect": ("scale", "imgsz", "batch")}
P5_STRIDE = FIRST_STRIDE * 4

METRIC = "head step time"
TIMED_REGION = (
    "one head step after an untimed priming step (which creates the optimizer state): forward and backward "
    "through the head, then the arm's optimizer.step(), in one synchronized bracket. Nothing inside it "
    "synchronizes: CUDA events split forward/backward from the step (fwd_bwd_ms, step_ms). The step's own extra "
    "peak comes from an untimed step before the timed one"
)
ISOLATION = (
    "in-process; every trial builds a fresh seeded workload and a fresh optimizer, holds --reserve bytes for "
    "its whole length, and frees everything (garbage collection, empty allocator cache) before the next"
)


def parse_reserve(text: str | None, device: str, budget: int | None) -> int | None:
    """``--reserve`` in bytes: it needs CUDA, and must leave the head something of the budget."""
    if text is None:
        return None
    if not device.startswith("cuda"):
        raise InputError(
            "--reserve needs a CUDA device (it holds device memory); use --device cuda or drop --reserve"
        )
    try:
        reserve = parse_bytes(text)
    except ValueError as exc:
        raise InputError(f"--reserve {exc}") from None
    if budget is not None and reserve >= budget:
        raise InputError(
            f"--reserve {format_bytes(reserve)} leaves nothing of --budget {format_bytes(budget)} for the head; "
            "use a reserve smaller than the budget"
        )
    return reserve


_learner_ms = require(
    finite(lambda ms: ms > 0),
    "--learner-ms {} is not a time; give the measured milliseconds of one whole learner step (> 0)",
)
_cap = require(
    finite(lambda cap: cap > 0), "--cap {} is not a softcap; use a positive number of logits units, e.g. 30"
)


@dataclass(frozen=True)
class ProbeSettings:
    """The probe's own options, each declared once (``harness.schema``): the CLI is made from them."""

    head: str = option(
        "lm", "Head workload: lm (softcapped LM head) or detect (YOLO26 detect head).", choices=HEADS
    )
    variants: str | None = option(
        None,
        "Comma-separated variants, one case each: lm takes native,chunked (default both); detect takes native.",
    )
    reserve: str | None = option(
        None,
        "Device memory held for the whole of every trial, standing for the rest of the learner (e.g. 14GiB); "
        "needs CUDA.",
    )
    learner_ms: float | None = option(
        None,
        "Measured milliseconds of one whole learner step: the report states the head's share and the most a "
        "zero-cost head could save.",
        check=_learner_ms,
    )
    tokens: int = option(131072, "lm: hidden states N (rows).", low=1)
    vocab: int = option(8192, "lm: vocabulary V (head weight rows).", low=1)
    dim: int = option(512, "lm: model width d.", low=1)
    cap: float = option(30.0, "lm: logit softcap, cap·tanh(z/cap).", check=_cap)
    chunk: int = option(16384, "lm chunked: rows per chunk (memory O(chunk·V)).", low=1)
    scale: str = option(
        "n",
        "detect: YOLO26 scale(s), comma-separated: n, s, m, l, x.",
        check=lambda text: parse_scales("--scale", text),
    )
    imgsz: int = option(640, "detect: image size in pixels (a multiple of 32).", low=1)
    batch: int = option(16, "detect: images per batch.", low=1)


def check_head_options(s: ProbeSettings) -> None:
    """``InputError`` for an option of the head not probed (one set away from its default)."""
    for head, names in HEAD_OPTIONS.items():
        for name in names if head != s.head else ():
            value = getattr(s, name)
            if value != getattr(ProbeSettings, name):
                shown = f"{value:g}" if isinstance(value, float) else value
                raise InputError(
                    f"--{name} {shown} applies to the {head} head only, and this probe is --head {s.head}: "
                    f"drop --{name}"
                )


def check_variants(head: str, chosen: list[str]) -> list[str]:
    """The head's variants, each once; ``InputError`` for a variant it has not (the head checked already)."""
    accepted = VARIANTS[head]
    for variant in chosen:
        if variant not in accepted:
            raise InputError(
                f"--variants '{variant}' is not a variant of the {head} head; use one or more of: {', '.join(accepted)}"
            )
    if len(set(chosen)) != len(chosen):
        raise InputError(f"--variants '{','.join(chosen)}' names a variant twice")
    return chosen


def head_cases(s: ProbeSettings, variants: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Each case's label and params: one per lm variant, or one per detect scale and variant."""
    if s.head == "lm":
        sizes = {"tokens": s.tokens, "vocab": s.vocab, "dim": s.dim, "cap": s.cap}
        chunked = {"chunk": s.chunk}
        return [
            (f"lm-{v}", {"head": "lm", "variant": v, **sizes, **(chunked if v == "chunked" else {})})
            for v in variants
        ]
    if s.imgsz % P5_STRIDE:
        raise InputError(
            f"--imgsz {s.imgsz} is not a multiple of the P5 stride {P5_STRIDE} (e.g. 640, 320, 64)"
        )
    if s.batch * (s.imgsz // P5_STRIDE) ** 2 < 2:
        raise InputError(
            f"--batch {s.batch} at --imgsz {s.imgsz} leaves one value per channel on the P5 map, and batch norm "
            "in training needs more; use --imgsz 64 or more, or --batch 2 or more"
        )
    sizes = {"imgsz": s.imgsz, "batch": s.batch}
    return [
        (
            f"yolo26{scale}-detect" + ("" if v == "native" else f"-{v}"),
            {"head": "detect", "variant": v, "scale": scale, **sizes},
        )
        for scale in split_list("--scale", s.scale)
        for v in variants
    ]


# What a probe's plan records: the head, its variants parsed, the reserve in bytes, the learner's step time.
RECORDED_SHAPE = {"head": str, "variants": list[str], "reserve_bytes": int | None, "learner_ms": float | None}


def recorded_settings_problem(plan: Plan) -> str | None:
    """What is wrong with a probe plan's recorded settings (an edited plan.json), or None."""
    problem = settings_problem(plan.settings, RECORDED_SHAPE)
    if problem:
        return problem
    s = plan.settings
    if s["reserve_bytes"] is not None and s["reserve_bytes"] <= 0:
        return f"settings.reserve_bytes is {s['reserve_bytes']}, not a positive number of bytes (or null)"
    try:
        check_fields(ProbeSettings(head=s["head"], learner_ms=s["learner_ms"]))
        check_variants(s["head"], s["variants"])
    except InputError as exc:
        return f"settings: {exc}"
    return _cases_problem(plan)


# What each case of a probe records of its head's sizes (``head_cases``); ``chunk`` only where the variant is
# ``chunked``.
CASE_SHAPE = {
    "lm": {"head": str, "variant": str, "tokens": int, "vocab": int, "dim": int, "cap": float},
    "detect": {"head": str, "variant": str, "scale": str, "imgsz": int, "batch": int},
}


def _cases_problem(plan: Plan) -> str | None:
    """What is wrong with a probe plan's cases (the sizes its report reads), or None.

    Each case is the one ``head_cases`` makes of its params, one per recorded variant."""
    head, variants = plan.settings["head"], plan.settings["variants"]
    for i, case in enumerate(plan.cases):
        where, params = f"cases[{i}].params", case.params
        problem = settings_problem(
            params, CASE_SHAPE[head], where, f"a case of the {head} head"
        ) or shape_problem(params, {"chunk": int}, where)
        if problem:
            return problem
        try:
            settings = ProbeSettings(head=head, **{k: params[k] for k in HEAD_OPTIONS[head] if k in params})
            check_fields(settings)
            label, made = head_cases(settings, [params["variant"]])[0]
        except InputError as exc:
            return f"{where}: {exc}"
        if (case.label, params) != (label, made):
            return f"cases[{i}] ('{case.label}') is not the case its params make (one labelled '{label}')"
    recorded = [case.params["variant"] for case in plan.cases]
    if (recorded if head == "lm" else sorted(set(recorded))) != (
        variants if head == "lm" else sorted(variants)
    ):
        return f"the cases' variants are {recorded}, but settings.variants is {variants}"
    return None


def make_plan(protocol: ProtocolOptions, settings: ProbeSettings, command: str = "") -> Plan:
    """The probe's plan from its checked settings; ``InputError`` where they do not fit the run."""
    s = settings
    if protocol.gpus > 1:
        raise InputError(f"--gpus {protocol.gpus}: the probe measures one device's memory; use --gpus 1")
    check_head_options(s)
    chosen = check_variants(s.head, split_list("--variants", s.variants or DEFAULT_VARIANTS[s.head]))
    for arm in protocol.arms:  # each workload passes the trainer's muon and sgd, as the check does
        checked_optimizer(arm.spec, tier_kwargs=OPTIMIZER_KWARGS)
    reserve_bytes = parse_reserve(s.reserve, protocol.device, protocol.budget)
    cases = [Case(label, params, protocol.arms) for label, params in head_cases(s, chosen)]
    return Plan(
        tier="probe",
        protocol=protocol,
        cases=cases,
        arm_code=arm_code(cases, protocol.device),
        unit="ms",
        metric=METRIC,
        settings=dict(head=s.head, variants=chosen, reserve_bytes=reserve_bytes, learner_ms=s.learner_ms),
        command=command,
        in_process=True,
        isolation=ISOLATION,
        timed_region=TIMED_REGION,
    )
