"""When the trials of a host's queue start and end, and why each waiting one waits. Pure: records in, estimate out.

The estimate replays the scheduler's own rule (`worker_door.timetable`: fair share between teams with their
weights, then priority, then Sharded-LRTF) over the trials that are running or runnable, from their
remaining units and measured unit times, on the devices serving the host now. It starts every device at the
next unit boundary, as the scheduler reconsiders every trial there, and starts every team level (the
replay does not know the decayed usage the queue holds), so it is an estimate, not a promise: it moves as
unit times are measured and trials arrive, pause or end. The replay runs every trial on one device at a time: a
trial that spreads over idle devices (the micro-batches of its steps as a wavefront) ends sooner than estimated.

A running trial says on how many devices it runs and why (`spread`): on several only when no other trial waits
for a device; on one because it has one micro-batch a step, because its experiment allows one device, because the
host's memory admitted it narrow, because other trials wait, or because its next micro-batch cannot start yet.

A waiting trial is labelled with the reason it waits, the first that applies:

- ``quota``: its team has as many trials on the host as its quota allows (the queue's message says so);
- ``memory``: the host tier cannot hold its spill store next to the stores of the trials admitted already;
- ``planning``: it waits for a device to plan it (it is admissible);
- ``paused``: its team paused it;
- ``no_device``: no device serves the host now;
- ``fair_share``: before it starts, other teams' trials take most of the device time (their turn);
- ``team_order``: its own team's higher-priority or longer trials go first (Sharded-LRTF);
- ``next``: it takes a device at the next unit boundary;
- ``later``: it is runnable but past the trials the replay takes (`MAX_REPLAY_TRIALS`), so it starts after
  them and has no estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from webapp.worker_door import TrialLoad, TrialRecord, timetable

# A device whose loop has not surveyed the queue for this long is taken to be gone: the estimate leaves it
# out. Loops survey before every unit and at least every few seconds when idle.
DEVICE_SEEN_S = 60.0
# The most units the replay schedules, and the most units x trials it weighs (each claim looks at every
# trial, a few microseconds each): a host's trials may have millions of units left, so longer workloads are
# replayed in chunks of several units each (the same time in all), which keeps the replay a small part of
# the lab queue page's time (`benchmarks/web_scale.py` measures the page).
MAX_REPLAY_UNITS = 4000
MAX_REPLAY_WORK = 8000
# The most trials the replay schedules. Every trial takes at least one claim and every claim looks at every
# trial, so replaying all of a thousand trials would cost a million looks; past this many, the replay takes
# the trials the scheduling rule reaches first (`scheduling_order`) and leaves the rest out: they are listed
# after them without an estimate, and the ends estimated are then lower bounds (the trials left out would
# share the devices too). A page of the lab queue's waiting list fits within it.
MAX_REPLAY_TRIALS = 60

QUOTA_PREFIX = "Waits for a place"
MEMORY_PREFIX = "Waits for host memory"
WAITING_STATES = ("planning", "runnable", "paused")
ORDER = {"running": 0, "runnable": 1, "planning": 2, "paused": 3}
REASONS = {
    "quota": "Team quota",
    "memory": "Host memory",
    "planning": "Being planned next",
    "paused": "Paused",
    "no_device": "No device",
    "fair_share": "Fair share: another team's turn",
    "team_order": "Behind its team's longer or higher-priority trials",
    "next": "Next",
    "later": "After the trials estimated",
}


@dataclass(frozen=True)
class Timing:
    """Seconds from now until the trial's next unit starts and until its last unit ends."""

    start_s: float
    end_s: float


@dataclass(frozen=True)
class Waiting:
    """A trial that waits, with why (`reason`, a key of `REASONS`, and `detail`, a sentence) and, when it is
    runnable and a device serves the host, when it is expected to start and end."""

    record: TrialRecord
    reason: str
    detail: str
    timing: Timing | None = None

    @property
    def label(self) -> str:
        return REASONS[self.reason]


@dataclass(frozen=True)
class Device:
    """A device of the host: whether its loop serves the queue now, and the trial leased to it (running a
    unit, or being planned), if any, with on how many devices that trial runs and why (`spread`)."""

    name: str
    online: bool
    seen_s_ago: float | None
    trial: TrialRecord | None
    spread: str = ""


@dataclass(frozen=True)
class Estimate:
    devices: list[Device]
    waiting: list[Waiting]
    timings: dict[str, Timing]  # trial id -> start and end, for every running or runnable trial replayed
    replayed: int = 0  # running or runnable trials the replay scheduled
    left_out: int = 0  # running or runnable trials past `MAX_REPLAY_TRIALS`, not replayed

    @property
    def ends_at_least(self) -> bool:
        """Whether the ends estimated are lower bounds: trials left out of the replay would share the devices."""
        return self.left_out > 0

    def end_s(self, trial_id: str) -> float | None:
        """Seconds from now until the trial is expected to end; None when unknown."""
        timing = self.timings.get(trial_id)
        return None if timing is None else timing.end_s


def devices_serving(devices: Mapping[str, Mapping[str, str]], now: float) -> list[str]:
    """The devices whose loops serve the queue now: not stopped, and seen within `DEVICE_SEEN_S`."""
    return [name for name, info in sorted(devices.items()) if _online(info, now)]


def _online(info: Mapping[str, str], now: float) -> bool:
    seen = _float(info.get("seen"))
    return info.get("stop") != "1" and seen is not None and now - seen <= DEVICE_SEEN_S


def _float(value: object) -> float | None:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _replayable(record: TrialRecord) -> bool:
    return (record.state in ("running", "runnable") and record.remaining_units is not None
            and record.remaining_units > 0 and record.unit_s is not None and record.unit_s >= 0)


def loads_of(records: Iterable[TrialRecord], max_units: int = MAX_REPLAY_UNITS,
             max_work: int = MAX_REPLAY_WORK) -> list[TrialLoad]:
    """The running and runnable trials as the replay's workloads, in chunks of ``k`` units when they have
    more than `max_units` (or `max_work` / trials) in all; each chunk takes the time of the units it stands
    for."""
    records = [r for r in records if _replayable(r)]
    max_units = max(1, min(max_units, max_work // max(1, len(records))))
    total = sum(r.remaining_units or 0 for r in records)
    chunk = max(1, math.ceil(total / max_units))
    loads = []
    for r in records:
        units, unit_s = r.remaining_units or 0, r.unit_s or 0.0
        chunks = math.ceil(units / chunk)
        loads.append(TrialLoad(r.trial_id, chunks, units * unit_s / chunks, team=r.team, priority=r.priority))
    return loads


def scheduling_order(records: Iterable[TrialRecord], weights: Mapping[str, float]) -> list[TrialRecord]:
    """The running and runnable trials in about the order the scheduling rule first runs them, without
    replaying it: the running ones, then the runnable ones of each team (highest priority, then longest
    remaining time first, as Sharded-LRTF takes them), the teams taking turns in proportion to their weights
    (ties to the smaller name, as `fair_share.team_turn` breaks them). Linear in the trials (times the teams)."""
    replayable = [r for r in records if _replayable(r)]
    running = sorted((r for r in replayable if r.state == "running"), key=_longest_first)
    by_team: dict[str, list[TrialRecord]] = {}
    for r in sorted((r for r in replayable if r.state != "running"), key=_longest_first):
        by_team.setdefault(r.team, []).append(r)
    taken = {team: 0 for team in by_team}
    order = list(running)
    while by_team:
        team = min(by_team, key=lambda t: (taken[t] / max(weights.get(t, 1.0), 1e-9), t))
        order.append(by_team[team][taken[team]])
        taken[team] += 1
        if taken[team] == len(by_team[team]):
            del by_team[team]
    return order


def _longest_first(record: TrialRecord) -> tuple[int, float, float, str]:
    return (-record.priority, -(record.remaining_units or 0) * (record.unit_s or 0.0), record.submitted,
            record.trial_id)


def replay(loads: Sequence[TrialLoad], devices: Sequence[str],
           weights: Mapping[str, float]) -> tuple[dict[str, Timing], dict[str, tuple[float, float, float]]]:
    """Replay the scheduling rule; returns each trial's timing and, for each trial, the device time taken
    before its first unit by other teams' trials, by its team's trials of a higher priority, and by its
    team's other trials of its priority."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    before: dict[str, tuple[float, float, float]] = {}
    by_id = {load.trial_id: load for load in loads}
    taken: dict[tuple[str, int], float] = {}  # device seconds claimed so far, by team and priority
    if not devices or not loads:
        return {}, {}
    for slot in timetable(loads, devices, weights):
        load = by_id[slot.trial_id]
        if slot.trial_id not in first:
            first[slot.trial_id] = slot.start
            others = sum(s for (team, _), s in taken.items() if team != load.team)
            higher = sum(s for (team, p), s in taken.items() if team == load.team and p > load.priority)
            same = sum(s for (team, p), s in taken.items() if team == load.team and p <= load.priority)
            before[slot.trial_id] = (others, higher, same)
        last[slot.trial_id] = slot.end
        key = (load.team, load.priority)
        taken[key] = taken.get(key, 0.0) + slot.end - slot.start
    return {trial_id: Timing(first[trial_id], last[trial_id]) for trial_id in first}, before


def estimate(records: Sequence[TrialRecord], devices: Mapping[str, Mapping[str, str]],
             weights: Mapping[str, float], now: float, max_trials: int = MAX_REPLAY_TRIALS, *,
             waiting: bool = True) -> Estimate:
    """The host's devices with what each runs now, its waiting trials in the order they are expected to run
    with why each waits (none when not `waiting`: a page that shows only ends), and the expected start and end
    (seconds from `now`) of every running or runnable trial replayed: all of them, or the first `max_trials`
    in `scheduling_order` when there are more."""
    serving = devices_serving(devices, now)
    order = scheduling_order(records, weights)
    replayed, left_out = order[:max_trials], order[max_trials:]
    later = {r.trial_id: rank for rank, r in enumerate(left_out)}
    timings, before = replay(loads_of(replayed), serving, weights)
    if not waiting:
        return Estimate(devices=[], waiting=[], timings=timings, replayed=len(replayed), left_out=len(left_out))
    leased = {r.device: r for r in records if r.device and r.state == "planning" and r.admitted}
    leased.update({device: r for r in records if r.state == "running"
                   for device in (r.devices or [r.device]) if device})
    others_wait = any(r.state == "runnable" for r in records)
    rows = [Device(name, _online(info, now), _seen_ago(info, now), leased.get(name),
                   spread(leased[name], others_wait=others_wait) if name in leased and leased[name].state == "running"
                   else "")
            for name, info in sorted(devices.items())]
    rows_waiting = [_waiting(r, timings.get(r.trial_id), before.get(r.trial_id), bool(serving),
                             after=len(replayed) if r.trial_id in later else 0)
                    for r in records if r.state in WAITING_STATES and not (r.state == "planning" and r.admitted)]
    rows_waiting.sort(key=lambda w: (ORDER[w.record.state], w.timing.start_s if w.timing else math.inf,
                                     later.get(w.record.trial_id, -1), _planning_rank(w.reason), w.record.submitted,
                                     w.record.trial_id))
    return Estimate(devices=rows, waiting=rows_waiting, timings=timings, replayed=len(replayed),
                    left_out=len(left_out))


def spread(record: TrialRecord, *, others_wait: bool) -> str:
    """On how many devices the running trial of `record` runs, and why (see the module docstring); `others_wait`:
    some trial of the host is runnable and waits for a device."""
    devices = len(record.devices) or 1
    if devices > 1:
        return f"on {devices} devices: no other trial is waiting"
    trial = record.job.get("trial", {}) if isinstance(record.job, dict) else {}
    if record.width_cap <= 1:
        if trial.get("micro_batches", 1) <= 1:
            return "on one device: one micro-batch a step (with more, a trial may spread over idle devices)"
        return "on one device: its experiment allows one device per trial"
    if record.width <= 1:
        return "on one device: the host's memory holds its state for one micro-batch at a time"
    if others_wait:
        return "on one device: other trials are waiting"
    return "on one device: its next micro-batch cannot start yet"


def _seen_ago(info: Mapping[str, str], now: float) -> float | None:
    seen = _float(info.get("seen"))
    return None if seen is None else max(0.0, now - seen)


def _planning_rank(reason: str) -> int:
    """Admissible trials are planned first; those over their quota or short of memory wait behind them."""
    return {"planning": 0, "quota": 1, "memory": 1}.get(reason, 0)


def _waiting(record: TrialRecord, timing: Timing | None, before: tuple[float, float, float] | None,
             serving: bool, *, after: int = 0) -> Waiting:
    """Why `record` waits; `after`: the number of trials replayed ahead of it when it was left out (else 0)."""
    if record.state == "planning":
        if record.message.startswith(QUOTA_PREFIX):
            return Waiting(record, "quota", record.message)
        if record.message.startswith(MEMORY_PREFIX):
            return Waiting(record, "memory", record.message)
        return Waiting(record, "planning", "Waits for a device to plan it (cut it into shards and make its spill "
                                           "store); its start is estimated once it is planned.")
    if record.state == "paused":
        return Waiting(record, "paused", "Paused by its team: it keeps its place on the host and waits for a "
                                         "resume.")
    if serving and after:
        return Waiting(record, "later", f"Runs after the {after} trials the scheduling rule reaches first: the "
                                        "estimate replays those only, so its start is not estimated.")
    if not serving or timing is None:
        return Waiting(record, "no_device", "No device worker serves this host now: it starts when one does.")
    if timing.start_s <= 0 or before is None:
        return Waiting(record, "next", "Takes a device at the next unit boundary.", timing)
    others, higher, same = before
    if others >= higher + same:
        return Waiting(record, "fair_share", f"Other teams' turn by fair share: their trials take about "
                                             f"{_minutes(others)} of device time before it starts.", timing)
    return Waiting(record, "team_order", f"Its team's higher-priority or longer trials go first (Sharded-LRTF): "
                                         f"about {_minutes(higher + same)} of device time before it starts.", timing)


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
