"""Re-partition a trial's spill store into other shards (recovery from a device out-of-memory).

Between two optimizer steps a trial's whole state is, per layer, its fp32 parameters and optimizer state
(gradients are empty once the pending step is applied; boundary activations and RNG snapshots belong to
the step in flight, of which there is none). A shard's flat buffers are its layers' buffers laid end to
end, and shards are contiguous runs of layers, so the concatenation of every shard's buffer is the same
vector for any plan: re-packing is slicing that vector at the new shard starts, bit for bit. The trial's
position in training carries over; the cursor is re-indexed into the new timetable (a micro-batch's random
numbers come from its own seed, see `worker.engine.rng`, so there is no stream to carry).

A trial is re-planned when a unit ran out of memory, which can be anywhere in a step. So the work of the
segment in flight is rolled back first, to where it started:

    training of step k    accumulated gradients of step k are dropped (a shard still holding step k-1's
                          gradients has its update pending: those stay and are applied), the step's running
                          sums are reset, and units a wavefront committed ahead count as not run;
    evaluation after k    its running sum is reset (evaluation draws no random numbers);
    final updates (S)     nothing to undo.

Boundary activations, their gradients and RNG snapshots of the rolled-back segment are dropped with the
old shapes. Replaying the segment from its start gives the numbers it would have given, because a unit's
result depends only on the store and the store is back as it was when the segment started (up to pending
updates, which are deterministic whether they are applied now or later).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from worker.engine.errors import EngineError, StaleWriterError
from worker.engine.partition import MemoryPlan
from worker.engine.profile import plan_layers
from worker.engine.schedule import Timetable, UnitSpec
from worker.engine.session import TrialSession
from worker.engine.sizes import FP32
from worker.engine.spill_store import SpillStore, read_file

SHARD_STATE = ("p", "m", "v")  # per shard, what survives a step boundary


def segment_start(timetable: Timetable, unit: UnitSpec, *, restart_step: bool = False) -> int:
    """The index of the first unit of ``unit``'s segment: its step's training (with ``restart_step``, also for a
    step's own ``S`` unit), what follows that step's training (its evaluation, the final updates or the next
    step: a step's own ``S`` unit is not in every timetable), or its batch of the reference pass."""
    if unit.phase == "R":
        return unit.micro_batch * timetable.shards
    start = timetable.step_offset(unit.step)
    return start + timetable.train_units_per_step if unit.phase in ("E", "S") and not restart_step else start


def repartition(*, spill_dir: Path, trial_id: str, device: torch.device, budget_bytes: int | None = None,
                cuts: Sequence[int] | None = None, token: int | None = None,
                replans: int | None = None) -> MemoryPlan:
    """Re-plan trial ``trial_id`` under ``budget_bytes`` (solved from its profiled layer costs) or with
    explicit shard starts ``cuts``, roll back the segment in flight, re-pack its store and commit; return
    the new plan.

    ``token`` fences the re-pack like a unit (see ``TrialSession.run_unit``); ``StaleWriterError`` if
    refused, and also, given ``replans`` (the re-plans the caller's failed unit saw), if the trial was re-planned
    since (another device re-planned it for a unit of another lane that failed alike). Training then continues
    with exactly the numbers it would have had under the old plan. Raises ``BudgetError`` (before changing
    anything) when a layer cannot fit ``budget_bytes``, ``EngineError`` when the trial is finished.
    """
    root = Path(spill_dir) / trial_id
    if token is None:
        store = SpillStore.open(root)
        store.remove_orphans()
    else:
        store = SpillStore.take(root, token)
    session = TrialSession(store, device)
    state = session.state
    if replans is not None and state.replans != replans:
        raise StaleWriterError(f"trial {trial_id!r} was re-planned since the unit that asked for it started "
                               f"({replans} -> {state.replans} re-plans)")
    if state.cursor >= len(session.timetable):
        raise EngineError(f"trial {trial_id!r} is finished: nothing to re-plan")
    old = session.plan
    budget = old.budget_bytes if budget_bytes is None else budget_bytes
    plan = plan_layers(session.stack, session.spec, device, old.layers, budget, cuts=cuts,
                       head_token_chunk=old.head_token_chunk)
    unit = session.timetable[state.cursor]
    # A step's own S unit (a plan of one shard) finishes the step when its last micro-batches parked their
    # gradients: until it ran, the step is rolled back whole, as one in flight.
    restart_step = unit.phase in ("F", "FB", "B") or (unit.phase == "S" and bool(state.step_state.parked))
    _roll_back(session, restart_step=restart_step, evaluating=unit.phase == "E")
    session.apply_pending_steps()  # writes p, m, v of shards with a pending step
    session.commit()  # the rollback and steps on their own: the re-pack below reads these buffers
    layer_numel = [session.stack.layer_numel(i) for i in range(len(session.stack))]
    old_starts = [sum(layer_numel[:shard.first]) for shard in old.shards]
    old_buffers = {kind: {s: store.path(f"{kind}{s}") for s in range(len(old.shards))}
                   for kind in SHARD_STATE if store.version(f"{kind}0") is not None}  # SGD: no m before step 1
    for name in list(store.buffers):
        # Boundary buffers and gradients of the old shapes: none is live after a rollback. A DPO trial's reference
        # log-probabilities (per pair, whatever the shards) carry over.
        if not name.startswith("lp"):
            store.drop(name)
    for shard in plan.shards:
        start, stop = sum(layer_numel[:shard.first]), sum(layer_numel[:shard.stop])
        for kind, paths in old_buffers.items():
            store.write_stream(f"{kind}{shard.index}", _slices(paths, old_starts, session.layout.numel,
                                                                 start, stop))
    state.replan(plan, cursor=segment_start(state.timetable(plan=plan), unit, restart_step=restart_step))
    session.commit()
    return plan


def _roll_back(session: TrialSession, *, restart_step: bool, evaluating: bool) -> None:
    """Undo, in the session's working state, the units of the segment in flight that already ran (see module doc):
    of the step's training, or of an evaluation."""
    state = session.state
    if restart_step:
        state.reset_step()
    elif evaluating:
        state.reset_eval()


def _slices(paths: dict[int, Path], starts: Sequence[int], numel: Sequence[int], start: int, stop: int
            ) -> Iterator[torch.Tensor]:
    """Elements ``[start, stop)`` of the whole model's vector, read from the old shards' buffers that
    overlap it (old shard s holds elements ``[starts[s], starts[s] + numel[s])``), one piece at a time."""
    for shard, path in paths.items():
        low, high = max(start, starts[shard]), min(stop, starts[shard] + numel[shard])
        if low < high:
            yield read_file(path, torch.empty(high - low), offset=(low - starts[shard]) * FP32)
