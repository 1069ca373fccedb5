"""What crosses from the web app to the workers, defined once.

- **Jobs**: what a trial runs. `EngineJob` wraps the engine's typed `TrialSpec` (the web app builds it, the
  queue stores it as JSON, the device that plans the trial reads it back); `SyntheticJob` is a trial of
  units that only sleep, for measuring the queue itself. `job_from_dict` is the one parser of a stored job.
- **Trial states and their transitions**: `TrialState`, and the tables `CONTROL_TRANSITIONS` (what pause,
  resume and cancel do in each state) and `UNIT_TRANSITIONS` (where a trial goes when the unit or planning
  in flight ends). The queue's Lua scripts are the authority at run time; these tables state the same rules
  once for Python, and a test drives every entry through the real queue to hold the two equal.
- **Records and events**: `TrialRecord` (a trial's state in the queue) and `TrialEvent` (one entry of the
  host's events stream: a trial changed state).
- **Errors**: `QueueError` and its kinds; `JobError` for a job that cannot be run as given.

This module imports neither torch, Django nor Redis: the web process loads it to build jobs, and a GPU
server loads it without the web app.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from worker.engine.config import TrialSpec
from worker.engine.errors import SpecError

# Errors ---------------------------------------------------------------------------------------------------


class QueueError(Exception):
    """Base of the shard queue's errors."""


class TrialNotFound(QueueError, LookupError):
    """The host's queue has no trial of that id."""


class TrialExists(QueueError):
    """A trial of that id was submitted to the host before."""


class InvalidTransition(QueueError):
    """The trial's state does not allow the asked control (see `CONTROL_TRANSITIONS`)."""


class LeaseLost(QueueError):
    """The lease expired and the trial went back to the queue; this unit's result must not be recorded."""

    survey: object = None  # the survey made in the same round trip, when one was (queue.complete_then_survey)


class JobError(ValueError):
    """A job is malformed or impossible; the message says which field and why."""


# Jobs -----------------------------------------------------------------------------------------------------

Budget = Literal["explicit", "auto"]
# Durable checkpoints of a trial's state, every this many minutes of its training (0: none). The default bounds
# what a host reboot costs each trial at half an hour of its work; a checkpoint costs the trial only a snapshot
# between two units (benchmarks/checkpoint_overhead.py).
DEFAULT_CHECKPOINT_MINUTES = 30.0
MAX_CHECKPOINT_MINUTES = 7 * 24 * 60.0
# The most devices a job may ask for its trial's micro-batches: more than any server has.
MAX_DEVICES_PER_TRIAL = 1024


PRUNER_KINDS = ("asha", "hyperband", "median")
# What a pruner compares trials by: an evaluation's figure (its field of the engine's unit result) and whether
# lower or higher is better. The reward figures are a DPO trial's (its loss is the DPO loss, its bits per byte
# those of the chosen answers).
PRUNER_METRICS = {"loss": ("eval_loss", "minimize"), "bpb": ("eval_bpb", "minimize"),
                  "reward_accuracy": ("eval_reward_accuracy", "maximize"),
                  "reward_margin": ("eval_reward_margin", "maximize")}


@dataclass(frozen=True, kw_only=True)
class PrunerSpec:
    """How an experiment stops trials that fall behind, in Optuna's terms (`worker.scheduling.pruning`).

    ``asha``: asynchronous successive halving (``optuna.pruners.SuccessiveHalvingPruner``): at each rung, the
    ``min_resource`` x ``reduction_factor`` ** (``min_early_stopping_rate`` + rung)-th step, a trial goes on
    only if its validation loss is in the best 1 / ``reduction_factor`` of the trials that reached the rung
    so far. ``hyperband``: several such brackets of different early-stopping rates (``HyperbandPruner``, up
    to ``max_resource`` steps, the trials' length). ``median``: a trial stops when its loss is worse than the
    median of the finished trials' at the same step (``MedianPruner``), after ``n_startup_trials`` finished
    and ``n_warmup_steps`` of its own. Resources are optimizer steps; decisions are taken at evaluations.
    ``metric`` is the evaluation's figure the trials are compared by (`PRUNER_METRICS`: the validation loss by
    default; a DPO experiment's may be its preference accuracy or reward margin, higher being better)."""

    kind: str
    min_resource: int = 1
    reduction_factor: int = 3
    min_early_stopping_rate: int = 0
    max_resource: int | None = None
    n_startup_trials: int = 5
    n_warmup_steps: int = 0
    metric: str = "loss"

    def __post_init__(self) -> None:
        if self.kind not in PRUNER_KINDS:
            raise JobError(f"pruner kind {self.kind!r} is unknown; use one of {', '.join(PRUNER_KINDS)}.")
        if self.metric not in PRUNER_METRICS:
            raise JobError(f"pruner metric {self.metric!r} is unknown; use one of {', '.join(PRUNER_METRICS)}.")
        for name in ("min_resource", "reduction_factor", "min_early_stopping_rate", "n_startup_trials",
                     "n_warmup_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise JobError(f"pruner {name}={value!r} must be a whole number, not negative.")
        if self.min_resource < 1:
            raise JobError(f"pruner min_resource={self.min_resource} must be at least 1 step.")
        if self.reduction_factor < 2:
            raise JobError(f"pruner reduction_factor={self.reduction_factor} must be at least 2.")
        if self.max_resource is not None and (not isinstance(self.max_resource, int) or
                                              self.max_resource < self.min_resource):
            raise JobError(f"pruner max_resource={self.max_resource!r} must be a number of steps of at least "
                           f"min_resource ({self.min_resource}).")

    @property
    def direction(self) -> str:
        """``minimize`` or ``maximize``: which way `metric` gets better."""
        return PRUNER_METRICS[self.metric][1]

    def value(self, figures: Mapping[str, Any]) -> float | None:
        """`metric`'s figure among an evaluation's (the engine's ``UnitResult`` fields by name; None: none)."""
        return figures.get(PRUNER_METRICS[self.metric][0])

    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        if self.metric == "loss":  # the form of a pruner by validation loss stays what it always was
            del raw["metric"]
        return raw


@dataclass(frozen=True, kw_only=True)
class PruningJob:
    """The trial is number ``trial_number`` of the study ``study`` (its experiment), which ``pruner`` prunes:
    each of its evaluations is reported to the study, and it ends *pruned* when the pruner says so."""

    study: str
    trial_number: int
    pruner: PrunerSpec

    def __post_init__(self) -> None:
        if not isinstance(self.study, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,100}", self.study):
            raise JobError(f"pruning study {self.study!r} must be 1 to 100 letters, digits or _.:-")
        if isinstance(self.trial_number, bool) or not isinstance(self.trial_number, int) or self.trial_number < 1:
            raise JobError(f"pruning trial_number={self.trial_number!r} must be a trial number from 1.")

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, "trial_number": self.trial_number, "pruner": self.pruner.to_dict()}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PruningJob:
        return cls(study=raw["study"], trial_number=raw["trial_number"], pruner=PrunerSpec(**raw["pruner"]))


@dataclass(frozen=True, kw_only=True)
class EngineJob:
    """Train `trial` with the engine. With ``budget="auto"`` the device that plans the trial replaces
    ``trial.budget_bytes`` with its own memory budget (the web host may see no GPU, or other ones).

    ``resume`` marks a trial submitted again after the queue lost it (Redis emptied): it trained before, so
    its state must be found (its spill store, else its last checkpoint), never made afresh.

    ``continue_from``: the queue id of an ended trial whose last checkpoint this one starts from, to train the
    segment its spec adds (its last ``trial.continuations``); planning makes the trial's store from that
    checkpoint, with the cursor at the added steps' first unit.

    ``checkpoint_minutes``: how often the trial's state is copied to disk as a durable checkpoint (and when it
    ends); 0 turns checkpoints off.

    ``pruning``: the trial is one of a study whose pruner may stop it at an evaluation (None: it trains its
    whole budget).

    ``max_devices``: the most devices the micro-batches of one of its steps may run on at once when devices
    would otherwise idle (a wavefront; None: as many as it has micro-batches)."""

    trial: TrialSpec
    budget: Budget = "explicit"
    resume: bool = False
    continue_from: str | None = None
    checkpoint_minutes: float = DEFAULT_CHECKPOINT_MINUTES
    pruning: PruningJob | None = None
    max_devices: int | None = None

    kind = "engine"

    @property
    def width_cap(self) -> int:
        """The most devices its units may run on at once: its micro-batches, at most ``max_devices``."""
        return min(self.trial.micro_batches, self.max_devices or self.trial.micro_batches)

    def __post_init__(self) -> None:
        if self.budget not in ("explicit", "auto"):
            raise JobError(f"engine job budget {self.budget!r} is unknown; use 'explicit' (the trial's "
                           "budget_bytes) or 'auto' (the planning device's memory).")
        minutes = self.checkpoint_minutes
        if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not (
                0 <= minutes <= MAX_CHECKPOINT_MINUTES):
            raise JobError(f"engine job checkpoint_minutes={minutes!r} must be a number of minutes from 0 (no "
                           f"checkpoints) to {MAX_CHECKPOINT_MINUTES:.0f}.")
        if not isinstance(self.resume, bool):
            raise JobError(f"engine job resume={self.resume!r} must be true or false.")
        if self.max_devices is not None and (isinstance(self.max_devices, bool) or not isinstance(self.max_devices, int)
                                             or not 1 <= self.max_devices <= MAX_DEVICES_PER_TRIAL):
            raise JobError(f"engine job max_devices={self.max_devices!r} must be a whole number of devices from 1 to "
                           f"{MAX_DEVICES_PER_TRIAL}, or null (as many as the trial has micro-batches).")
        if self.continue_from is not None and (not isinstance(self.continue_from, str) or not self.continue_from
                                               or not self.trial.continuations):
            raise JobError(f"engine job continue_from={self.continue_from!r} needs the id of the ended trial and a "
                           "trial spec that adds steps to it (continuations).")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "trial": self.trial.to_dict(), "budget": self.budget,
                **({"continue_from": self.continue_from} if self.continue_from is not None else {}),
                "checkpoint_minutes": self.checkpoint_minutes, **({"resume": True} if self.resume else {}),
                **({"pruning": self.pruning.to_dict()} if self.pruning is not None else {}),
                **({"max_devices": self.max_devices} if self.max_devices is not None else {})}


@dataclass(frozen=True, kw_only=True)
class SyntheticJob:
    """`units` units that sleep `unit_ms` each and train nothing; planning sleeps `plan_ms`; unit
    `fail_at_unit` raises (which fails the trial as a crashing engine unit would)."""

    units: int
    unit_ms: float = 0.0
    fail_at_unit: int | None = None
    plan_ms: float = 0.0

    kind = "synthetic"
    width_cap = 1  # its units count in the queue alone: one at a time

    def __post_init__(self) -> None:
        if not isinstance(self.units, int) or self.units < 1:
            raise JobError(f"a synthetic job needs at least one unit; got units={self.units!r}.")
        if not isinstance(self.unit_ms, int | float) or self.unit_ms < 0:
            raise JobError(f"unit_ms={self.unit_ms!r} must be a number of milliseconds, not negative.")
        if not isinstance(self.plan_ms, int | float) or self.plan_ms < 0:
            raise JobError(f"plan_ms={self.plan_ms!r} must be a number of milliseconds, not negative.")
        if self.fail_at_unit is not None and not isinstance(self.fail_at_unit, int):
            raise JobError(f"fail_at_unit={self.fail_at_unit!r} must be a unit number or null.")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "units": self.units, "unit_ms": self.unit_ms, "fail_at_unit": self.fail_at_unit,
                "plan_ms": self.plan_ms}


Job = EngineJob | SyntheticJob


def job_from_dict(raw: Mapping[str, Any]) -> Job:
    """The job `raw` (as `to_dict` wrote it) describes. Raises JobError saying what is wrong."""
    if not isinstance(raw, Mapping):
        raise JobError(f"a job is a mapping with a 'kind'; got {type(raw).__name__}.")
    kind = raw.get("kind")
    try:
        if kind == EngineJob.kind:
            return EngineJob(trial=TrialSpec.from_dict(dict(raw["trial"])), budget=raw.get("budget", "explicit"),
                             resume=raw.get("resume", False), continue_from=raw.get("continue_from"),
                             checkpoint_minutes=raw.get("checkpoint_minutes", DEFAULT_CHECKPOINT_MINUTES),
                             pruning=PruningJob.from_dict(raw["pruning"]) if raw.get("pruning") else None,
                             max_devices=raw.get("max_devices"))
        if kind == SyntheticJob.kind:
            return SyntheticJob(units=raw["units"], unit_ms=raw.get("unit_ms", 0.0),
                                fail_at_unit=raw.get("fail_at_unit"), plan_ms=raw.get("plan_ms", 0.0))
    except KeyError as error:
        raise JobError(f"{kind} job lacks {error}.") from error
    except (TypeError, ValueError, SpecError) as error:
        if isinstance(error, JobError):
            raise
        raise JobError(f"{kind} job is invalid: {error}") from error
    raise JobError(f"job kind {kind!r} is unknown; use 'engine' or 'synthetic'.")


# Trial states ---------------------------------------------------------------------------------------------


class TrialState(StrEnum):
    PLANNING = "planning"
    RUNNABLE = "runnable"
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PRUNED = "pruned"  # stopped by the experiment's pruner at an evaluation, its state and export kept


ENDED = frozenset({TrialState.FINISHED, TrialState.FAILED, TrialState.CANCELLED, TrialState.PRUNED})
# A device may be working on a trial in these states (planning it, or running its unit): a pause or cancel
# waits in the trial's ``control`` field and applies when that work ends, at a unit boundary.
IN_FLIGHT = frozenset({TrialState.PLANNING, TrialState.RUNNING})


class Control(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"


S = TrialState
# The state each control leaves a trial in, once the work in flight on it (if any) has ended as planned:
# pause and cancel of an in-flight trial wait for its unit boundary, and a resume drops a pause still
# waiting. A state missing from a control's row refuses that control (InvalidTransition).
CONTROL_TRANSITIONS: Mapping[Control, Mapping[TrialState, TrialState]] = {
    Control.PAUSE: {S.PLANNING: S.PAUSED, S.RUNNABLE: S.PAUSED, S.RUNNING: S.PAUSED, S.PAUSED: S.PAUSED},
    Control.RESUME: {S.PLANNING: S.RUNNABLE, S.RUNNABLE: S.RUNNABLE, S.RUNNING: S.RUNNABLE, S.PAUSED: S.RUNNABLE},
    Control.CANCEL: {S.PLANNING: S.CANCELLED, S.RUNNABLE: S.CANCELLED, S.RUNNING: S.CANCELLED,
                     S.PAUSED: S.CANCELLED, S.CANCELLED: S.CANCELLED},
}


class UnitEnd(StrEnum):
    """How the work in flight on a trial ended."""

    PLANNED = "planned"  # planning succeeded
    DONE = "done"  # a unit completed and more remain
    LAST = "last"  # the trial's last unit completed
    PRUNED = "pruned"  # the unit's evaluation fell behind the experiment's other trials: the pruner stopped it
    REPLANNED = "replanned"  # the unit ran out of device memory and the trial was re-planned
    FAILED = "failed"  # planning or the unit raised
    LEASE_EXPIRED = "lease_expired"  # the device went silent; the same work runs again


# Where a trial goes when its work in flight ends. A waiting pause or cancel turns a RUNNABLE outcome into
# PAUSED or CANCELLED (`after_unit`); FINISHED and FAILED drop it.
UNIT_TRANSITIONS: Mapping[TrialState, Mapping[UnitEnd, TrialState]] = {
    S.PLANNING: {UnitEnd.PLANNED: S.RUNNABLE, UnitEnd.FAILED: S.FAILED, UnitEnd.LEASE_EXPIRED: S.PLANNING},
    S.RUNNING: {UnitEnd.DONE: S.RUNNABLE, UnitEnd.LAST: S.FINISHED, UnitEnd.PRUNED: S.PRUNED,
                UnitEnd.REPLANNED: S.RUNNABLE, UnitEnd.FAILED: S.FAILED, UnitEnd.LEASE_EXPIRED: S.RUNNABLE},
}
del S


def after_unit(state: TrialState, end: UnitEnd, waiting: Control | None = None) -> TrialState:
    """The state of a trial in `state` whose work in flight ended with `end`, `waiting` being the control
    that arrived meanwhile. Raises InvalidTransition when nothing can be in flight in `state`."""
    outcome = UNIT_TRANSITIONS.get(state, {}).get(end)
    if outcome is None:
        raise InvalidTransition(f"no work is in flight on a {state} trial, so it cannot end {end}.")
    if outcome == TrialState.RUNNABLE and waiting in (Control.PAUSE, Control.CANCEL):
        return CONTROL_TRANSITIONS[waiting][TrialState.RUNNABLE]
    return outcome


def control_changes(state: str, control: Control) -> bool:
    """Whether `control` does something to a trial in `state` (what the UI offers), rather than being
    refused or leaving the trial where it was going anyway (runnable once its work in flight ends)."""
    target = CONTROL_TRANSITIONS[control].get(state)  # type: ignore[call-overload]
    going = TrialState.RUNNABLE if state in IN_FLIGHT else state
    return target is not None and target != going


# Records and events ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRecord:
    """A trial's state in its host's queue. `control` is a waiting 'pause' or 'cancel', or ''. `team`,
    `priority` (0 low, 1 normal, 2 high) and `host_bytes` are what it was submitted with; `admitted` says
    whether the host holds its spill store's place (see the scheduler's admission). `devices`: the devices
    running units of it now (more than one: its micro-batches run as a wavefront); `width`: the most devices
    admission gave it room for, `width_cap` the most its micro-batches and its experiment allow."""

    trial_id: str
    state: str
    message: str
    control: str
    device: str
    last_device: str
    remaining_units: int | None
    unit_s: float | None
    remaining_s: float | None
    units_done: int
    requeues: int
    replans: int
    submitted: float
    updated: float
    export_dir: str
    job: dict[str, Any]
    plan: dict[str, Any] | None
    team: str = ""
    priority: int = 1
    host_bytes: int = 0
    admitted: bool = False
    devices: list[str] = dataclasses.field(default_factory=list)
    width: int = 1
    width_cap: int = 1


@dataclass(frozen=True)
class TrialEvent:
    """One entry of a host's events stream: trial `trial_id` moved to `state`, with `message` (why it
    failed, or what happened to it); `entry_id` orders the events of a host. A finished event says how many
    training steps the trial took (`steps_done`), which its metrics may not have reported yet."""

    entry_id: str
    trial_id: str
    state: TrialState
    message: str
    steps_done: int | None = None
    rung: int | None = None  # of a pruned trial: the pruner's rung where it stopped

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> TrialEvent:
        """Parse a stream entry (``id``, ``trial``, ``state``, ``message``, optional ``steps_done``);
        ValueError for a bad state or step count."""
        try:
            state = TrialState(entry["state"])
            steps_done = int(entry["steps_done"]) if entry.get("steps_done") not in (None, "") else None
            rung = int(entry["rung"]) if entry.get("rung") not in (None, "") else None
        except (KeyError, ValueError) as error:
            raise ValueError(f"event {entry.get('id')!r} is not valid: {error}") from None
        return cls(entry_id=str(entry.get("id", "")), trial_id=str(entry["trial"]), state=state,
                   message=str(entry.get("message") or ""), steps_done=steps_done, rung=rung)
