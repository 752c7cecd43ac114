"""Suite-wide set-up that changes no test's meaning, only how idle threads wait and what the collector walks.

OpenMP threads that wait, wait asleep (``OMP_WAIT_POLICY=PASSIVE``, unless the caller set a policy). The CI
runs two pytest workers on two cores, and each fit's worker gets both cores (``--cpus auto``), so two
processes' thread teams share two cores. libgomp's default is to spin while it waits: a spinning thread holds
a core that the thread it waits for needs, and on this machine a README-default 64-step fit took 63 s with two
threads beside one other busy process, 3.5 s with passive waits (5.1 s on one thread). The variable is set
here, before anything in this process loads libgomp, and every worker and rank the tests start inherits it;
thread counts, placement and what each thread computes are unchanged.

The protocol collects garbage after every trial (``harness.protocol._release_device_memory``). In a pytest
process that has imported torch, pandas, matplotlib, scipy and every test module, a full collection walks a
few million long-lived objects: 0.2-0.5 s per trial, most of the time of many in-process runs. Before each
test, the objects that are still alive (modules, fixtures, caches) are collected once and then frozen
(``gc.freeze``: moved to a generation the collector no longer walks), so each collection a test makes walks
only what that test created. Every collection still runs and still frees every cycle a test leaves behind.
"""

from __future__ import annotations

import gc
import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(autouse=True)
def _freeze_what_is_already_alive() -> None:
    gc.collect()
    gc.freeze()
