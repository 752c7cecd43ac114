"""The report's environment section: the machine, the code and the GPUs at the start and at each resume."""

from __future__ import annotations

from itertools import groupby
from typing import Any

from harness.formatting import NOT_RECORDED, code, format_bytes, is_missing, plain, when
from harness.present.model import Section, Table

SPEED_SETTINGS = (  # (words, env key, an on/off flag): the settings that change a GPU's speed
    ("TF32 matmul", "tf32_matmul", True),
    ("TF32 cuDNN", "tf32_cudnn", True),
    ("float32 matmul precision", "float32_matmul_precision", False),
    ("cudnn.benchmark", "cudnn_benchmark", True),
    ("deterministic algorithms", "deterministic_algorithms", True),
)


def _cudnn(value: Any) -> str:
    if is_missing(value):
        return NOT_RECORDED
    v = int(value)
    major, rest = (v // 10000, v % 10000) if v >= 10000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100} ({v})"


def _on_off(value: Any) -> str:
    return NOT_RECORDED if is_missing(value) else ("on" if value else "off")


def _gpus(env: dict[str, Any]) -> str:
    names = env.get("gpu_names")
    if names is None:
        return NOT_RECORDED
    if not names:
        return "none (CUDA not available)" if env.get("cuda_available") is False else "none"
    memory = env.get("gpu_memory_bytes") or []
    labels = [
        name + (f" ({format_bytes(memory[i])})" if i < len(memory) else "") for i, name in enumerate(names)
    ]
    return ", ".join(f"{len(list(same))} × {label}" for label, same in groupby(labels))


def _machine(boot: Any, gpus: Any) -> str:
    """A machine as this project can tell machines apart: its boot id and each card's UUID."""
    cards = [f"GPU {g.get('index')} {code(g['uuid'])}" for g in gpus or [] if g.get("uuid")]
    return ", ".join([f"boot {code(boot)}" if boot else f"boot {NOT_RECORDED}", *cards])


def _same_machine(start: dict[str, Any], later: dict[str, Any]) -> bool | None:
    """Whether a resume ran where the run started (boot and cards), None where either is not recorded."""
    if not start.get("boot_id") or not later.get("boot_id"):
        return None
    cards = [[g.get("uuid") for g in gpus or []] for gpus in (start.get("gpus_start"), later.get("gpus"))]
    return start["boot_id"] == later["boot_id"] and cards[0] == cards[1]


def _other_revision(env: dict[str, Any], resume: dict[str, Any]) -> bool | None:
    """Whether a resume ran another revision than the start (or a dirty tree), None where not recorded."""
    if is_missing(resume.get("git_revision")) or is_missing(env.get("git_revision")):
        return None
    return resume["git_revision"] != env["git_revision"] or bool(resume.get("git_dirty"))


def _resumes(env: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return list(enumerate(env.get("resumes") or [], start=1))


def resumed_elsewhere(env: dict[str, Any]) -> list[tuple[int, str]]:
    """(resume number, its machine) for every resume recorded on another machine than the run's start."""
    return [
        (k, _machine(r.get("boot_id"), r.get("gpus")))
        for k, r in _resumes(env)
        if _same_machine(env, r) is False
    ]


def resumed_at_other_code(env: dict[str, Any]) -> list[tuple[int, str]]:
    """(resume number, its revision) for every resume recorded at other code than the run's start."""
    return [(k, r["git_revision"]) for k, r in _resumes(env) if _other_revision(env, r)]


def _clocks(snapshot: Any) -> str:
    if snapshot is None:
        return NOT_RECORDED
    if not snapshot:
        return f"{NOT_RECORDED} (nvidia-smi did not answer)"

    def figure(value: Any, unit: str, name: str = "") -> str:
        return f"{name} {NOT_RECORDED}".strip() if is_missing(value) else f"{float(value):g} {unit}"

    return "<br>".join(
        f"GPU {g.get('index')}: SM {figure(g.get('sm_clock_mhz'), 'MHz')}, memory "
        f"{figure(g.get('mem_clock_mhz'), 'MHz')}, {figure(g.get('temperature_c'), '°C', 'temperature')}, "
        f"{figure(g.get('power_w'), 'W', 'power')}"
        for g in snapshot
    )


def _git(env: dict[str, Any]) -> str:
    revision = env.get("git_revision")
    if is_missing(revision):
        return NOT_RECORDED
    state = {True: "dirty (uncommitted changes)", False: "clean"}.get(
        env.get("git_dirty"), f"dirty flag {NOT_RECORDED}"
    )
    return f"`{revision}`, {state}"


def _environment_rows(env: dict[str, Any]) -> list[tuple[str, str]]:
    cpu, count = env.get("cpu_model"), env.get("cpu_count")
    cores = "" if is_missing(count) else f" ({count} logical cores)"
    speed = [f"{words} {(_on_off if flag else plain)(env.get(key))}" for words, key, flag in SPEED_SETTINGS]
    rows = [
        ("GPU", _gpus(env)),
        ("driver", plain(env.get("driver_version"))),
        ("CUDA runtime (torch build)", plain(env.get("cuda_runtime"))),
        ("cuDNN", _cudnn(env.get("cudnn"))),
        ("torch", plain(env.get("torch"))),
        ("Python", plain(env.get("python"))),
        ("OS", plain(env.get("os"))),
        ("CPU", NOT_RECORDED if is_missing(cpu) else f"{cpu}{cores}"),
        ("git revision", _git(env)),
        ("musgd-bench", plain(env.get("musgd_bench"))),
        ("ultralytics", plain(env.get("ultralytics"))),
        ("speed settings", ", ".join(speed)),
        ("recorded", when(env.get("recorded"))),
        ("GPU clocks, temperature, power at start", _clocks(env.get("gpus_start"))),
        ("… at end", _clocks(env.get("gpus_end"))),
    ]
    resumes = _resumes(env)
    rows += [(f"… at resume {k} ({when(r.get('recorded'))})", _clocks(r.get("gpus"))) for k, r in resumes]
    if env.get("boot_id"):  # older runs recorded no boot: no machine rows
        rows.append(("machine (boot, GPUs) at start", _machine(env["boot_id"], env.get("gpus_start"))))
        for k, r in resumes:
            other = f"another machine: {_machine(r.get('boot_id'), r.get('gpus'))}"
            rows.append(
                (
                    f"… at resume {k}",
                    {True: "the same machine", False: other, None: NOT_RECORDED}[_same_machine(env, r)],
                )
            )
    for k, r in resumes:  # older runs recorded no code at a resume
        other = _other_revision(env, r)
        if other is not None:
            rows.append(
                (f"… code at resume {k}", f"{_git(r)} (another revision)" if other else "the same revision")
            )
    return rows


def environment_section(runs: list[Any]) -> Section:
    """The environment table, one column per loaded run (its ``env`` and ``number``)."""
    values = [dict(_environment_rows(r.env)) for r in runs]
    fields = dict.fromkeys(field for table in values for field in table)
    header = ["field"] + ([f"run {r.number}" for r in runs] if len(runs) > 1 else ["value"])
    missing = any(not r.env for r in runs)
    return Section("Environment", depth=2).add(
        "A run folder without env.json: its fields read 'not recorded'." if missing else None,
        Table(header, [[field] + [v.get(field, "—") for v in values] for field in fields]),
    )
