"""Fixtures that several of the optimizers' test files share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from optimizers.batched import batched_on_cpu


@pytest.fixture
def batched_cpu_one_thread() -> Iterator[None]:
    """The batched path forced on the CPU, on one intra-op thread.

    Small matrices only lose from more threads: oversubscribed on a busy two-core runner, tests ran ten times
    slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with batched_on_cpu():
            yield
    finally:
        torch.set_num_threads(threads)
