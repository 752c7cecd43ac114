"""Diagnostic: where the candidate's step spends its host time inside a real fit (the H200's `--stages` fits
show the step host-bound there, about 3 ms of host per step against about 1 ms in a loop outside a fit).

Not product code and never imported by the harness: put this folder first on PYTHONPATH and set
FIT_STEP_PROFILE_OUT to a folder; every Python process then imports this file at start (Python's
`sitecustomize` hook), and one that steps a BatchedMuSGD writes FIT_STEP_PROFILE_OUT/<pid>.json every 64
steps: per part of the step, the median and 90th percentile of its host time (wall clock, no
synchronization), how many steps checked moved gradients or rebuilt the plan, and the process's threads,
CPU affinity and GIL switch interval; and, of steps 100 to 104 and everything the trainer did between them,
the profiler's table of host time per operation (<pid>-ops.txt: whether a launch or a foreach call costs
the host more inside a fit than in a loop). Usage on the device (after `. scripts/h200_env.sh`):

    PYTHONPATH=$PWD/scripts/device/fit_step_profile:$PYTHONPATH FIT_STEP_PROFILE_OUT=$OUT/prof \
        python3 -m harness.cli pair ... --arms upstream,candidate --stages --pairs 1 --out /tmp/profiled
"""

import os

_OUT = os.environ.get("FIT_STEP_PROFILE_OUT")

if _OUT:
    import json
    import statistics
    import sys
    import threading
    import time
    from collections import defaultdict

    _spent: dict[str, list[float]] = defaultdict(list)
    PROFILE_FIRST, PROFILE_STEPS = 100, 5  # the profiled window: steps 100-104 and what runs between them

    def _write() -> None:
        figures = {
            name: {
                "calls": len(values),
                "median_ms": round(1e3 * statistics.median(values), 4),
                "p90_ms": round(1e3 * sorted(values)[int(0.9 * (len(values) - 1))], 4),
            }
            for name, values in _spent.items()
            if values
        }
        figures["threads"] = [t.name for t in threading.enumerate()]
        figures["affinity"] = sorted(os.sched_getaffinity(0))
        figures["switch_interval_s"] = sys.getswitchinterval()
        with open(os.path.join(_OUT, f"{os.getpid()}.json"), "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=1)

    def _install() -> None:
        from optimizers.batched import BatchedMuSGD
        from optimizers.graphs import CoreGraph

        parts = {
            "step (host)": (BatchedMuSGD, "step"),
            "plan check": (BatchedMuSGD, "_current_plan"),
            "signature": (BatchedMuSGD, "_signature"),
            "moved-gradient check": (BatchedMuSGD, "_grads_overlap"),
            "plan build": (BatchedMuSGD, "_build_plan"),
            "scalars": (BatchedMuSGD, "_scalars"),
            "momentum": (BatchedMuSGD, "_momentum"),
            "core (graph)": (CoreGraph, "run"),
            "muon (momentum, core, apply)": (BatchedMuSGD, "_muon"),
            "sgd": (BatchedMuSGD, "_sgd"),
        }
        for name, (owner, attribute) in parts.items():
            original = owner.__dict__[attribute]

            def timed(*args, _original=original, _name=name, **kwargs):
                if _name == "step (host)":
                    _profile_window(len(_spent[_name]))
                started = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    _spent[_name].append(time.perf_counter() - started)
                    if _name == "step (host)" and len(_spent[_name]) % 64 == 0:
                        _write()

            setattr(owner, attribute, timed)

    _profiler: list = []

    def _profile_window(steps_done: int) -> None:
        import torch

        if steps_done == PROFILE_FIRST:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            _profiler.append(torch.profiler.profile(activities=activities))
            _profiler[0].__enter__()
        elif steps_done == PROFILE_FIRST + PROFILE_STEPS and _profiler:
            _profiler[0].__exit__(None, None, None)
            table = _profiler[0].key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
            with open(os.path.join(_OUT, f"{os.getpid()}-ops.txt"), "w", encoding="utf-8") as handle:
                handle.write(table)

    try:
        os.makedirs(_OUT, exist_ok=True)
        _install()
    except Exception as exc:  # a process without the repository on its path: nothing to profile
        print(f"fit_step_profile: not installed: {exc}", file=sys.stderr)
