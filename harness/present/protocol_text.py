"""A run's protocol section: the design as it ran, the verdict rule and the stopping rule's looks."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

import pandas as pd

from harness.formatting import NOT_RECORDED, code, format_bytes, format_limit, is_missing, when
from harness.plan import DUET_FILLER_FORMAT, WHOLE_PAIRS_FORMAT, Plan
from harness.present.model import METHODS_DOC, STATISTICS_DOC, Section
from harness.present.run_view import LoadedRun, extra_warmups, plural, warmup_sequence_text
from harness.protocol import IDLE_GAP_SECONDS
from harness.schedule import estimand
from harness.sequential import look_level
from harness.sequential import looks as pair_looks
from harness.stats import ClaimSettings

AFTER_RESUME = (
    f"After a resume, or an idle gap of more than {IDLE_GAP_SECONDS:g} s since the last trial ended, "
)
RESUMES = {  # what ran after a resume: --warmup auto, a fixed count, and a run older than whole-pair stops
    "auto": AFTER_RESUME
    + "warm-ups by the same rule run before the next measured trial, cycling from its arm "
    "(`phase=warmup` rows outside the schedule). A resume inside a warm-up sequence continues it. A "
    "`--stop-after` deadline stops only between pairs or between warm-ups.",
    "fixed": AFTER_RESUME + "one untimed warm-up of the next arm runs before the next measured trial (a "
    "`phase=warmup` row outside the schedule). A `--stop-after` deadline stops only between pairs.",
    "old": "This run predates whole-pair stops and warm-ups after a resume: a `--stop-after` slice or a resume "
    "could fall between the two trials of a pair, with no warm-up after it.",
}


def _described(label: str, params: dict[str, Any], head: str = "") -> str:
    """``label (head, k=v, …)``: a case's or an arm's parameters as JSON values."""
    inside = ", ".join([head] * bool(head) + [f"{k}={json.dumps(v)}" for k, v in params.items()])
    return code(label) + (f" ({inside})" if inside else "")


def log_span(trials: pd.DataFrame) -> str | None:
    if trials.empty or "started" not in trials:
        return None
    starts = [
        (_dt.datetime.fromisoformat(str(s)), float(d))
        for s, d in zip(trials["started"], trials["trial_seconds"], strict=True)
        if not is_missing(s) and not is_missing(d)
    ]
    if not starts:
        return None
    first = min(s for s, _ in starts)
    last = max(s + _dt.timedelta(seconds=d) for s, d in starts)
    seconds = (last - first).total_seconds()
    span = f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    return (
        f"The first trial started {when(first.isoformat())} and the last ended {when(last.isoformat())} "
        f"({span})."
    )


def round_orders(plan: Plan) -> str:
    """The round orders of the first case's measured schedule, as run: ``AB, BA, AB, …``."""
    if not plan.cases:
        return ""
    orders: dict[int, str] = {}
    for t in plan.schedule:
        if t.case == plan.cases[0].label and t.phase == "measured":
            orders.setdefault(t.round, t.order)
    shown = list(orders.values())
    return ", ".join(shown[:6]) + (", …" if len(shown) > 6 else "")


ORDERS = {  # --order in words; {orders}: the first rounds' orders as run
    "alternate": "counterbalanced order ({orders})",
    "abba": "ABBA blocks ({orders})",
    "random": "an order shuffled within each round by a generator seeded with {seed} ({orders})",
    "duet": "duet rounds ({orders}): a round's arms run at once, each on its own share of the worker cores; the "
    "arm that {filler}",
}
FILLERS = (  # what the arm that ends a duet round first does, before and since DUET_FILLER_FORMAT
    "ended first left its partner to finish alone, which favours the slower arm",
    "ends first runs discarded fillers until its partner ends",
)


def _design(plan: Plan) -> str:
    p = plan.protocol
    arms: dict[str, Any] = {}
    for arm in (arm for case in plan.cases for arm in case.arms):
        arms.setdefault(arm.label, arm)
    per_round = max(len(c.arms) for c in plan.cases) if plan.cases else 2
    count = (
        plural(p.pairs, "pair")
        if per_round == 2
        else f"{p.pairs} rounds (each of the {per_round} arms once per round)"
    )
    if p.auto:
        looks = list(pair_looks(p.first_look, p.max_pairs))
        count = f"rounds chosen by the stopping rule (`--pairs auto`: looks at {looks} pairs)"
    first = plural(p.warmup, "warm-up trial")
    if p.auto_warmup:
        first = (
            f"warm-up trials until one is at most {p.warmup_tolerance:g}% faster than its arm's previous (log "
            f"ratio; `--warmup auto`, at most {p.max_warmup}, then the run goes on unsettled)"
        )
    budget = (
        "none"
        if p.budget is None
        else f"{format_bytes(p.budget)} (device memory capped through the per-process memory fraction)"
    )
    filler = FILLERS[plan.format >= DUET_FILLER_FORMAT]
    order = ORDERS.get(p.order, ORDERS["random"]).format(
        orders=round_orders(plan), seed=p.seed, filler=filler
    )
    resume = "auto" if p.auto_warmup else "fixed" if plan.format >= WHOLE_PAIRS_FORMAT else "old"
    arm_words = (_described(a.label, a.params, f"{a.role}, spec {code(a.spec)}") for a in arms.values())
    design = [
        f"Arms: {'; '.join(arm_words)}.",
        f"Cases: {', '.join(_described(c.label, c.params) for c in plan.cases)}.",
        f"Per case, first {first} (cycling through the arms; kept in the log as `phase=warmup`, discarded from "
        f"every statistic), then {count}, in {order}.",
        RESUMES[resume],
        f"Estimand: {estimand(p.order)}.",
        f"Isolation: {plan.isolation or NOT_RECORDED}.",
        f"Timed region: {plan.timed_region or 'not stated by the tier'}.",
        f"Device: {code(p.device)}; memory budget: {budget}; seed {p.seed} (shared by the arms of a pair for "
        "their data" + (", and the order)." if p.order == "random" else ")."),
    ]
    if plan.settings:
        options = ", ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in plan.settings.items())
        design.append(f"Tier options: {code(options)}.")
    return " ".join(design)


def protocol_section(run: LoadedRun) -> Section:
    plan, trials = run.plan, run.summaries.trials
    statistics = [
        f"Primary figure: {plan.metric} in {plan.unit}, lower is better; a failed trial counts as infinitely slow. "
        f"Estimate, interval and checks per claim: see `{STATISTICS_DOC}`.",
        verdict_rule(plan),
    ] + ([stopping_text(plan)] if plan.protocol.auto else [])
    log = []
    resumes = run.env.get("resumes") or []
    if resumes:  # a log that repeats a trial is refused when it is read (harness.validation.check_log)
        log.append(
            f"The run was resumed {plural(len(resumes), 'time')}; "
            "the log holds each scheduled trial at most once (none re-run)."
        )
    sequences = warmup_sequence_text(plan, trials)
    if sequences:
        log.append(f"Warm-up sequences (`--warmup auto`), warm-ups each: {sequences}.")
    extra = extra_warmups(trials)
    if len(extra) and not plan.protocol.auto_warmup:
        reasons = ", ".join(
            f"{k} ({n})" for k, n in extra["warmup_reason"].astype(str).value_counts().items()
        )
        log.append(f"{plural(len(extra), 'extra warm-up')} ran outside the schedule: {reasons}.")
    span = log_span(trials)
    if span:
        log.append(span)
    return Section("Protocol").add(_design(plan), " ".join(statistics), " ".join(log))


def verdict_rule(plan: Plan) -> str:
    """The limits the verdicts read the interval against; the rule itself is stated in ``METHODS_DOC``."""
    settings = ClaimSettings.from_protocol(plan.protocol)
    limits = [(settings.bar_percent, False), (settings.tolerance_percent, True)]
    words = [format_limit(value, control) for value, control in limits if value is not None]
    if not words:
        return "No bar was set, so there is no verdict."
    against = " and ".join(words)
    return f"Verdicts against {against} read the interval as the verdict table of `{METHODS_DOC}` says."


def stopping_text(plan: Plan) -> str:
    """The stopping rule as it ran: the rule, its looks and each look's decision."""
    p = plan.protocol
    looks = pair_looks(p.first_look, p.max_pairs)
    levels, worst, best = look_level(0.95, looks)
    budget = f", or when {p.time_budget:g} s of trials are spent" if p.time_budget is not None else ""
    text = (
        f"Stopping rule (`--pairs auto --precision {p.precision:g}`): at pre-set looks {list(looks)} the median's "
        f"interval at that look's level ({', '.join(f'{v:.2%}' for v in levels)}) is compared with the target "
        f"half-width of {p.precision:g} points. The run stops when every claim's is within it (A/A controls do not "
        f"hold a claim's stop), at the last look ({p.max_pairs} pairs){budget}. Simulated over normal, skewed, "
        f"heavy-tailed, outlier and drift laws, the interval it stops with covers {worst:.1%} to {best:.1%}."
    )
    decisions = [
        f"{d['rounds']} pairs" + (f" ({d['case']})" if len(plan.cases) > 1 else "") + f": {d['reason']}"
        for d in plan.looks
    ]
    return text + (" Looks taken: " + "; ".join(decisions) + "." if decisions else "")
