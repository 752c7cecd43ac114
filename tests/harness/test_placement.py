"""CPU placement: parsing and refusals of --cpus, the automatic choice, and a placed worker.

The worker's threads and children run where it was put: multiprocessing and DataLoader workers, fork and
spawn.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from harness import placement
from harness.options import check_cpus
from harness.placement import Placement, choose_placement, format_cores, parse_core_list
from tests import ROOT, child_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CPU affinity is Linux only")


class PidDataset(torch.utils.data.Dataset):
    """Each item is the pid of the loader worker that made it (importable, so spawn workers can load it)."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> int:
        return os.getpid()


@pytest.mark.parametrize(
    "text, cores",
    [
        ("2-7", (2, 3, 4, 5, 6, 7)),
        ("2,3,5-6", (2, 3, 5, 6)),
        (" 1 , 3 ", (1, 3)),
        ("4,4,3-4", (3, 4)),
        ("0", (0,)),
    ],
)
def test_core_lists_and_ranges_are_parsed(text: str, cores: tuple[int, ...]) -> None:
    assert parse_core_list(text) == cores


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x",
        "1,,2",
        "-1",
        "1-",
        "1.5",
        "0x1",
        "auto,1",
        "1-2-3",
        "one",
        "\u0660",
        "\uff11-\uff12",
        "1-\u0663",
    ],
)
def test_anything_else_is_refused_in_one_line_naming_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        choose_placement(text, allowed=range(8))
    message = str(caught.value)
    assert "\n" not in message and "auto" in message and "2-7" in message and "2,3,5-6" in message


def test_a_keyword_is_recorded_as_the_word_every_reader_takes() -> None:
    """``--cpus AUTO`` ran as auto but was recorded as typed; the plan holds the canonical word."""
    assert check_cpus(" AUTO ") == "auto"
    assert check_cpus("None") == "none"


def test_a_backward_range_is_refused_with_its_fix() -> None:
    with pytest.raises(ValueError, match=r"7-2 runs backwards; write 2-7"):
        choose_placement("7-2", allowed=range(8))


def test_cores_outside_the_process_mask_are_refused() -> None:
    with pytest.raises(ValueError, match=r"core\(s\) 2-3 are not among those this process may use \(0-1\)"):
        choose_placement("0-3", allowed=(0, 1))
    beyond = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(ValueError, match=rf"core\(s\) {beyond} are not among"):
        choose_placement(str(beyond))


def test_format_cores_spells_the_kernel_list() -> None:
    assert format_cores([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert format_cores([3]) == "3" and format_cores([]) == ""


def test_auto_keeps_the_lowest_core_for_the_parent_where_there_are_enough() -> None:
    chosen = choose_placement("auto", allowed=range(2, 18))
    assert chosen.parent_cores == (2,) and chosen.worker_cores == tuple(range(3, 18))
    assert (chosen.torch_threads, chosen.interop_threads, chosen.omp_threads, chosen.mkl_threads) == (15,) * 4
    assert chosen.requested == "auto" and "lowest allowed core (2) for the parent" in chosen.reason


def test_auto_on_one_and_two_cores_says_what_it_did() -> None:
    one = choose_placement("auto", allowed=[5])
    assert one.worker_cores == one.parent_cores == (5,) and "nothing to keep apart" in one.reason
    two = choose_placement("auto", allowed=[0, 1])
    assert two.worker_cores == (0, 1) and two.parent_cores == (0,)
    assert "only 2 allowed cores" in two.reason and "shares" in two.reason


def test_auto_on_this_machine() -> None:
    mask = tuple(sorted(os.sched_getaffinity(0)))
    chosen = choose_placement("auto")
    assert chosen.parent_cores == mask[:1]
    if len(mask) >= placement.MIN_CORES_TO_KEEP_APART:
        assert chosen.worker_cores == mask[1:]
    else:  # this 2-core machine: the worker keeps both, the parent shares the lowest
        assert chosen.worker_cores == mask and chosen.reason.startswith("auto:")
    assert chosen.torch_threads == len(chosen.worker_cores)
    print(chosen.describe())


def test_a_list_gives_the_parent_the_other_allowed_cores() -> None:
    chosen = choose_placement("8-15", allowed=range(16))
    assert chosen.worker_cores == tuple(range(8, 16)) and chosen.parent_cores == tuple(range(8))
    everything = choose_placement("0-3", allowed=range(4))
    assert everything.parent_cores == (0,) and "shares core 0" in everything.reason


def test_placement_is_json_ready_and_travels_in_the_environment() -> None:
    chosen = choose_placement("auto", allowed=range(16))
    record = json.loads(json.dumps(chosen.to_dict()))
    assert Placement.from_dict(record) == chosen
    environment = placement.worker_environment(chosen)
    assert environment["OMP_NUM_THREADS"] == environment["MKL_NUM_THREADS"] == "15"
    assert Placement.from_dict(json.loads(environment[placement.PLACEMENT_ENV])) == chosen
    assert placement.apply_from_environment({}) is None  # no placement there: nothing done
    assert "worker on cores 1-15" in chosen.describe() and "parent on core 0" in chosen.describe()


def read_allowed_cores(pid: int = 0) -> frozenset[int] | None:
    """The affinity of a process's main thread, or of one thread by its id; None once it has ended."""
    try:
        return frozenset(os.sched_getaffinity(pid))
    except ProcessLookupError:
        return None


def _thread_cores(pid: int) -> dict[int, frozenset[int] | None]:
    tasks = Path(f"/proc/{pid}/task")
    return {int(t.name): read_allowed_cores(int(t.name)) for t in tasks.iterdir()}


CHILD = r"""
import json, multiprocessing, os, sys, threading, time
import torch
from harness.placement import apply_from_environment
from tests.harness.test_placement import PidDataset

early = threading.Event()
threading.Thread(target=early.wait, daemon=True).start()  # a thread that exists before the placement
torch.ones(512, 512) @ torch.ones(512, 512)  # and torch's own pool, started before it too
applied = apply_from_environment()
sleepers = {m: multiprocessing.get_context(m).Process(target=time.sleep, args=(120,), daemon=True)
            for m in ("fork", "spawn")}
for process in sleepers.values():
    process.start()
iterators, loaders = [], {}
for method in ("fork", "spawn"):
    loader = torch.utils.data.DataLoader(PidDataset(), batch_size=None, num_workers=1,
                                         multiprocessing_context=method, persistent_workers=True)
    iterators.append(iter(loader))
    loaders[method] = int(next(iterators[-1]))
print(json.dumps({"applied": applied, "sleepers": {m: p.pid for m, p in sleepers.items()}, "loaders": loaders}),
      flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def placed_worker():
    """A worker process placed on the highest allowed core alone, with children it started afterwards."""
    mask = sorted(os.sched_getaffinity(0))
    if len(mask) < 2:
        pytest.skip("needs two allowed cores to tell a placed mask from the inherited one")
    chosen = choose_placement(str(mask[-1]))
    env = child_env(**placement.worker_environment(chosen))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        line = child.stdout.readline()
        assert line, f"the placed worker printed nothing (exit {child.poll()})"
        yield chosen, frozenset(mask), child.pid, json.loads(line)
    finally:
        child.stdin.close()
        child.wait(timeout=60)


def test_every_thread_of_the_worker_is_placed_even_those_started_before(placed_worker) -> None:
    chosen, mask, pid, info = placed_worker
    wanted = frozenset(chosen.worker_cores)
    assert wanted != mask
    threads = _thread_cores(pid)
    assert len(threads) >= 2  # the early thread at least, besides the main one
    assert read_allowed_cores(pid) == wanted
    assert all(cores == wanted for cores in threads.values()), threads
    assert info["applied"] == {
        "placed_cores": format_cores(wanted),
        "placed_torch_threads": 1,
        "placed_interop_threads": 1,
        "placed_interop_set": True,
    }


@pytest.mark.parametrize("kind", ["sleepers", "loaders"])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_children_of_the_worker_inherit_its_placement(placed_worker, kind: str, method: str) -> None:
    chosen, mask, pid, info = placed_worker
    grandchild = info[kind][method]
    assert grandchild != pid
    assert read_allowed_cores(grandchild) == frozenset(chosen.worker_cores) != mask
    assert all(cores == frozenset(chosen.worker_cores) for cores in _thread_cores(grandchild).values())


def test_the_parent_is_pinned_and_unpinned_with_all_its_threads() -> None:
    mask = frozenset(os.sched_getaffinity(0))
    if len(mask) < 2:
        pytest.skip("needs two allowed cores")
    chosen = choose_placement(str(max(mask)))  # parent: every other allowed core
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        with placement.parent_pinned(chosen):
            pinned = _thread_cores(os.getpid())
            assert other.native_id in pinned
            assert all(cores == frozenset(chosen.parent_cores) for cores in pinned.values()), pinned
        assert all(cores == mask for cores in _thread_cores(os.getpid()).values())
        with placement.parent_pinned(chosen):
            assert read_allowed_cores() == frozenset(chosen.parent_cores)
        assert read_allowed_cores() == mask
    finally:
        stop.set()
        other.join()
