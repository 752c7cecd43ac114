"""Fixtures that several of the optimizers' test files share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from optimizers.batched import batched_on_cpu


@pytest.fixture
def batched_cpu_one_thread(one_thread: None) -> Iterator[None]:
    """The batched path forced on the CPU, on one intra-op thread (`one_thread`)."""
    with batched_on_cpu():
        yield
