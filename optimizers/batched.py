"""BatchedMuSGD: MuSGD with Newton-Schulz batched across parameters and foreach momentum, on CUDA.

It computes what the per-parameter MuSGD computes, with few operations per step whatever the parameter count:

- Zero extension changes the batch, not the quintic. A wide matrix with zero columns appended keeps its
  Frobenius norm and X X^T, so every Newton-Schulz iterate keeps those columns zero. Matrices sharing their
  smaller dimension (at most `pad_guard`) are laid out wide in one zero-padded bf16 stack, run as one batch,
  and each is cropped and transposed back before its own gain, learning rate and weight decay. Each stack is
  bounded by the parameter and gradient bytes of its own members. Matrices of one shape, and matrices above
  the guard, run as exact-shape batches; a lone matrix runs exactly as in the baseline.
- The plan owns everything a step needs: the stacks (allocated once), each member's view into its stack, the
  gains as scalar lists, the parameter, gradient-owner and buffer lists per group, and a scratch view like
  each clean parameter. A step fills the stacks from scratch (a padded slot is not dense, so the copies go by
  runs of same-shape neighbours, which sit side by side in the stacks and in scratch: one kernel per run, not
  per matrix), advances every stack's Newton-Schulz chain in lockstep (mm/bmm per stack, one foreach
  operation per elementwise step for all stacks), widens the scaled bf16 updates into scratch by the same
  runs (so the apply, fp32 += bf16 otherwise, takes the foreach fast path),
  and applies gains, updates and SGD momentum with foreach operations over lists. The count of operations
  grows with the number of stacks and groups, not of matrices, and a step allocates nothing.
- The clean parameters' SGD momentum buffers live in one tensor per device and dtype laid out like scratch
  (each at its scratch view's offset, with its strides; the state holds the views, one per parameter), and
  scratch puts the groups without Muon first, then the Muon groups'. An SGD run whose parameters tile one
  stretch of scratch (each of YOLO26's) takes the momentum multiply, the add and (on CUDA) the Nesterov
  update as one elementwise operation each on two stretches; a foreach list's host cost grows with its
  tensors.
- Momentum keeps its rounded operations: the baseline's lerp, mul and add, in the same order and with the
  same Python-float scalars, so momentum buffers stay bit-equal to the baseline's. What the baseline
  computes out of place (the Nesterov inputs, the decayed gradient, the Nesterov SGD update) is computed by
  the same kernel in place on a copy of the gradient in scratch: the host's cost of a step on a fast GPU
  was mostly allocating those outputs, one tensor per parameter, and dispatching mixed-dtype lists one
  tensor at a time.
- Whatever reordering could change is kept in the baseline's order: parameters whose memory overlaps another
  parameter, and parameter subclasses that refuse storage inspection (and their whole group), keep
  exact-shape batches but take scalar momentum and are applied one by one in order; parameters whose
  gradient or buffers share memory with anything, odd restored state (a buffer of another dtype, device or
  shape), non-matrix Muon parameters, and CPU/MPS tensors take the baseline's per-parameter step.
- The plan is a pure function of the parameter set. It is built once and reused while the parameters (by
  identity and address: a new device, dtype or shape comes with new memory), the presence of their
  gradients, the groups' `use_muon` and the state object are unchanged (`load_state_dict` replaces the state
  object). Gradients that move (fresh allocations) only re-check memory overlaps.
- On one CUDA device the core (the stacks filled from the Nesterov inputs or copies of the momentum buffers
  in scratch, Newton-Schulz, gains, updates widened into scratch) is replayed from a CUDA graph
  (`optimizers.graphs`): it reads only tensors whose memory lasts as long as the plan, and no gradient,
  parameter or hyperparameter, so a replay is the eager core's kernels with the eager core's arguments, and
  learning-rate or momentum schedules and Nesterov flips need no re-capture.
- Under an initialized process group of several ranks (`optimizers.distributed`), each rank orthogonalizes
  its chunk of every batch and some of the lone matrices into its block of one buffer, one all-gather per
  step fills the other blocks, and every rank applies gains, updates and momentum as one rank does. One
  rank, or no process group, is exactly the one-rank step. `sharing` says how the work was split.

No public flag and no checkpoint field is added: the state is exactly the baseline's, so a state_dict moves
between MuSGD and BatchedMuSGD both ways. `pad_guard`, `pad_chain_flops` and `graph_replay` (class
attributes, or `with_pad_guard`) are internal knobs for screens: guard None pads every size, 0 pads nothing;
a chain price cuts padded runs where their wasted arithmetic costs more than another chain (the default
chosen from an H200 sweep; None pads as far as the memory budget allows); replay off runs every core eagerly;
`ns_lanes` runs that many stacks' chains at once on forked streams (`optimizers.concurrent`; 1: in lockstep).
The plan's stacks and scratch are memory the optimizer keeps between steps: about the bf16 size of the Muon
parameters (plus padding) and the size of the parameters; `plan_bytes` says how much (with the captured
graph's pool).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import math
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .concurrent import DEFAULT_LANES, newton_schulz_flops, newton_schulz_lanes
from .distributed import Partition, agreed, gather_shares, world_and_rank
from .graphs import CoreGraph
from .musgd import MuSGD, muon_momentum, musgd_param_step, sgd_momentum_step
from .newton_schulz import Stack, foreach_mul_, muon_scale

DEFAULT_PAD_GUARD = 256
# One more Newton-Schulz chain priced in padded arithmetic (FLOPs). Chosen on the H200 (scripts/h200_pad_price.py,
# reports/h200-decisive/logs/2026-12-01-2325/prices.log): of the prices swept, 3e9 is within 1.6% of the best
# price's step at every YOLO26 scale (1e9 within 2.8%, 1e10 2.7%) and 8–13% faster than the memory-budget rule
# at every scale (n..x).
DEFAULT_PAD_CHAIN_FLOPS = 3e9
MAX_LAYOUTS = 16  # scalar patterns whose merged lists a plan keeps (a schedule rarely makes more than two)
STACK_DTYPE = torch.bfloat16
_WIDENS_EXACTLY = (torch.float32, torch.float64, STACK_DTYPE)  # parameter dtypes a bf16 update widens into
_OPAQUE = -1  # fingerprint of a tensor that refuses data_ptr()
_GRAD = operator.attrgetter("grad")
_DATA_PTR = torch.Tensor.data_ptr
_IS_NONE = functools.partial(operator.is_, None)
_IS_NOT_NONE = functools.partial(operator.is_not, None)
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_NBYTES = operator.attrgetter("nbytes")
_PLAIN_NUMBERS = (float, int, bool)

# Test-only: route CPU tensors through the batched path, so CPU-only CI exercises batching and foreach logic.
_FORCE_BATCHED_ON_CPU = False


@contextlib.contextmanager
def _batched_on_cpu(enabled: bool = True) -> Iterator[None]:
    """Test-only: within the block, CPU parameters take the batched path (as CUDA ones do)."""
    global _FORCE_BATCHED_ON_CPU
    previous, _FORCE_BATCHED_ON_CPU = _FORCE_BATCHED_ON_CPU, enabled
    try:
        yield
    finally:
        _FORCE_BATCHED_ON_CPU = previous


def _batches_on(device: torch.device) -> bool:
    return device.type == "cuda" or (device.type == "cpu" and _FORCE_BATCHED_ON_CPU)


# ---------------------------------------------------------------------------------------------- memory


def _address(t: torch.Tensor | None) -> int | None:
    """A cheap per-step fingerprint: data_ptr, None for a missing tensor, _OPAQUE when it refuses inspection."""
    if t is None:
        return None
    try:
        return t.data_ptr()
    except Exception:
        return _OPAQUE


def _addresses(tensors: list[torch.Tensor]) -> tuple[int, ...]:
    """Every tensor's data_ptr in one C-level pass; where any refuses, `_address` of each (so _OPAQUE there)."""
    try:
        return tuple(map(_DATA_PTR, tensors))
    except Exception:
        return tuple(map(_address, tensors))


def _refuses_inspection(t: torch.Tensor) -> bool:
    """Tensor subclasses may refuse storage inspection (data_ptr, untyped_storage raise): opaque memory."""
    try:
        t.untyped_storage()
        t.data_ptr()
    except Exception:
        return True
    return False


def _memory_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [start, end) a tensor can reach (empty for an empty tensor); the caller checked inspectability."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    if t.is_contiguous():
        return start, start + t.numel() * t.element_size()
    reach = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))
    return start, start + (reach + 1) * t.element_size()


def _overlapping(spans: list[tuple[str, int, int, Any]]) -> set[Any]:
    """Owners of spans (device, start, end, owner) that share at least one byte with another span.

    Sorted by start, spans merge into runs while each starts before the run's furthest end; every member of a
    run of two or more overlaps an earlier member (or, for the first, the second), and nothing else does.
    This compares addresses, not storage objects: two DLPack views over one buffer are different storages.
    """
    flagged: set[Any] = set()
    run: list[Any] = []
    run_device, run_end = None, 0
    for device, start, end, owner in sorted((s for s in spans if s[2] > s[1]), key=lambda s: (s[0], s[1])):
        if run and device == run_device and start < run_end:
            run.append(owner)
            run_end = max(run_end, end)
            continue
        if len(run) > 1:
            flagged.update(run)
        run, run_device, run_end = [owner], device, end
    if len(run) > 1:
        flagged.update(run)
    return flagged


def _spans_of(
    tracked: list[tuple[dict[str, Any], torch.Tensor]], state: dict[torch.Tensor, dict[str, Any]], grads: bool
) -> tuple[list[tuple[str, int, int, Any]], set[int]]:
    """The memory spans of every tracked parameter, its state tensors and (with `grads`) its gradient, each
    tagged (parameter id, role); and the ids of parameters one of whose other tensors refuses inspection."""
    spans, refusing = [], set()
    for _, p in tracked:
        device = str(p.device)
        tensors = [("param", p), *([("grad", p.grad)] if grads else []), *state[p].items()]
        for role, tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            if _refuses_inspection(tensor):
                if role != "param":
                    refusing.add(id(p))
                continue
            spans.append((device, *_memory_span(tensor), (id(p), role)))
    return spans, refusing


def _span_index(spans: list[tuple[str, int, int, Any]]) -> dict[str, tuple[list[int], list[int]]]:
    """Per device, span starts in order and the running maximum of their ends (for binary searches)."""
    index: dict[str, tuple[list[int], list[int]]] = {}
    for device, start, end, _ in sorted(spans, key=lambda s: (s[0], s[1])):
        if end > start:
            starts, reach = index.setdefault(device, ([], []))
            starts.append(start)
            reach.append(max(end, reach[-1]) if reach else end)
    return index


def _reach_index(starts: list[int], reach: list[int]) -> tuple[list[int], list[int]]:
    """`_span_index`'s lists of one device as `_spans_reach` reads them: the sorted starts, and before each
    position the furthest end of the spans at earlier positions (-1 before the first)."""
    return starts, [-1, *reach]


def _spans_reach(starts: list[int], ends: list[int], index: tuple[list[int], list[int]]) -> bool:
    """Whether any span [start, end) reaches into an indexed span (`_reach_index`), or two nonempty spans share
    a byte: a binary search per span and `_overlapping`'s sort, in C-level passes over Python integers.

    The per-step check when gradients moved. It dispatches no tensor operation: in a fit on the H200 the
    dozen CPU tensor operations it took before cost 1.37 ms of a 3.41 ms step's host time (likely because
    the fit's worker runs torch with 15 intra-op threads beside busy loader processes, and searchsorted goes
    parallel above 200 elements; not measured apart).
    """
    index_starts, reach_before = index
    # Per span, how many indexed spans start before it ends, and the furthest end among those.
    below = map(bisect.bisect_left, itertools.repeat(index_starts), ends)
    if any(map(operator.gt, map(reach_before.__getitem__, below), starts)):
        return True
    # The nonempty spans by start: one overlaps another where it starts before an earlier one's furthest end.
    spans = sorted(span for span in zip(starts, ends, strict=True) if span[1] > span[0])
    furthest = itertools.accumulate((end for _, end in spans), max)
    return any(map(operator.lt, (start for start, _ in spans[1:]), furthest))


def _disjoint_ends(starts: list[int], reach: list[int]) -> dict[int, int] | None:
    """`_span_index`'s lists of one device as `_spans_meet` reads them: each span's end by its start, spans
    that touch merged into one (a flat buffer's views become one span: fewer to sort per step, the same
    answer), where the indexed spans are pairwise disjoint (sorted, each ends by the next one's start); None
    where some overlap. Built once per plan."""
    if not all(map(operator.le, reach[:-1], starts[1:])):
        return None
    ends: dict[int, int] = {}  # disjoint: the running maximum of the ends is each span's own end
    last = None
    for start, end in zip(starts, reach, strict=True):
        if last is not None and ends[last] == start:
            ends[last] = end
        else:
            ends[start] = end
            last = start
    return ends


def _spans_meet(starts: list[int], ends: list[int], indexed_ends: dict[int, int]) -> bool:
    """Whether any nonempty span [start, end) shares a byte with an indexed span (`_disjoint_ends`) or with
    another span: the indexed spans and these, sorted by start, are pairwise disjoint exactly when each starts
    no earlier than the one before it ends (ends then rise, so no earlier span reaches further).

    `_spans_reach`'s answer in fewer C-level passes, for the per-step check when gradients moved: a sort of
    Python integers that arrive in two sorted runs, against a binary search per span and a sort of pairs.
    """
    ends_by_start = indexed_ends.copy()
    ends_by_start.update(zip(starts, ends, strict=True))
    if len(ends_by_start) != len(indexed_ends) + len(starts):
        return True  # two nonempty spans start at one byte
    ordered = sorted(ends_by_start)
    return any(map(operator.lt, itertools.islice(ordered, 1, None), map(ends_by_start.__getitem__, ordered)))


# ---------------------------------------------------------------------------------------------- the plan


@dataclass
class _Member:
    """One matrix of a Newton-Schulz batch and where it lives in the batch's stack."""

    param: torch.Tensor
    group: dict[str, Any]
    order: int  # position in the optimizer's parameter order
    ordered: bool  # scalar momentum, applied in order with its group's SGD (overlapping memory, opaque group)
    small: int  # the matrix's smaller dimension
    large: int  # and its larger one
    scale: float
    nbytes: int  # parameter + gradient bytes: the budget this member brings to a padded stack
    view_stride: tuple[int, ...] = ()  # the parameter-shaped view of its slot in a padded stack
    position: int = -1  # index in the plan's fill order (stack slots, momentum inputs, updates)


@dataclass
class _Batch:
    """Matrices orthogonalized by one Newton-Schulz chain; `kind` is "single", "uniform" or "padded"."""

    kind: str
    device: torch.device
    dtype: torch.dtype
    members: list[_Member]
    stack_shape: tuple[int, ...] = ()

    @property
    def flops(self) -> int:
        """Newton-Schulz arithmetic of one step as this batch runs it (a padded batch: every slot padded)."""
        if self.kind == "padded":
            return len(self.members) * newton_schulz_flops(*sorted(self.stack_shape[1:]))
        return sum(newton_schulz_flops(m.small, m.large) for m in self.members)


@dataclass
class _BatchStack:
    """A batch's stack memory, allocated once, and the views a step reads and writes.

    `slots` are every member's parameter-shaped views (all of them filled after a step's gather); `stack` is
    the part this process orthogonalizes (all of it on one rank, its chunk or None under a process group);
    `full` is the contiguous tensor of all members where one exists (one rank), `zeroed` what a step zeroes
    before filling (padded stacks), `scale_targets`/`scale_values` what the gains multiply in place, and
    `here[i]` whether member i is orthogonalized by this process (so filled by it).

    `outputs[i]` is where member i's update ends: its slot (bf16), or its parameter-like view of the plan's
    scratch, into which the scaled bf16 result is widened (exactly) so the Muon apply takes the foreach fast
    path; `widen` are those copies, (scratch, stack) views, one per run of same-shape neighbours (`_runs`).
    """

    batch: _Batch
    stack: Stack | None
    slots: list[torch.Tensor]
    scale_targets: list[torch.Tensor]
    scale_values: list[float]
    full: torch.Tensor | None
    zeroed: list[torch.Tensor]
    here: list[bool]
    outputs: list[torch.Tensor] = field(default_factory=list)
    widen: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])  # (scratch views, stack views)


def _extent(t: torch.Tensor) -> int:
    """Elements from a view's first to just past its last."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _steps_alike(columns: list[list[torch.Tensor]], i: int, steps: list[int] | None) -> list[int] | None:
    """The storage steps from entry i-1 to entry i in every column, where entry i can join entry i-1's run
    (same shape, strides, dtype and storage as it, and the run's steps, or for a run's second entry steps
    no shorter than one view, so a run's view never overlaps itself); None where it cannot."""
    found = []
    for j, column in enumerate(columns):
        previous, view = column[i - 1], column[i]
        step = view.storage_offset() - previous.storage_offset()
        if (
            view.shape != previous.shape
            or view.stride() != previous.stride()
            or view.dtype != previous.dtype
            or view.numel() == 0
            or view.untyped_storage().data_ptr() != previous.untyped_storage().data_ptr()
            or (step < _extent(view) if steps is None else step != steps[j])
        ):
            return None
        found.append(step)
    return found


def _runs(columns: list[list[torch.Tensor]], keys: list[Any] | None = None) -> tuple[list[list], list]:
    """Consecutive entries whose views step alike, merged into one view per column with a leading dimension.

    `columns[j][i]` is entry i's j-th view (a copy's destination and source, or a gain's target); entries
    with equal `keys` (a gain) whose views in every column share shape, strides, dtype and storage, and
    whose storage offsets step by one amount per column, form a run. An elementwise operation on a run's
    views touches each element as the per-entry operations did, with one kernel instead of one per entry
    (a padded slot is not dense, so a foreach list of slots launches one kernel per tensor). Returns the
    merged columns and each run's key.
    """
    merged: list[list[torch.Tensor]] = [[] for _ in columns]
    run_keys: list[Any] = []
    count = len(columns[0]) if columns else 0
    start = 0
    while start < count:
        stop, steps = start + 1, None
        while stop < count and (keys is None or keys[stop] == keys[start]):
            found = _steps_alike(columns, stop, steps)
            if found is None:
                break
            stop, steps = stop + 1, found
        for j, (column, out) in enumerate(zip(columns, merged, strict=True)):
            first = column[start]
            if steps is None:
                out.append(first)
            else:
                shape, strides = (stop - start, *first.shape), (steps[j], *first.stride())
                out.append(first.as_strided(shape, strides, first.storage_offset()))
        run_keys.append(None if keys is None else keys[start])
        start = stop
    return merged, run_keys


def _matrix_shape(batch: _Batch) -> tuple[int, int]:
    """(rows, cols) of one slot of the batch's stack (wide for a padded batch)."""
    if batch.kind == "padded":
        return batch.stack_shape[1], batch.stack_shape[2]
    rows = batch.members[0].param.shape[0]
    return rows, batch.members[0].param.numel() // rows


def _member_view(storage: torch.Tensor, member: _Member, batch: _Batch, base: int) -> torch.Tensor:
    """Member `member` of `batch` as a parameter-shaped view of its matrix at element `base` of `storage`."""
    shape = member.param.shape
    if batch.kind == "padded":
        return storage.as_strided(shape, member.view_stride, base)
    row_major = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    return storage.as_strided(shape, row_major, base)


def _scaled(entry_slots: list[torch.Tensor], batch: _Batch, whole: list[torch.Tensor]) -> tuple[list, list]:
    """What the gains multiply: padded members' crops (a run of same-shape neighbours at once), or the whole
    memory of an exact-shape batch."""
    if batch.kind == "padded":
        scaled = [(slot, m.scale) for slot, m in zip(entry_slots, batch.members, strict=True) if m.scale != 1]
        (targets,), values = _runs([[slot for slot, _ in scaled]], [scale for _, scale in scaled])
        return targets, values
    scale = batch.members[0].scale
    return (list(whole), [scale] * len(whole)) if scale != 1 else ([], [])


def _allocate_stack(batch: _Batch, dtype: torch.dtype = STACK_DTYPE) -> _BatchStack:
    """The stack of `batch` in `dtype` (zeros where padded) and its views; bf16 for the optimizer."""
    members = batch.members
    rows, cols = _matrix_shape(batch)
    shape = (rows, cols) if batch.kind == "single" else (len(members), rows, cols)
    tensor = (torch.zeros if batch.kind == "padded" else torch.empty)(shape, dtype=dtype, device=batch.device)
    flat = tensor.view(-1)
    slots = [_member_view(flat, m, batch, i * rows * cols) for i, m in enumerate(members)]
    targets, values = _scaled(slots, batch, [tensor])
    zeroed = [tensor] if batch.kind == "padded" else []
    here = [True] * len(members)
    return _BatchStack(batch, Stack.of(tensor), slots, targets, values, tensor, zeroed, here, list(slots))


def _allocate_shares(
    batches: list[_Batch], partition: Partition, dtype: torch.dtype = STACK_DTYPE
) -> tuple[list[_BatchStack], torch.Tensor]:
    """Every batch's stack as views of one flat buffer of `partition.world` blocks, one per rank.

    Each rank's block holds that rank's chunk of every batch (same offsets on every rank) and the lone
    matrices it owns; this process orthogonalizes its own block only, and a gather fills the others.
    """
    splittable = [b for b in batches if b.kind != "single"]
    lone = [b for b in batches if b.kind == "single"]
    per_rank = partition.per_rank
    buffer = torch.zeros(partition.world * per_rank, dtype=dtype, device=batches[0].device)
    entries: dict[int, _BatchStack] = {}
    for batch, chunk, offset in zip(splittable, partition.chunks, partition.offsets, strict=True):
        rows, cols = _matrix_shape(batch)
        size = rows * cols
        blocks = [
            buffer[r * per_rank + offset :][: chunk * size].view(chunk, rows, cols)
            for r in range(partition.world)
        ]
        slots = [
            _member_view(buffer, m, batch, (i // chunk) * per_rank + offset + (i % chunk) * size)
            for i, m in enumerate(batch.members)
        ]
        targets, values = _scaled(slots, batch, blocks)
        mine = blocks[partition.rank]
        zeroed = [mine] if batch.kind == "padded" else []
        here = [i // chunk == partition.rank for i in range(len(batch.members))]
        entries[id(batch)] = _BatchStack(
            batch, Stack.of(mine), slots, targets, values, None, zeroed, here, list(slots)
        )
    for batch, owner, offset in zip(lone, partition.owners, partition.whole_offsets, strict=True):
        rows, cols = _matrix_shape(batch)
        matrix = buffer[owner * per_rank + offset :][: rows * cols].view(rows, cols)
        slots = [matrix.view(batch.members[0].param.shape)]
        targets, values = _scaled(slots, batch, [matrix])
        mine = owner == partition.rank
        stack = Stack.of(matrix) if mine else None
        entries[id(batch)] = _BatchStack(batch, stack, slots, targets, values, None, [], [mine], list(slots))
    return [entries[id(batch)] for batch in batches], buffer


def _fill_stacks(plan: _Plan, fill: _Fill) -> None:
    """Zero the padded stacks (padding stays zero through Newton-Schulz, even after a NaN) and copy the clean
    members' inputs into their slots, a run of same-shape neighbours at once (rounded to bf16 as the
    baseline's Newton-Schulz rounds its input)."""
    if plan.zeroed:
        torch._foreach_zero_(plan.zeroed)
    if fill.slots:
        torch._foreach_copy_(fill.slots, fill.sources)


def _newton_schulz_here(stacks: list[_BatchStack], lanes: int = 1) -> list[torch.Tensor]:
    """Orthogonalize, in place, the stacks this process owns, per device in up to `lanes` concurrent lanes
    (`optimizers.concurrent`; one lane: in lockstep); no outputs."""
    devices: dict[torch.device, list[Stack]] = {}
    for entry in stacks:
        if entry.stack is not None:
            devices.setdefault(entry.batch.device, []).append(entry.stack)
    for device_stacks in devices.values():
        newton_schulz_lanes(device_stacks, lanes)
    return []


def _finish(stacks: list[_BatchStack]) -> list[list[torch.Tensor]]:
    """Gains in place (padded members' crops, or a whole exact-shape stack; bf16, as the baseline multiplies
    its bf16 result), then each member's update, per batch: widened into the plan's scratch where the stack
    says so (a run of same-shape neighbours per copy), else its slot."""
    targets = [t for entry in stacks for t in entry.scale_targets]
    foreach_mul_(targets, [v for entry in stacks for v in entry.scale_values])
    into = [t for entry in stacks for t in entry.widen[0]]
    out_of = [t for entry in stacks for t in entry.widen[1]]
    if into:
        torch._foreach_copy_(into, out_of)
    return [entry.outputs for entry in stacks]


def _orthogonalize_stacks(stacks: list[_BatchStack], lanes: int = 1) -> list[list[torch.Tensor]]:
    """The core of a step on one rank: filled stacks in, each member's orthogonalized, scaled update out."""
    _newton_schulz_here(stacks, lanes)
    return _finish(stacks)


def _orthogonalize(
    batch: _Batch, to_orthogonalize: list[torch.Tensor], compute_dtype: torch.dtype = STACK_DTYPE
) -> list[torch.Tensor]:
    """One batch's updates from its members' Newton-Schulz inputs, on a fresh stack of `compute_dtype`.

    The step runs the same core on the plan's own stacks; this form lets tests pass float64 to check that
    padding is exact.
    """
    entry = _allocate_stack(batch, compute_dtype)
    torch._foreach_copy_(entry.slots, to_orthogonalize)
    return _orthogonalize_stacks([entry])[0]


@dataclass
class _MuonGroup:
    """The clean Muon members of one group (across batches): momentum and apply as foreach lists.

    Members are in fill order `start:stop`; the first `fast` of them get their updates widened into scratch
    (their parameters' dtype and layout), so their apply can take the foreach fast path on CUDA. `here` lists
    (relative) indices of the members this process orthogonalizes: all of them on one rank. `scratch` are
    the members' views of the plan's scratch (a Nesterov input, then the widened update).
    """

    group: dict[str, Any]
    start: int
    stop: int
    fast: int
    params: list[torch.Tensor]
    buffers: list[torch.Tensor]
    here: list[int]
    scratch: list[torch.Tensor]


@dataclass
class _Bucket:
    """Clean parameters of one group with one device and dtype: their SGD momentum runs as foreach lists."""

    params: list[torch.Tensor]
    buffers: list[torch.Tensor]


@dataclass
class _GroupPlan:
    """How one group's SGD part runs: foreach buckets of clean parameters, then the rest in order."""

    group: dict[str, Any]
    buckets: list[_Bucket]
    in_order: list[torch.Tensor]  # parameters stepped one by one, in the baseline's order
    whole_step: set[int]  # ids of in_order parameters that take the baseline's whole per-parameter step


@dataclass
class _MomentumRun:
    """Consecutive Muon groups (in fill order) with equal momentum and Nesterov: one momentum pass for all.

    `group` indexes the group whose scalars the run reads (every member group's are equal); `here` lists the
    members orthogonalized here (None: all of them), `here_buffers` their buffers and `here_scratch` their
    scratch (where a Nesterov input is computed in place).
    """

    group: int
    nesterov: bool
    params: list[torch.Tensor]
    buffers: list[torch.Tensor]
    here: list[int] | None
    here_buffers: list[torch.Tensor]
    here_scratch: list[torch.Tensor]
    grads: Callable[[list[Any]], Any] = tuple  # the run's gradients out of the step's flat list
    here_grads: Callable[[list[Any]], Any] = tuple  # those of the members orthogonalized here


@dataclass
class _SgdRun:
    """Clean SGD buckets (across groups) with one device, dtype, momentum, Nesterov and decay; `scratch`
    holds the decayed gradient and then the Nesterov update, in place (no allocation per step)."""

    group: int
    nesterov: bool
    params: list[torch.Tensor]
    buffers: list[torch.Tensor]
    scratch: list[torch.Tensor]
    grads: Callable[[list[Any]], Any] = tuple  # the run's gradients out of the step's flat list
    # Where the run's buffers and scratch views tile one stretch of their flat tensors: those two stretches,
    # which one elementwise operation each steps like the foreach lists (None: the lists, always right).
    flat: tuple[torch.Tensor, torch.Tensor] | None = None
    # The Nesterov update (g + m·buf) flat too: on CUDA only. One kernel computes every element alike there;
    # on the CPU a vectorized loop and its scalar remainder round a + α·b differently for bf16 (measured on
    # torch 2.14.1), so where an element falls would decide its bits; the list keeps per-tensor rounding.
    flat_nesterov: bool = False


def _picker(positions: list[int]) -> Callable[[list[Any]], Any]:
    """A C-level getter of the items at `positions` of a list, as a sequence (one item too)."""
    if len(positions) == 1:
        position = positions[0]
        return lambda items: (items[position],)
    return operator.itemgetter(*positions)


def _one_stretch(plan: _Plan, params: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The stretch of the flat SGD buffers and of scratch that these parameters' views tile exactly, or None.

    A parameter's buffer and scratch views sit at the same offset with the same strides in two flat tensors
    (`_mirror_sgd_buffers`), so elementwise operations over the two stretches pair each element of a buffer
    with the same element of its scratch, as the per-tensor lists do.
    """
    views = [plan.scratch_of[id(p)] for p in params]
    flats = plan.sgd_flats.get((params[0].device, params[0].dtype)) if params else None
    if flats is None:
        return None
    spans = sorted((v.storage_offset(), v.storage_offset() + v.numel()) for v in views)
    if any(end != start for (_, end), (start, _) in itertools.pairwise(spans)):
        return None
    low, high = spans[0][0], spans[-1][1]
    buffers, scratch = flats
    return buffers[low:high], scratch[low:high]


@dataclass
class _ApplyRun:
    """Parameters updated by one foreach add with one alpha; `pieces` say where their updates are:
    (source list, start, stop) slices, concatenated in order."""

    group: int
    params: list[torch.Tensor]
    pieces: list[tuple[int, int, int]]

    def updates(self, sources: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        if len(self.pieces) == 1:
            source, start, stop = self.pieces[0]
            if start == 0 and stop == len(sources[source]):
                return sources[source]
        gathered: list[torch.Tensor] = []
        for source, start, stop in self.pieces:
            gathered += sources[source][start:stop]
        return gathered


@dataclass
class _Fill:
    """What the core copies into the stacks: the clean members' slots here and their Newton-Schulz inputs in
    scratch (the Nesterov input, or a copy of the momentum buffer), merged into runs of same-shape
    neighbours: memory that lasts as long as the plan, so a captured core reads it. One per plan; the core's
    graph key."""

    slots: list[torch.Tensor]
    sources: list[torch.Tensor]


@dataclass
class _Layout:
    """The plan's foreach lists merged across groups whose step scalars are equal (one scalar pattern).

    Clean parameters touch no memory of one another, so which foreach call updates which of them changes
    no bit: each parameter's own operations keep their order and their Python-float scalars.
    """

    momentum: list[_MomentumRun]
    muon_apply: list[_ApplyRun]  # pieces into the fill-order updates (source 0)
    sgd: list[_SgdRun]
    sgd_apply: list[_ApplyRun]  # pieces into the SGD runs' updates (source = run index)


@dataclass(frozen=True)
class _Scalars:
    """One step's scalars per group, as the baseline computes them, and their equality pattern."""

    momentum: list[Any]
    nesterov: list[bool]
    weight_decay: list[Any]
    sgd_alpha: list[Any]  # -(lr * sgd) in Muon groups, -lr elsewhere
    muon_alpha: list[Any]  # -(lr * muon)
    pattern: tuple[Any, ...]


def _scalar_key(value: Any) -> Any:
    """What makes two scalars interchangeable as kernel arguments (None: never merged): exact float bits,
    or an int or bool of one type and value. NaN and tensors stay alone."""
    kind = type(value)
    if kind is float:
        return value.hex() if value == value else None
    if kind is int or kind is bool:
        return (kind, value)
    return None


def _classes(values: list[Any]) -> tuple[int, ...]:
    """Each value's class: the index of the first interchangeable value, or its own for a lone one."""
    first: dict[Any, int] = {}
    classes = []
    for index, value in enumerate(values):
        key = _scalar_key(value)
        classes.append(index if key is None else first.setdefault(key, index))
    return tuple(classes)


def _build_layout(plan: _Plan, scalars: _Scalars) -> _Layout:
    """Merge the plan's per-group lists where this step's scalar pattern allows."""
    momentum, nesterov, weight_decay, sgd_alpha, muon_alpha = scalars.pattern
    index = {id(group_plan.group): i for i, group_plan in enumerate(plan.groups)}
    runs: list[_MomentumRun] = []
    previous_key: tuple[Any, ...] | None = None
    applies: dict[tuple[Any, ...], _ApplyRun] = {}
    for muon_group in plan.muon_groups:
        i = index[id(muon_group.group)]
        key = (momentum[i], nesterov[i])
        if key != previous_key:
            runs.append(_MomentumRun(i, nesterov[i], [], [], [], [], []))
            previous_key = key
        run = runs[-1]
        offset = len(run.params)
        run.params += muon_group.params
        run.buffers += muon_group.buffers
        assert run.here is not None
        run.here += [offset + j for j in muon_group.here]
        run.here_buffers += [muon_group.buffers[j] for j in muon_group.here]
        run.here_scratch += [muon_group.scratch[j] for j in muon_group.here]
        split = muon_group.start + muon_group.fast
        for part, start, stop in (("fast", muon_group.start, split), ("slow", split, muon_group.stop)):
            if stop > start:
                apply = applies.setdefault((muon_alpha[i], part), _ApplyRun(i, [], []))
                apply.params += muon_group.params[start - muon_group.start : stop - muon_group.start]
                apply.pieces.append((0, start, stop))
    for run in runs:
        positions = [plan.positions[id(p)] for p in run.params]
        run.grads = _picker(positions)
        run.here_grads = _picker([positions[j] for j in run.here or ()]) if run.here else lambda _: ()
        if len(run.here or ()) == len(run.params):
            run.here, run.here_grads = None, run.grads
    sgd_runs: dict[tuple[Any, ...], _SgdRun] = {}
    sgd_applies: dict[tuple[Any, ...], _ApplyRun] = {}
    for i, group_plan in enumerate(plan.groups):
        for bucket in group_plan.buckets:
            device, dtype = bucket.params[0].device, bucket.params[0].dtype
            key = (device, dtype, momentum[i], nesterov[i], weight_decay[i])
            if key not in sgd_runs:
                sgd_runs[key] = _SgdRun(i, nesterov[i], [], [], [])
            run_index = list(sgd_runs).index(key)
            sgd_run = sgd_runs[key]
            start = len(sgd_run.params)
            sgd_run.params += bucket.params
            sgd_run.buffers += bucket.buffers
            sgd_run.scratch += [plan.scratch_of[id(p)] for p in bucket.params]
            apply = sgd_applies.setdefault((device, dtype, sgd_alpha[i]), _ApplyRun(i, [], []))
            apply.params += bucket.params
            apply.pieces.append((run_index, start, len(sgd_run.params)))
    for sgd_run in sgd_runs.values():
        sgd_run.grads = _picker([plan.positions[id(p)] for p in sgd_run.params])
        sgd_run.flat = _one_stretch(plan, sgd_run.params)
        sgd_run.flat_nesterov = sgd_run.flat is not None and sgd_run.params[0].device.type == "cuda"
    return _Layout(runs, list(applies.values()), list(sgd_runs.values()), list(sgd_applies.values()))


@dataclass
class _Plan:
    """Everything a step needs to know about the parameter set, and what it was built from."""

    signature: tuple[Any, ...]
    grad_addresses: tuple[Any, ...]
    grads_overlap: bool
    span_index: dict[str, tuple[list[int], list[int]]]  # per device: sorted starts, running max of ends
    batches: list[_Batch]
    groups: list[_GroupPlan]
    stacks: list[_BatchStack] = field(default_factory=list)
    fill: list[_Member] = field(default_factory=list)  # every member, in fill order
    core_fill: _Fill = field(default_factory=lambda: _Fill([], []))  # the clean members' inputs copied here
    ordered_slots: list[torch.Tensor] = field(default_factory=list)  # the ordered members' filled here
    # Scratch: one parameter-like view per clean parameter (per device and dtype, one tensor holds them all),
    # where a step computes in place what the baseline computes out of place: no allocation per step.
    scratch: list[torch.Tensor] = field(default_factory=list)
    scratch_of: dict[int, torch.Tensor] = field(default_factory=dict)  # parameter id -> its view
    # Per device and dtype: the flat tensor the clean parameters' SGD buffers live in (state, laid out like
    # scratch) and scratch's own flat tensor.
    sgd_flats: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )
    zeroed: list[torch.Tensor] = field(default_factory=list)  # padded stacks (or shares), zeroed per step
    muon_groups: list[_MuonGroup] = field(default_factory=list)
    ordered: list[_Member] = field(default_factory=list)  # fill[len(fill) - len(ordered):]
    ordered_here: list[bool] = field(default_factory=list)  # which of them are orthogonalized here
    partition: Partition | None = None  # how a process group shares the work; None on one rank
    buffer: torch.Tensor | None = None  # the flat buffer every rank's share lives in, under a partition
    sharing_note: str = ""  # why a process group's ranks do not share the work, where they could
    # Every parameter on a batching device with its device's name: whose gradients a move re-checks.
    grad_checks: list[tuple[torch.Tensor, str]] = field(default_factory=list)
    # Where they all live on one device: their parameters and that device's span index, for the check in a
    # few C-level passes (`_spans_reach`); None where they span devices.
    grad_check_params: list[torch.Tensor] = field(default_factory=list)
    grad_check_index: tuple[list[int], list[int]] | None = None
    # And where those are every parameter, in the optimizer's order, and their parameter and state spans are
    # pairwise disjoint (the usual case): each span's end by its start, for `_spans_meet` over the addresses
    # the step's signature read; None otherwise.
    grad_check_ends: dict[int, int] | None = None
    layouts: dict[tuple[Any, ...], _Layout] = field(default_factory=dict)  # merged runs, per scalar pattern
    devices: set[torch.device] = field(default_factory=set)  # where the stacks live
    device: torch.device | None = None  # the first stack's device (the core's, where it replays)
    positions: dict[int, int] = field(default_factory=dict)  # parameter id -> index in the optimizer's order
    last_scalars: tuple[list[Any], _Scalars] | None = (
        None  # the scalars' objects last read, and what they gave
    )

    @property
    def nbytes(self) -> int:
        """Bytes the plan's stacks and scratch hold between steps."""
        scratch = sum(t.numel() * t.element_size() for t in self.scratch)
        if self.buffer is not None:
            return scratch + self.buffer.numel() * self.buffer.element_size()
        return scratch + sum(
            e.full.numel() * e.full.element_size() for e in self.stacks if e.full is not None
        )

    def updates_in_fill_order(self, per_batch: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        updates: list[torch.Tensor] = [None] * len(self.fill)  # type: ignore[list-item]
        for entry, batch_updates in zip(self.stacks, per_batch, strict=True):
            for member, update in zip(entry.batch.members, batch_updates, strict=True):
                updates[member.position] = update
        return updates


def _state_is_usual(p: torch.Tensor, state: dict[str, Any], keys: tuple[str, ...]) -> bool:
    """Buffers as the baseline would create them: plain tensors of the parameter's shape, dtype and device."""
    for key in keys:
        buffer = state.get(key)
        if (
            type(buffer) is not torch.Tensor
            or buffer.shape != p.shape
            or buffer.dtype != p.dtype
            or buffer.device != p.device
        ):
            return False
    return True


def _split_by_budget(members: list[_Member], element_size: int) -> list[list[_Member]]:
    """Cut members sorted by decreasing width into runs whose padded stack fits their own param+grad bytes."""
    runs: list[list[_Member]] = []
    for member in members:
        run = runs[-1] if runs else None
        if run is not None:
            stack_bytes = (len(run) + 1) * member.small * run[0].large * element_size
            if stack_bytes <= sum(m.nbytes for m in run) + member.nbytes:
                run.append(member)
                continue
        runs.append([member])
    return runs


def _split_by_cost(members: list[_Member], element_size: int, chain_flops: float) -> list[list[_Member]]:
    """Cut members sorted by decreasing width into the runs that cost least, within the memory budget.

    A run costs `chain_flops` (what one more Newton-Schulz chain's fixed GPU time is worth in arithmetic)
    plus the arithmetic of its members padded to its widest; a run is allowed only if its padded stack fits
    its own members' parameter and gradient bytes, as in `_split_by_budget`. A prefix table finds the
    cheapest runs of consecutive members. Without the budget some cheapest partition is of that kind
    (re-dealing the widest members to the widest runs never widens a run); where the budget binds, one out
    of order can be cheaper, and this is the best in order.
    """
    if not (math.isfinite(chain_flops) and chain_flops >= 0):
        raise ValueError(f"pad_chain_flops must be a finite number ≥ 0 (or None), got {chain_flops!r}")
    count = len(members)
    best: list[float] = [0.0] + [math.inf] * count
    cut = [0] * (count + 1)
    for end in range(1, count + 1):
        budget = 0
        for start in range(end - 1, -1, -1):
            budget += members[start].nbytes
            small, large = members[start].small, members[start].large
            if (end - start) * small * large * element_size > budget:
                continue
            cost = best[start] + chain_flops + (end - start) * newton_schulz_flops(small, large)
            if cost < best[end]:
                best[end], cut[end] = cost, start
    runs: list[list[_Member]] = []
    end = count
    while end > 0:
        runs.append(members[cut[end] : end])
        end = cut[end]
    return runs[::-1]


def _make_batch(members: list[_Member]) -> _Batch:
    """Lay out one batch: its kind, the stack shape and each member's slot."""
    first = members[0].param
    device, dtype = first.device, first.dtype
    members = sorted(members, key=lambda m: (m.ordered, m.order))
    if len(members) == 1:
        return _Batch("single", device, dtype, members)
    if all(m.param.shape == first.shape and m.param.stride() == first.stride() for m in members):
        rows, cols = first.shape[0], math.prod(first.shape[1:])
        return _Batch("uniform", device, dtype, members, stack_shape=(len(members), rows, cols))
    # Members of one shape side by side (then in the optimizer's order): one copy fills or widens each such
    # run of slots. Where a member sits in a padded stack changes none of its bits.
    members.sort(key=lambda m: (tuple(m.param.shape), m.param.stride(), m.order))
    small = members[0].small
    large = max(m.large for m in members)
    batch = _Batch("padded", device, dtype, members, stack_shape=(len(members), small, large))
    for member in members:
        # A slot holds the matrix wide: (small, large) row-major, zero columns on the right. A wide
        # parameter reads its rows along the stack's rows, a tall one along the stack's columns.
        row_stride, col_stride = (large, 1) if member.param.shape[0] == member.small else (1, large)
        column_dims = member.param.shape[1:]  # (cols,) or (in, kh, kw): row-major within a matrix row
        member.view_stride = (
            row_stride,
            *(col_stride * math.prod(column_dims[i + 1 :]) for i in range(len(column_dims))),
        )
    return batch


def _lay_out(plan: _Plan, state: dict[torch.Tensor, dict[str, Any]], world: int, rank: int) -> None:
    """Allocate the plan's stacks (shared out over a process group's ranks where it has several) and its
    scratch, and fix the fill order: each group's clean members (those whose update widens into scratch
    first), then ordered ones."""
    plan.stacks = _share_out(plan, world, rank) if world > 1 and plan.batches else []
    if not plan.stacks:
        plan.stacks = [_allocate_stack(batch) for batch in plan.batches]
    slot_of = {
        id(member): slot
        for entry in plan.stacks
        for member, slot in zip(entry.batch.members, entry.slots, strict=True)
    }
    here = {
        id(member)
        for entry in plan.stacks
        for member, mine in zip(entry.batch.members, entry.here, strict=True)
        if mine
    }
    members = [m for batch in plan.batches for m in batch.members]
    widened = {id(m) for m in members if not m.ordered and m.param.dtype in _WIDENS_EXACTLY}
    _allocate_scratch(plan, widened)
    by_group: dict[int, list[_Member]] = {}
    for member in members:
        if not member.ordered:
            by_group.setdefault(id(member.group), []).append(member)
    for clean in by_group.values():
        clean.sort(key=lambda m: (id(m) not in widened, m.order))
        start = len(plan.fill)
        plan.fill += clean
        params = [m.param for m in clean]
        buffers = [state[p]["momentum_buffer"] for p in params]
        fast = sum(id(m) in widened for m in clean)
        mine = [i for i, m in enumerate(clean) if id(m) in here]
        scratch = [plan.scratch_of[id(p)] for p in params]
        plan.muon_groups.append(
            _MuonGroup(clean[0].group, start, len(plan.fill), fast, params, buffers, mine, scratch)
        )
    plan.ordered = sorted((m for m in members if m.ordered), key=lambda m: m.order)
    plan.ordered_here = [id(m) in here for m in plan.ordered]
    plan.fill += plan.ordered
    for position, member in enumerate(plan.fill):
        member.position = position
    copies = [
        (slot, plan.scratch_of[id(member.param)])
        for entry in plan.stacks
        for member, slot, mine in zip(entry.batch.members, entry.slots, entry.here, strict=True)
        if mine and not member.ordered
    ]
    (slots, sources), _ = _runs([[slot for slot, _ in copies], [source for _, source in copies]])
    plan.core_fill = _Fill(slots, sources)
    plan.ordered_slots = [slot_of[id(m)] for m in plan.ordered if id(m) in here]
    plan.devices = {entry.batch.device for entry in plan.stacks}
    plan.device = plan.stacks[0].batch.device if plan.stacks else None
    plan.zeroed = [t for entry in plan.stacks for t in entry.zeroed]


def _dense_strides(p: torch.Tensor) -> tuple[int, ...]:
    """The strides of a dense tensor laid out like `p` (p's own where p is dense)."""
    return torch.empty_like(p, device="meta").stride()


def _allocate_scratch(plan: _Plan, widened: set[int]) -> None:
    """A parameter-like view of scratch for every clean parameter (one tensor per device and dtype), and
    where each member's update ends: members in `widened` get their bf16 result widened into their view,
    others keep their slot. The stacks' members sit in scratch in stack and slot order, so neighbours of one
    shape are neighbours in both, and one copy fills or widens each such run (`_runs`). Scratch is always
    written before it is read, so it is left uninitialized."""
    clean = [p for group_plan in plan.groups for bucket in group_plan.buckets for p in bucket.params]
    clean_ids = {id(p) for p in clean}
    # Each group's SGD run should tile one stretch (`_one_stretch`): the groups without Muon first, then the
    # Muon parameters in the stacks' order, then any other Muon parameters.
    in_stacks = [m.param for entry in plan.stacks for m in entry.batch.members if id(m.param) in clean_ids]
    placed = {id(p) for p in in_stacks}
    muon = {
        id(p)
        for group_plan in plan.groups
        if group_plan.group["use_muon"]
        for b in group_plan.buckets
        for p in b.params
    }
    order = [p for p in clean if id(p) not in muon]
    order += in_stacks + [p for p in clean if id(p) in muon and id(p) not in placed]
    sizes: dict[tuple[torch.device, torch.dtype], int] = {}
    offsets = []
    for p in order:
        key = (p.device, p.dtype)
        offsets.append(sizes.get(key, 0))
        sizes[key] = offsets[-1] + p.numel()
    flats = {key: torch.empty(size, dtype=key[1], device=key[0]) for key, size in sizes.items()}
    plan.scratch = list(flats.values())
    for p, offset in zip(order, offsets, strict=True):
        plan.scratch_of[id(p)] = flats[(p.device, p.dtype)].as_strided(p.shape, _dense_strides(p), offset)
    for entry in plan.stacks:
        members = entry.batch.members
        entry.outputs = [
            plan.scratch_of[id(m.param)] if id(m) in widened else slot
            for m, slot in zip(members, entry.slots, strict=True)
        ]
        pairs = [(out, slot) for out, slot in zip(entry.outputs, entry.slots, strict=True) if out is not slot]
        (into, out_of), _ = _runs([[out for out, _ in pairs], [slot for _, slot in pairs]])
        entry.widen = (into, out_of)


def _mirror_sgd_buffers(plan: _Plan, state: dict[torch.Tensor, dict[str, Any]]) -> None:
    """Move the clean parameters' SGD momentum buffers into one tensor per device and dtype laid out like
    scratch: each buffer at its scratch view's offset, with its strides. An SGD run whose parameters tile one
    stretch of scratch then steps its buffers with one operation instead of a foreach list (whose host cost
    grows with the tensors in it). The values are copied; the state holds the new views, so a state_dict
    still gives one tensor per parameter, and the baseline reads it as its own."""
    scratch_flats = {(t.device, t.dtype): t for t in plan.scratch}
    buffer_flats = {key: torch.empty_like(flat) for key, flat in scratch_flats.items()}
    for group_plan in plan.groups:
        key = "momentum_buffer_SGD" if group_plan.group["use_muon"] else "momentum_buffer"
        for bucket in group_plan.buckets:
            for i, p in enumerate(bucket.params):
                mine = plan.scratch_of[id(p)]
                view = buffer_flats[(p.device, p.dtype)].as_strided(
                    mine.shape, mine.stride(), mine.storage_offset()
                )
                view.copy_(bucket.buffers[i])
                state[p][key] = bucket.buffers[i] = view
    plan.sgd_flats = {key: (buffer_flats[key], scratch_flats[key]) for key in scratch_flats}


def _share_out(plan: _Plan, world: int, rank: int) -> list[_BatchStack]:
    """The stacks as shares of one buffer per rank, or [] (with the reason noted) where they cannot be."""
    devices = {batch.device for batch in plan.batches}
    if len(devices) > 1:
        plan.sharing_note = "Muon matrices on several devices"
        return []
    splittable = [b for b in plan.batches if b.kind != "single"]
    lone = [b for b in plan.batches if b.kind == "single"]
    partition = Partition.of(
        [len(b.members) for b in splittable],
        [math.prod(_matrix_shape(b)) for b in splittable],
        [math.prod(_matrix_shape(b)) for b in lone],
        world,
        rank,
    )
    description = tuple((b.kind, b.stack_shape, len(b.members), str(b.dtype)) for b in plan.batches)
    if not agreed(partition, description):
        plan.sharing_note = "the ranks' parameter sets differ"
        return []
    plan.partition = partition
    stacks, plan.buffer = _allocate_shares(plan.batches, partition)
    return stacks


def _device_refusal(devices: set[torch.device]) -> str | None:
    """Why cores on these devices cannot replay a graph now, or None (one CUDA device, not capturing)."""
    if any(device.type != "cuda" for device in devices):
        return "not on CUDA"
    if len(devices) > 1:
        return "several CUDA devices"
    if torch.cuda.is_current_stream_capturing():
        return "inside another capture"
    return None


# ---------------------------------------------------------------------------------------------- the optimizer


class BatchedMuSGD(MuSGD):
    """MuSGD with batched Newton-Schulz and foreach momentum on CUDA; same constructor, same state.

    See the module docstring for the rules. `pad_guard` is the largest smaller-dimension that may be
    zero-padded into a shared batch (None: no limit, 0: exact-shape batches only); set it on the class, on
    an instance before its first step, or take a subclass from `with_pad_guard`. `graph_replay` (default on)
    lets the Newton-Schulz core replay from a CUDA graph; `graph_stats` counts replays and the reasons for
    every eager core; `eager_step` runs one step with an eager core whatever replay would do.
    """

    pad_guard: int | None = DEFAULT_PAD_GUARD
    # What one more Newton-Schulz chain is worth in padded arithmetic (FLOPs): padding that wastes more than
    # a chain costs is split off (`_split_by_cost`); None pads as far as the memory budget allows.
    pad_chain_flops: float | None = DEFAULT_PAD_CHAIN_FLOPS
    graph_replay: bool = True
    # How many stacks' Newton-Schulz chains may run at once on CUDA, each lane on its own stream
    # (`optimizers.concurrent`); 1 runs them in lockstep on the caller's stream.
    ns_lanes: int = DEFAULT_LANES

    @classmethod
    def with_pad_guard(cls, guard: int | None) -> type[BatchedMuSGD]:
        """A subclass whose padding guard is `guard` (for screens that construct optimizers from a class)."""
        key = (cls, guard)
        if key not in _GUARDED_CLASSES:
            name = f"{cls.__name__}_pad_{'any' if guard is None else guard}"
            _GUARDED_CLASSES[key] = type(
                name, (cls,), {"pad_guard": guard, "__module__": cls.__module__, "__qualname__": name}
            )
        return _GUARDED_CLASSES[key]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reset_caches()

    def _reset_caches(self) -> None:
        self._plan: _Plan | None = None
        self._step_grads: list[torch.Tensor | None] = []  # this step's gradients, in the optimizer's order
        self._core_graph = CoreGraph()
        self._eager_requested = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled or deep-copied optimizers carry state and groups only: they start a plan and a graph.

        (torch's `load_state_dict` calls this too, on a live optimizer: its counts and graph object stay.)
        """
        super().__setstate__(state)
        if not hasattr(self, "_core_graph"):
            self._reset_caches()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does; the restored buffers are new tensors, so the plan is rebuilt on the next step."""
        super().load_state_dict(state_dict)
        self._plan = None
        self._core_graph.reset()

    @property
    def graph_stats(self) -> dict[str, int]:
        """How each step's core ran: 'replayed', 'captured', or 'eager: <reason>' (counts since construction)."""
        return dict(self._core_graph.stats)

    @property
    def plan_bytes(self) -> int:
        """Device bytes the optimizer keeps between steps besides its state: the stacks, the scratch, a captured
        graph's pool and what its capture stream set up (cuBLAS's workspace there)."""
        core = self._core_graph
        return (self._plan.nbytes if self._plan is not None else 0) + core.pool_bytes + core.warm_bytes

    @property
    def sharing(self) -> dict[str, Any]:
        """How the current plan shares Newton-Schulz: over `world` ranks (1: this process does it all), this
        `rank`'s count of matrices of all of them, and a note where a process group's ranks could not share."""
        plan = self._plan
        if plan is None:
            return {"world": 1, "rank": 0, "matrices_here": 0, "matrices": 0, "note": ""}
        here = sum(sum(entry.here) for entry in plan.stacks)
        world, rank = (plan.partition.world, plan.partition.rank) if plan.partition is not None else (1, 0)
        return {
            "world": world,
            "rank": rank,
            "matrices_here": here,
            "matrices": len(plan.fill),
            "note": plan.sharing_note,
        }

    def eager_step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step whose core runs eagerly, replay or not: the step's own kernels, for an outer capture."""
        previous, self._eager_requested = self._eager_requested, True
        try:
            return self.step(closure)
        finally:
            self._eager_requested = previous

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One MuSGD step: Muon momentum, Newton-Schulz and the Muon apply for every batch, then SGD."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plan = self._current_plan()
        scalars = self._scalars(plan)
        layout = plan.layouts.get(scalars.pattern)
        if layout is None:
            if len(plan.layouts) >= MAX_LAYOUTS:
                plan.layouts.clear()
            layout = plan.layouts[scalars.pattern] = _build_layout(plan, scalars)
        try:
            in_order_updates = self._muon(plan, layout, scalars)
            self._sgd(plan, layout, scalars, in_order_updates)
        finally:
            self._step_grads = []  # no gradient kept alive past the step (zero_grad may free them)
        return loss

    # ------------------------------------------------------------------------------------------ step phases

    def _scalars(self, plan: _Plan) -> _Scalars:
        """This step's scalars per group, computed as the baseline computes them, and their pattern.

        Reused while every group's lr, momentum, Nesterov, decay and `use_muon`, and `muon` and `sgd`, are
        the very objects of the last step and all plain Python numbers (immutable: the same value); a
        schedule assigns new ones, and a tensor scalar could change in place, so it is read every step.
        """
        muon, sgd = self.muon, self.sgd
        raw: list[Any] = [muon, sgd]
        for group_plan in plan.groups:
            group = group_plan.group
            raw += (
                group["lr"],
                group["momentum"],
                group["nesterov"],
                group["weight_decay"],
                group["use_muon"],
            )
        last = plan.last_scalars
        if last is not None and len(last[0]) == len(raw) and all(map(operator.is_, raw, last[0])):
            return last[1]
        scalars = self._compute_scalars(plan)
        plan.last_scalars = (raw, scalars) if all(type(v) in _PLAIN_NUMBERS for v in raw) else None
        return scalars

    def _compute_scalars(self, plan: _Plan) -> _Scalars:
        muon, sgd = self.muon, self.sgd
        momentum, nesterov, weight_decay, sgd_alpha, muon_alpha = [], [], [], [], []
        for group_plan in plan.groups:
            group = group_plan.group
            lr = group["lr"]
            momentum.append(group["momentum"])
            nesterov.append(bool(group["nesterov"]))
            weight_decay.append(group["weight_decay"])
            sgd_alpha.append(-(lr * sgd if group["use_muon"] else lr))
            muon_alpha.append(-(lr * muon))
        pattern = (
            _classes(momentum),
            tuple(nesterov),
            _classes(weight_decay),
            _classes(sgd_alpha),
            _classes(muon_alpha),
        )
        return _Scalars(momentum, nesterov, weight_decay, sgd_alpha, muon_alpha, pattern)

    def _muon(self, plan: _Plan, layout: _Layout, scalars: _Scalars) -> dict[int, torch.Tensor]:
        """Muon momentum, the core, the clean members' apply; return the ordered members' updates.

        On one rank the whole core (filling the stacks from buffers and scratch, Newton-Schulz, gains,
        widening into scratch) may replay as one graph. Under a process group the graph holds this rank's
        Newton-Schulz share only; the fill before it and the gather and what follows it run eagerly (no
        collective is captured).
        """
        if not plan.stacks:
            return {}
        self._momentum(plan, layout, scalars)
        fill = plan.core_fill
        device, refusal = plan.device, self._replay_refusal(plan)
        if plan.partition is None:

            def core() -> list[torch.Tensor]:
                _fill_stacks(plan, fill)
                return plan.updates_in_fill_order(_orthogonalize_stacks(plan.stacks, self.ns_lanes))

            updates = self._core_graph.run(fill, device, core, refusal)
        else:
            _fill_stacks(plan, fill)
            self._core_graph.run(
                fill, device, lambda: _newton_schulz_here(plan.stacks, self.ns_lanes), refusal
            )
            assert plan.buffer is not None
            gather_shares(plan.buffer, plan.partition)
            updates = plan.updates_in_fill_order(_finish(plan.stacks))
        sources = [updates]
        for apply in layout.muon_apply:
            torch._foreach_add_(apply.params, apply.updates(sources), alpha=scalars.muon_alpha[apply.group])
        if not plan.ordered:
            return {}
        return {id(member.param): updates[member.position] for member in plan.ordered}

    def _momentum(self, plan: _Plan, layout: _Layout, scalars: _Scalars) -> None:
        """Muon momentum for every member: foreach per run of groups, the Nesterov input of the members
        orthogonalized here computed in their scratch (the baseline's out-of-place lerp, in place on a copy
        of the gradient); ordered members by the scalar step, their inputs copied into their slots now."""
        for run in layout.momentum:
            momentum = scalars.momentum[run.group]
            torch._foreach_lerp_(run.buffers, run.grads(self._step_grads), 1 - momentum)
            if run.nesterov and run.here_scratch:
                torch._foreach_copy_(run.here_scratch, run.here_grads(self._step_grads))
                torch._foreach_lerp_(run.here_scratch, run.here_buffers, momentum)
            elif run.here_scratch:  # the core reads every input from scratch: one fill, however Nesterov goes
                torch._foreach_copy_(run.here_scratch, run.here_buffers)
        sources = []
        for member, here in zip(plan.ordered, plan.ordered_here, strict=True):
            group, p = member.group, member.param
            buffer = self.state[p]["momentum_buffer"]
            source = muon_momentum(p.grad, buffer, group["momentum"], group["nesterov"])
            if here:
                sources.append(source)
        if sources:
            torch._foreach_copy_(plan.ordered_slots, sources)

    def _replay_refusal(self, plan: _Plan) -> str | None:
        """Why this step's core must not replay a graph, or None where replay is safe."""
        if not self.graph_replay:
            return "replay off"
        if self._eager_requested:
            return "eager step asked for"
        return _device_refusal(plan.devices)

    def _sgd(
        self, plan: _Plan, layout: _Layout, scalars: _Scalars, in_order_updates: dict[int, torch.Tensor]
    ) -> None:
        """SGD momentum of the clean buckets as merged foreach lists, then every group's in-order parameters
        one by one (clean parameters share no memory with them, so running them first changes no bit)."""
        run_updates = []
        for run in layout.sgd:
            momentum, weight_decay = scalars.momentum[run.group], scalars.weight_decay[run.group]
            grads = run.grads(self._step_grads)
            if weight_decay != 0 or run.nesterov:  # g + wd p, then g + m buf: in place in scratch
                torch._foreach_copy_(run.scratch, grads)
                grads = run.scratch
                if weight_decay != 0:
                    torch._foreach_add_(grads, run.params, alpha=weight_decay)
            if run.flat is not None:  # the same operations on two stretches of flat tensors
                buffers, scratch = run.flat
                buffers.mul_(momentum)
                if grads is run.scratch:
                    buffers.add_(scratch)
                else:
                    torch._foreach_add_(run.buffers, grads)
                if run.nesterov and run.flat_nesterov:
                    scratch.add_(buffers, alpha=momentum)
                elif run.nesterov:
                    torch._foreach_add_(grads, run.buffers, alpha=momentum)
            else:
                foreach_mul_(run.buffers, momentum)
                torch._foreach_add_(run.buffers, grads)
                if run.nesterov:
                    torch._foreach_add_(grads, run.buffers, alpha=momentum)
            run_updates.append(grads if run.nesterov else run.buffers)
        for apply in layout.sgd_apply:
            torch._foreach_add_(
                apply.params, apply.updates(run_updates), alpha=scalars.sgd_alpha[apply.group]
            )
        for group_plan in plan.groups:
            if group_plan.in_order:
                self._sgd_in_order(group_plan, in_order_updates)

    def _sgd_in_order(self, group_plan: _GroupPlan, in_order_updates: dict[int, torch.Tensor]) -> None:
        """A group's in-order parameters one by one: the whole baseline step, or the ordered Muon apply and
        scalar SGD momentum."""
        group = group_plan.group
        lr, momentum, nesterov, weight_decay = (
            group["lr"],
            group["momentum"],
            group["nesterov"],
            group["weight_decay"],
        )
        sgd_lr = lr * self.sgd if group["use_muon"] else lr
        for p in group_plan.in_order:
            state = self.state[p]
            if id(p) in group_plan.whole_step:
                musgd_param_step(p, state, group, self.muon, self.sgd)
                continue
            p.add_(in_order_updates.pop(id(p)), alpha=-(lr * self.muon))
            sgd_momentum_step(
                p, p.grad, state["momentum_buffer_SGD"], sgd_lr, momentum, weight_decay, nesterov
            )

    # ------------------------------------------------------------------------------------------ planning

    def _signature(self) -> tuple[tuple[Any, ...], tuple[Any, ...], list[torch.Tensor | None]]:
        """What the plan depends on (cheap, per step), the gradients' addresses (checked separately), and
        every parameter's gradient in the optimizer's order (read once here, used by the step).

        Per group: its identity and `use_muon`, the parameters' identities and addresses, which have a
        gradient, and (apart) the present gradients' addresses; each a C-level pass over the group.
        """
        parts: list[Any] = [
            id(self.state),
            self.pad_guard,
            self.pad_chain_flops,
            self.ns_lanes,  # the captured core's streams
            _FORCE_BATCHED_ON_CPU,
            world_and_rank(),
        ]
        grad_addresses: list[Any] = []
        every_grad: list[torch.Tensor | None] = []
        for group in self.param_groups:
            params = group["params"]
            grads = list(map(_GRAD, params))
            every_grad += grads
            parts += [
                id(group),
                group["use_muon"],
                tuple(map(id, params)),
                _addresses(params),
                tuple(map(_IS_NONE, grads)),
            ]
            grad_addresses.append(_addresses(list(filter(_IS_NOT_NONE, grads))))
        return tuple(parts), tuple(grad_addresses), every_grad

    def _current_plan(self) -> _Plan:
        """The plan for this step's parameter set (reused while its signature holds, else rebuilt); the
        gradients read for the check are kept for this step (`_step_grads`)."""
        signature, grad_addresses, self._step_grads = self._signature()
        plan = self._plan
        if plan is not None and plan.signature == signature:
            if plan.grad_addresses == grad_addresses:
                return plan
            # Gradients moved (fresh allocations): the plan holds unless a gradient now overlaps something.
            if not plan.grads_overlap and not self._grads_overlap(plan, grad_addresses):
                plan.grad_addresses = grad_addresses
                return plan
        self._plan = None  # the old stacks go before the new ones are allocated
        self._plan = self._build_plan(signature, grad_addresses)
        return self._plan

    def _grads_overlap(self, plan: _Plan, grad_addresses: tuple[Any, ...]) -> bool:
        """Whether any gradient now shares memory with a tracked parameter or buffer, or with another gradient.

        Per step only when gradients moved (a trainer's zero_grad frees them every step). Where the plan's
        parameters share one device and every gradient is contiguous (autograd's own), a few C-level passes:
        over this step's gradients and the addresses the signature read (`grad_addresses`, `_spans_meet`) where
        the plan's memory is disjoint, else `_spans_reach`; otherwise a binary search per gradient against the
        plan's sorted spans (`_grads_overlap_each`).
        """
        index = plan.grad_check_index
        if index is not None:
            try:
                if plan.grad_check_ends is not None:  # every parameter, in order: the signature's reads
                    grads = list(filter(_IS_NOT_NONE, self._step_grads))
                    starts = list(itertools.chain.from_iterable(grad_addresses))
                else:
                    grads = list(filter(_IS_NOT_NONE, map(_GRAD, plan.grad_check_params)))
                    starts = list(_addresses(grads))
                if all(map(_IS_CONTIGUOUS, grads)):
                    if _OPAQUE in starts:
                        return True
                    sizes = list(map(_NBYTES, grads))
                    ends = list(map(operator.add, starts, sizes))
                    if plan.grad_check_ends is not None and 0 not in sizes:
                        return _spans_meet(starts, ends, plan.grad_check_ends)
                    return _spans_reach(starts, ends, index)
            except Exception:  # a tensor that refuses inspection: the per-gradient check says what it is
                pass
        return self._grads_overlap_each(plan)

    def _grads_overlap_each(self, plan: _Plan) -> bool:
        """`_grads_overlap` one gradient at a time, for any layout and any mix of devices."""
        grad_spans = []
        for p, device in plan.grad_checks:
            grad = p.grad
            if grad is None:
                continue
            if _address(grad) == _OPAQUE:
                return True
            start, end = _memory_span(grad)
            starts, reach = plan.span_index.get(device, ((), ()))
            below = bisect.bisect_left(starts, end)  # spans starting before this gradient ends...
            if below and reach[below - 1] > start:  # ...of which one ends after it starts
                return True
            grad_spans.append((device, start, end, None))
        return len(_overlapping(grad_spans)) > 0

    def _build_plan(self, signature: tuple[Any, ...], grad_addresses: tuple[Any, ...]) -> _Plan:
        """Sort every parameter with a gradient into a batch and a foreach bucket, or the in-order list."""
        # 1. Parameters the batched path may take at all: on CUDA (or forced CPU), usual state, matrices
        #    in Muon groups. State is created here as the baseline would create it (zeros like p).
        tracked: list[tuple[dict[str, Any], torch.Tensor]] = []
        whole_step: set[int] = set()  # ids taking the baseline's per-parameter step
        opaque_groups: set[int] = set()
        for group in self.param_groups:
            keys = ("momentum_buffer", "momentum_buffer_SGD") if group["use_muon"] else ("momentum_buffer",)
            for p in group["params"]:
                if p.grad is None or not _batches_on(p.device):
                    if p.grad is not None:
                        whole_step.add(id(p))
                    continue
                tracked.append((group, p))
                state = self.state[p]
                if (state and not _state_is_usual(p, state, keys)) or (
                    group["use_muon"] and p.ndim not in (2, 4)
                ):
                    whole_step.add(id(p))  # the baseline step does (or refuses) what the user expects
                elif not state:
                    for key in keys:
                        state[key] = torch.zeros_like(p)
                if _refuses_inspection(p):
                    opaque_groups.add(id(group))

        # 2. Memory: a parameter overlapping anything keeps exact shapes and its order; a gradient or buffer
        #    that shares memory with anything sends its parameter to the whole per-parameter step.
        spans, refusing = _spans_of(tracked, self.state, grads=True)
        whole_step |= refusing
        flagged = _overlapping(spans)
        grads_overlap = any(role == "grad" for _, role in flagged)
        overlapping_params = {pid for pid, role in flagged if role == "param"}
        whole_step |= {pid for pid, role in flagged if role != "param"}

        # 3. Newton-Schulz batches, across groups: padded keys share the smaller dimension (up to the guard),
        #    exact keys share shape and layout.
        orders = {id(p): order for order, p in enumerate(p for g in self.param_groups for p in g["params"])}
        padded: dict[tuple[Any, ...], list[_Member]] = {}
        exact: dict[tuple[Any, ...], list[_Member]] = {}
        clean: set[int] = set()
        for group, p in tracked:
            if id(p) in whole_step:
                continue
            ordered = id(group) in opaque_groups or id(p) in overlapping_params
            if not ordered:
                clean.add(id(p))
            if not group["use_muon"]:
                continue
            rows, cols = p.shape[0], math.prod(p.shape[1:])
            member = _Member(
                p,
                group,
                orders[id(p)],
                ordered,
                min(rows, cols),
                max(rows, cols),
                muon_scale(p.shape),
                2 * p.numel() * p.element_size(),
            )
            if not ordered and (self.pad_guard is None or member.small <= self.pad_guard):
                padded.setdefault((p.device, p.dtype, member.small), []).append(member)
            else:
                exact.setdefault((p.device, p.dtype, tuple(p.shape), p.stride()), []).append(member)
        batches = [_make_batch(members) for members in exact.values()]
        element_size = torch.empty((), dtype=STACK_DTYPE).element_size()
        for members in padded.values():
            members.sort(key=lambda m: (-m.large, m.order))
            if self.pad_chain_flops is None:
                runs = _split_by_budget(members, element_size)
            else:
                runs = _split_by_cost(members, element_size, self.pad_chain_flops)
            batches += [_make_batch(run) for run in runs]

        # 4. Per group: SGD buckets of clean parameters by (device, dtype); everything else in order.
        group_plans = []
        for group in self.param_groups:
            sgd_key = "momentum_buffer_SGD" if group["use_muon"] else "momentum_buffer"
            buckets: dict[tuple[torch.device, torch.dtype], _Bucket] = {}
            in_order = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if id(p) in clean:
                    bucket = buckets.setdefault((p.device, p.dtype), _Bucket([], []))
                    bucket.params.append(p)
                    bucket.buffers.append(self.state[p][sgd_key])
                else:
                    in_order.append(p)
            group_whole = {id(p) for p in in_order if id(p) in whole_step or not group["use_muon"]}
            group_plans.append(_GroupPlan(group, list(buckets.values()), in_order, group_whole))
        plan = _Plan(signature, grad_addresses, grads_overlap, {}, batches, group_plans)
        plan.positions = orders
        _lay_out(plan, self.state, *world_and_rank())  # 5. the stacks (shared out over ranks), the fill order
        _mirror_sgd_buffers(plan, self.state)  # 6. the SGD buffers laid out like scratch (new memory)

        # 7. What a moved gradient is checked against per step: the parameters and their state as now held.
        plan.span_index = _span_index(_spans_of(tracked, self.state, grads=False)[0])
        plan.grad_checks = [
            (p, str(p.device))
            for group in self.param_groups
            for p in group["params"]
            if _batches_on(p.device)
        ]
        check_devices = {device for _, device in plan.grad_checks}
        if len(check_devices) == 1:
            starts, reach = plan.span_index.get(check_devices.pop(), ([], []))
            plan.grad_check_params = [p for p, _ in plan.grad_checks]
            plan.grad_check_index = _reach_index(starts, reach)
            every = sum(len(group["params"]) for group in self.param_groups)
            if len(plan.grad_check_params) == every:  # a subsequence of the order as long as it: the order
                plan.grad_check_ends = _disjoint_ends(starts, reach)
        return plan


_GUARDED_CLASSES: dict[tuple[type, int | None], type[BatchedMuSGD]] = {}
