"""What a device loop asks of a workload: plan a trial, run its next unit, export it.

A trial's job (`worker.contract`) has a ``kind``: ``engine`` (a `worker.engine` trial, the real thing) or
``synthetic`` (units that only sleep, for measuring the queue itself). Runners keep no state that
matters between units: everything lives in the spill store (engine) or in the queue (synthetic), so any
device's runner can run any trial's next unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from worker.contract import Job
from worker.scheduling.policy import BaseShard
from worker.scheduling.telemetry import CheckpointMetrics, EvalMetrics, StepMetrics


class WorkloadError(Exception):
    """A trial's spec or state cannot be run; fails that trial with this message."""


class LaneBusy(Exception):
    """The leased lane has no unit that can run now (its next unit needs one another device runs, or its store
    was restored to an earlier unit): nothing ran, and the lease goes back with the trial's view as its store
    has it, as `UnitDone` carries it: units left, ready lanes and the commit they are as of."""

    def __init__(self, message: str, remaining_units: int, ready: list[int], ready_version: int) -> None:
        super().__init__(message)
        self.remaining_units, self.ready, self.ready_version = remaining_units, ready, ready_version


@dataclass(frozen=True)
class Planned:
    """A planned trial: units to run, a first unit-time estimate, and the plan as JSON-able data; the lanes whose
    next unit can run (of its wavefront, see `UnitDone.ready`) as of its state's version `ready_version`."""

    remaining_units: int
    unit_s: float
    plan: dict[str, Any]
    units_done: int = 0  # units its state already holds: a trial the queue lost resumes from its store
    ready: list[int] = field(default_factory=lambda: [0])
    ready_version: int = 0
    # (lane, token) of the unit its state holds last, which the queue may never have heard of: the lane's next
    # lease reports it first (a trial the queue lost, resumed from its store)
    expired: tuple[int, int] | None = None


@dataclass(frozen=True)
class UnitDone:
    """One unit that ran: where it was in the trial, what it cost, and the metrics it produced."""

    remaining_units: int
    step: int
    micro_batch: int
    phase: str
    shard: int
    bytes_moved: int
    peak_bytes: int
    io_s: float = 0.0  # the part of the unit's time spent moving state to and from the spill store
    steps: list[StepMetrics] = field(default_factory=list)
    evals: list[EvalMetrics] = field(default_factory=list)
    message: str = ""  # for the trial's record, e.g. why it ended before its last step
    keeps_activations: bool = False  # this process kept activations that a later unit of the trial uses
    base: BaseShard | None = None  # the shared base layers the unit read: the device holds them now
    next_base: BaseShard | None = None  # those the trial's next unit reads (for the policy's base affinity)
    pruned: bool = False  # with no unit left: the experiment's pruner stopped the trial at this evaluation
    rung: int | None = None  # the pruner's rung the trial reached at this unit's evaluation
    # The lanes (micro-batches of the segment in flight) whose next unit can run now, as of the trial state's
    # version `ready_version` that this unit's commit made or found: more than one, and the trial may run on
    # several devices at once.
    ready: list[int] = field(default_factory=lambda: [0])
    ready_version: int = 0


@dataclass(frozen=True)
class Replanned:
    """A unit ran out of device memory and the trial was re-planned instead: its new plan, units left and
    first unit-time estimate, and `message` saying what happened (for the trial's event and the UI)."""

    remaining_units: int
    unit_s: float
    plan: dict[str, Any]
    message: str
    ready: list[int] = field(default_factory=lambda: [0])
    ready_version: int = 0


class TrialRunner(Protocol):
    def plan(self, *, trial_id: str, job: Job) -> Planned:
        """Profile and partition the trial on this device, and set up its state. Idempotent: a planning
        attempt that died half-way is planned again from scratch."""
        ...

    def run_unit(self, *, trial_id: str, job: Job, units_done: int, next_trial: str | None,
                 token: int, lane: int | None = None, expired: str = "") -> UnitDone | Replanned:
        """Run the next unit of the trial's `lane` (`units_done` units ran before, by any device; None: its next
        unit in timetable order, the whole trial taken) and commit it; or, if it ran out of device memory,
        re-plan the trial with smaller shards and return `Replanned`.

        `expired` is the token of the lane's lease that expired last ('' for none): when the trial's state holds
        a unit that writer committed (it died before the queue heard of it), the runner reports that unit (with
        the metrics it committed) instead of running another. Raises `LaneBusy` when the lane has no unit
        that can run now.

        `token` is the lease's fencing token (larger is newer). Raises `LeaseLost` when the trial's state
        refuses this writer because a newer lease holder took it: nothing was committed, drop the unit.

        `next_trial` is the trial whose unit this device will most likely run next (this one, another one,
        or None): start loading that unit in the background while this one computes. It is a guess; a
        wrong one only wastes the read.
        """
        ...

    def export(self, *, trial_id: str, job: Job, export_dir: str) -> None:
        """Write a finished trial's result to `export_dir`, then free its state."""
        ...

    def discard(self, *, trial_id: str) -> None:
        """Free whatever state this host keeps for `trial_id` (it ended cancelled or failed, or never was
        this runner's): nothing of it will run again."""
        ...

    def checkpoints(self) -> list[CheckpointMetrics]:
        """The durable checkpoints written since the last call (each reported once), for the telemetry."""
        ...
