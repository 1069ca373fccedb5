"""Sharded-LRTF: which runnable trial a device that frees up runs next. Pure; Redis only stores and claims.

The rule (`pick`): the trial with the **longest remaining time** (remaining units * its measured unit time)
goes first, because the trial that would finish last bounds the makespan. On a tie, the device prefers the
trial whose last unit it ran (its kept activations, caches and boundary tensors are still warm there); then
the longer remaining time, then the smallest id, so that every device and every test agrees on one order.

A trial in the middle of a micro-batch has its forward's activations kept in the process of the device
that ran the forward: it is *held* by that device (`held_by`) until its backward is through. The holder runs
it before anything else, and other devices pass over it, even when that leaves them idle. On another device
the backward would first recompute the forward (about twice its cost), and a trial runs one unit at a time
anyway, so moving it gains nothing while its holder is there to go on. The longest trial waits at most the
few units left of the holder's micro-batch; near the end, when that matters, micro-batches are what is left.
Without holds, backward units would run on other devices at twice their cost, and with fewer trials than
devices the free devices would race the holder for every unit. A hold lapses ``HOLD_UNITS`` unit
times after the holder's last unit of the trial, so a holder that died does not keep its trial.

Remaining times are estimates (a trial's units differ by phase, a last-shard unit takes about twice a
forward, and the unit time is a smoothed measurement), so trials within ``TIE_TOLERANCE`` (10%) of the
longest remaining time count as tied. Without that tolerance trials would hop devices at nearly every unit,
and a trial that hops loses the activations its forward kept in the other process and runs on cold caches
(`benchmarks/RESULTS.md` has `sharp_scaling.py` with and without it). Near the end, when remaining times
are short, 10% of them is little, and the rule is plain LRTF again.

`timetable` replays the rule on known workloads, the way torchgpipe's ``clock_cycles`` draws its schedule.
Three trials of three 1-second units on two devices (``A1`` is trial A's second unit)::

    clock   0    1    2    3    4
    cpu0    A0   C0   A1   A2   C2
    cpu1    B0   B1   C1   B2   .

At clock 1 C has the most left (3 units) and goes to cpu0; A and B tie at 2 and cpu1 keeps B, which it
just ran. At clock 2 cpu0 claims first: A and C tie at 2, both last ran there, and the id decides (A).
Trials hop (C: cpu0 → cpu1 → cpu0), each device interleaves trials, and the makespan is
5 = ceil(9 units / 2 devices).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

# Weight of the newest measurement in a trial's unit-time estimate: units of one trial differ (forward,
# last shard, backward), so the estimate is smoothed over a few of them rather than the last one.
UNIT_TIME_SMOOTHING = 0.2
# Remaining times within this share of the longest count as tied (see the module docstring).
TIE_TOLERANCE = 0.1
# How long, in the trial's unit times, a hold lasts after the holder's last unit of the trial: long enough to
# outlast the holder's way back to it (a survey and a claim), short enough that a dead holder is soon passed.
HOLD_UNITS = 4.0


@dataclass(frozen=True)
class Candidate:
    """A runnable trial as the policy sees it. `held_by`: the device whose process keeps activations of
    the trial's micro-batch in flight (see the module docstring), if any."""

    trial_id: str
    remaining_s: float
    last_device: str | None = None
    held_by: str | None = None


def order_key(candidate: Candidate, device: str) -> tuple[bool, float, str]:
    """Sort key among tied candidates, smallest first: affinity to `device`, longer remaining time, id."""
    return (candidate.last_device != device, -candidate.remaining_s, candidate.trial_id)


def pick(candidates: Iterable[Candidate], device: str) -> Candidate | None:
    """The candidate `device` should run next, or None when there is none: a trial it holds, else the
    longest of those no other device holds (see the module docstring)."""
    candidates = [c for c in candidates if c.held_by in (None, device)]
    candidates = [c for c in candidates if c.held_by == device] or candidates
    if not candidates:
        return None
    longest = max(c.remaining_s for c in candidates)
    tied = [c for c in candidates if c.remaining_s >= longest * (1.0 - TIE_TOLERANCE)]
    return min(tied, key=lambda c: order_key(c, device))


def remaining_seconds(remaining_units: int, unit_s: float) -> float:
    """A trial's remaining time: what the runnable queue is scored by."""
    return remaining_units * unit_s


def unit_time_estimate(previous_s: float, measured_s: float) -> float:
    """Fold a measured unit time into a trial's estimate (first estimated by profiling)."""
    return (1.0 - UNIT_TIME_SMOOTHING) * previous_s + UNIT_TIME_SMOOTHING * measured_s


@dataclass(frozen=True)
class TrialLoad:
    """A trial for `timetable`: `units` units of `unit_s` seconds each."""

    trial_id: str
    units: int
    unit_s: float


@dataclass(frozen=True)
class Slot:
    """Unit number `unit` of `trial_id` runs on `device` from `start` to `end`."""

    device: str
    trial_id: str
    unit: int
    start: float
    end: float


def timetable(trials: Sequence[TrialLoad], devices: Sequence[str]) -> Iterator[Slot]:
    """Replay Sharded-LRTF on `devices` for `trials`, yielding slots in the order devices claim them.

    A device frees up at the end of its unit; devices free at the same moment claim in `devices` order. A
    trial has at most one unit in flight; a device that finds nothing runnable waits for the next unit
    to end. Remaining time is exact here (units * unit_s), as it becomes in a running system.
    """
    if not devices:
        raise ValueError("timetable needs at least one device; got none.")
    left = {t.trial_id: t.units for t in trials}
    unit_s = {t.trial_id: t.unit_s for t in trials}
    done = {t.trial_id: 0 for t in trials}
    busy_until: dict[str, float] = {}  # trial id -> end of its unit in flight
    last_device: dict[str, str] = {}
    free = [(0.0, rank) for rank in range(len(devices))]  # (free at, device rank)
    heapq.heapify(free)
    while any(left.values()):
        now, rank = heapq.heappop(free)
        device = devices[rank]
        runnable = [
            Candidate(trial_id, remaining_seconds(units, unit_s[trial_id]), last_device.get(trial_id))
            for trial_id, units in left.items()
            if units > 0 and busy_until.get(trial_id, 0.0) <= now
        ]
        chosen = pick(runnable, device)
        if chosen is None:
            heapq.heappush(free, (min(end for end in busy_until.values() if end > now), rank))
            continue
        trial_id = chosen.trial_id
        end = now + unit_s[trial_id]
        yield Slot(device, trial_id, done[trial_id], now, end)
        left[trial_id] -= 1
        done[trial_id] += 1
        busy_until[trial_id] = end
        last_device[trial_id] = device
        heapq.heappush(free, (end, rank))
