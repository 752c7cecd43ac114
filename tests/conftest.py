"""Suite-wide set-up that changes no test's meaning, only what the garbage collector walks.

The protocol collects garbage after every trial (``harness.protocol._release_device_memory``). In a pytest
process that has imported torch, pandas, matplotlib, scipy and every test module, a full collection walks a
few million long-lived objects: 0.2-0.5 s per trial, most of the time of many in-process runs. Before each
test, the objects that are still alive (modules, fixtures, caches) are collected once and then frozen
(``gc.freeze``: moved to a generation the collector no longer walks), so each collection a test makes walks
only what that test created. Every collection still runs and still frees every cycle a test leaves behind.
"""

from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True)
def _freeze_what_is_already_alive() -> None:
    gc.collect()
    gc.freeze()
