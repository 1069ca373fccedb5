"""Sharded-LRTF: which runnable trial a device that frees up runs next. Pure; Redis only stores and claims.

Between teams, fair share decides first (`worker.scheduling.fair_share`): the device takes a trial of the
team whose turn it is, and inside it one of the highest priority. Among those, the rule (`pick`): the trial
with the **longest remaining time** (remaining units * its measured unit time) goes first, because the
trial that would finish last bounds the makespan. On a tie, the device prefers a
trial it has *affinity* with: one whose next unit reads frozen base layers the device already holds (a LoRA
trial on the shared base of the trial it just ran, see `worker.engine.shared_base`: the unit skips the base
shard's read, by far its largest), else one whose last unit it ran (its kept activations, caches and
boundary tensors are still warm there); then the longer remaining time, then the smallest id, so that every
device and every test agrees on one order.

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

A trial on several devices (a wavefront): the micro-batches of one of its steps may run at once, micro-batch m's
unit at a place of its chain after m - 1's unit at that place (`worker.engine.schedule.Segment`). A device takes
a second (third, ...) unit of a trial that has one in flight only when no trial without a unit in flight can
run on it (a *widening* candidate comes after every other), and never more than the trial's micro-batches or
its width (`TrialLoad.width`: what its experiment and the host's memory allow). So a lone trial of 2
micro-batches of 3 units each, on two devices (``A3`` is its unit of index 3, micro-batch 1's first)::

    clock   0    1    2    3    4
    cpu0    A0   A1   A2   A5   .
    cpu1    .    A3   A4   .    .

and when trial B arrives at clock 1, the device that frees up then takes B's unit rather than A's second lane::

    clock   0    1    2    3    4    5
    cpu0    A0   A1   A2   A3   A4   A5
    cpu1    .    B0   B1   B2   .    .

Base affinity on one device: A and C are LoRA trials on base X, each with two shards (units read X0, X1, X0:
the first shard's forward, the last shard's forward and backward, the first shard's backward); B trains a
whole model and reads no base. ``*`` marks a unit that found its base layers held::

    clock   0    1    2    3    4    5    6    7    8
    cpu0    A0   C0*  B0   A1   C1*  B1   A2   C2*  B2
    base    X0   X0   .    X1   X1   .    X0   X0   .

At clock 1 B and C tie (3 units left; A has 2): C's next unit reads X0, which A0 just loaded, so C goes first
(by id alone B would). B's unit frees the base layers (a device keeps only the base of the unit it just ran,
as the memory plan counts it), so at clock 3 the three trials tie with nothing held and the id decides.
Three base reads in six LoRA units; without the affinity every one of the six reads.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from worker.engine.schedule import Segment
from worker.scheduling.fair_share import PRIORITIES, arrival_usage, team_turn

# Weight of the newest measurement in a trial's unit-time estimate: units of one trial differ (forward,
# last shard, backward), so the estimate is smoothed over a few of them rather than the last one.
UNIT_TIME_SMOOTHING = 0.2
# Remaining times within this share of the longest count as tied (see the module docstring).
TIE_TOLERANCE = 0.1
# How long, in the trial's unit times, a hold lasts after the holder's last unit of the trial: long enough to
# outlast the holder's way back to it (a survey and a claim), short enough that a dead holder is soon passed.
HOLD_UNITS = 4.0


@dataclass(frozen=True, order=True)
class BaseShard:
    """Layers ``[first, stop)`` of the shared frozen base ``key``: what a LoRA unit reads besides its own
    state, and what a device holds after running one. Written ``key:first:stop`` in the queue."""

    key: str
    first: int
    stop: int

    def overlaps(self, other: BaseShard | None) -> bool:
        return other is not None and other.key == self.key and self.first < other.stop and other.first < self.stop

    def __str__(self) -> str:
        return f"{self.key}:{self.first}:{self.stop}"

    @classmethod
    def parse(cls, text: str) -> BaseShard | None:
        """The shard written by ``str``, or None for ''."""
        if not text:
            return None
        key, first, stop = text.rsplit(":", 2)
        return cls(key, int(first), int(stop))


@dataclass(frozen=True)
class Candidate:
    """A runnable trial as the policy sees it. `held_by`: the device whose process keeps activations of
    the trial's micro-batch in flight (see the module docstring), if any. `next_base`: the shared base
    layers its next unit reads (None without LoRA, or before its first unit). `widening`: the trial runs on
    other devices already and may take this one too (a lane of its wavefront is free)."""

    trial_id: str
    remaining_s: float
    last_device: str | None = None
    held_by: str | None = None
    next_base: BaseShard | None = None
    team: str = ""
    priority: int = PRIORITIES["normal"]
    widening: bool = False


@dataclass(frozen=True)
class Shares:
    """What fair share goes by (see `fair_share`): each team's decayed usage in device seconds, its weight
    (1 when absent) and when its last unit was leased."""

    usage: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)


def order_key(candidate: Candidate, device: str, holding: BaseShard | None = None) -> tuple[bool, bool, float, str]:
    """Sort key among tied candidates, smallest first: affinity to `device` (its base layers held there, or
    its last unit run there), the base layers held, longer remaining time, id."""
    reads_held = candidate.next_base is not None and candidate.next_base.overlaps(holding)
    return (not reads_held and candidate.last_device != device, not reads_held, -candidate.remaining_s,
            candidate.trial_id)


def pick(candidates: Iterable[Candidate], device: str, holding: BaseShard | None = None,
         shares: Shares | None = None) -> Candidate | None:
    """The candidate `device` should run next, or None when there is none: a trial it holds, else, of
    those no other device holds and that run nowhere (then, only when there is none, of those that run on other
    devices and may take this one too: `widening`), one of the team whose turn it is (by `shares`; all teams as
    one without them) and of the highest priority there, the longest (see the module docstring). `holding`:
    the shared base layers the device holds now (those its last unit read)."""
    candidates = list(candidates)
    held = [c for c in candidates if c.held_by == device]
    if held:
        return _longest(held, device, holding)
    for pool in ([c for c in candidates if not c.widening and c.held_by is None],
                 [c for c in candidates if c.widening]):
        if pool:
            if shares is not None:
                team = team_turn({c.team for c in pool}, shares.usage, shares.weights, shares.served)
                pool = [c for c in pool if c.team == team]
            return _longest(pool, device, holding)
    return None


def _longest(candidates: list[Candidate], device: str, holding: BaseShard | None) -> Candidate:
    """Of `candidates` (one team's, or the held ones), the longest of the highest priority (ties: order_key)."""
    top = max(c.priority for c in candidates)
    candidates = [c for c in candidates if c.priority == top]
    longest = max(c.remaining_s for c in candidates)
    tied = [c for c in candidates if c.remaining_s >= longest * (1.0 - TIE_TOLERANCE)]
    return min(tied, key=lambda c: order_key(c, device, holding))


def ranked(candidates: Iterable[Candidate], device: str, holding: BaseShard | None = None,
           shares: Shares | None = None, *, limit: int = 3) -> list[Candidate]:
    """`pick`'s first `limit` choices: what it picks, then what it would pick without that one, and so on.
    A device claims the first of them still runnable (another device may have taken the first)."""
    left = list(candidates)
    order: list[Candidate] = []
    while len(order) < limit and (choice := pick(left, device, holding, shares)) is not None:
        order.append(choice)
        left.remove(choice)
    return order


def remaining_seconds(remaining_units: int, unit_s: float) -> float:
    """A trial's remaining time: what the runnable queue is scored by."""
    return remaining_units * unit_s


def unit_time_estimate(previous_s: float, measured_s: float) -> float:
    """Fold a measured unit time into a trial's estimate (first estimated by profiling)."""
    return (1.0 - UNIT_TIME_SMOOTHING) * previous_s + UNIT_TIME_SMOOTHING * measured_s


@dataclass(frozen=True)
class TrialLoad:
    """A trial for `timetable`: `units` units of `unit_s` seconds each; unit i reads the shared base layers
    ``bases[i % len(bases)]`` (none when `bases` is empty). `segments`: its units as runs of ``(lanes, length)``
    lanes of chains (the micro-batches of a step, see `worker.engine.schedule.Segment`), or ``(lanes, 1, True)``
    for a gathered step (a model of one shard), whose lanes may run on several devices at once (``(lanes, 1, True,
    lead, tail)``: with the segment's ``lead`` and ``tail``, else both); none: one lane of `units`. `width`: the
    most devices it may run on at once (0: as many as a segment has lanes)."""

    trial_id: str
    units: int
    unit_s: float
    bases: tuple[BaseShard | None, ...] = ()
    team: str = ""
    priority: int = PRIORITIES["normal"]
    arrival: float = 0.0  # when the trial is submitted
    segments: tuple[tuple[int, int] | tuple[int, int, bool] | tuple[int, int, bool, bool, bool], ...] = ()
    width: int = 0

    def base(self, unit: int) -> BaseShard | None:
        return self.bases[unit % len(self.bases)] if self.bases and unit < self.units else None

    def lanes(self) -> list[Segment]:
        """Its segments, as the engine's timetable has them."""
        out, start = [], 0
        for lanes, length, *gathered in self.segments or ((1, self.units),):
            gathered_, lead, tail = (*gathered, True, True)[:3] if gathered else (False, True, True)
            out.append(Segment(start=start, lanes=lanes, length=length, gathered=bool(gathered_), lead=lead,
                               tail=tail))
            start += lanes * length
        assert start == self.units, f"the segments of {self.trial_id} hold {start} units, not {self.units}"
        return out


@dataclass(frozen=True)
class Slot:
    """Unit number `unit` of `trial_id` (of its lane `lane`) runs on `device` from `start` to `end`; `base_held`:
    it reads shared base layers that the device held already."""

    device: str
    trial_id: str
    unit: int
    start: float
    end: float
    base_held: bool = False
    lane: int = 0


@dataclass
class _Progress:
    """A trial's units in `timetable`: committed ones, and those in flight with their end."""

    load: TrialLoad
    committed: set[int] = field(default_factory=set)
    flying: dict[int, float] = field(default_factory=dict)  # unit -> when it ends

    def settle(self, now: float) -> None:
        for unit, end in list(self.flying.items()):
            if end <= now:
                self.committed.add(unit)
                del self.flying[unit]

    @property
    def left(self) -> int:
        return self.load.units - len(self.committed) - len(self.flying)

    def ready(self) -> list[tuple[int, int]]:
        """(lane, unit) of each lane whose next unit can run now and is not in flight, most urgent first: the
        engine's rules (``Segment.needs``, ``Segment.urgency``, the order in which it reports its ready lanes)."""
        cursor = next((u for u in range(self.load.units) if u not in self.committed), self.load.units)
        segment = next((s for s in self.load.lanes() if s.start <= cursor < s.stop), None)
        if segment is None:
            return []
        out = []
        for lane in range(segment.lanes):
            first = segment.index(lane, 0)
            unit = next((u for u in range(first, first + segment.length) if u not in self.committed), None)
            if unit is None or unit in self.flying:
                continue
            if all(n in self.committed for n in segment.needs(unit)):
                out.append((lane, unit))
        return sorted(out, key=lambda item: segment.urgency(item[1]))

def timetable(trials: Sequence[TrialLoad], devices: Sequence[str],
              weights: Mapping[str, float] | None = None) -> Iterator[Slot]:
    """Replay Sharded-LRTF on `devices` for `trials`, yielding slots in the order devices claim them.

    A device frees up at the end of its unit; devices free at the same moment claim in `devices` order. A trial runs
    one unit at a time, or, when no trial without a unit in flight can run on a device, one more of a lane of its
    wavefront (up to its width; see `TrialLoad.segments`); a device that finds nothing runnable waits for the next
    unit to end. A unit's lane is the most urgent that can run (see `_Progress.ready`). Remaining time is exact here
    (units left * unit_s), as it becomes in a running system. A device holds the base layers its last unit read
    (none after a unit that reads none). With `weights`, teams share the devices by fair share (`fair_share`,
    without decay): a unit's time is charged to its team when it is leased; a team arrives when it has a trial
    runnable or running again after having none.
    """
    if not devices:
        raise ValueError("timetable needs at least one device; got none.")
    progress = {t.trial_id: _Progress(t) for t in trials}
    last_device: dict[str, str] = {}
    holding: dict[str, BaseShard | None] = {}
    shares = Shares(weights=dict(weights)) if weights is not None else None
    active: set[str] = set()  # teams with a trial runnable or running
    free = [(0.0, rank) for rank in range(len(devices))]  # (free at, device rank)
    heapq.heapify(free)
    while any(p.left for p in progress.values()):
        now, rank = heapq.heappop(free)
        device = devices[rank]
        for p in progress.values():
            p.settle(now)
        if shares is not None:
            _arrive(progress.values(), now, active, shares)
        runnable = []
        for trial_id, p in progress.items():
            load = p.load
            ready = p.ready() if load.arrival <= now else []
            width = load.width or max(segment.lanes for segment in load.lanes())
            if not ready or (p.flying and len(p.flying) >= width):
                continue
            runnable.append(Candidate(trial_id, remaining_seconds(p.left, load.unit_s), last_device.get(trial_id),
                                      next_base=load.base(ready[0][1]), team=load.team, priority=load.priority,
                                      widening=bool(p.flying)))
        chosen = pick(runnable, device, holding.get(device), shares)
        if chosen is None:
            later = [end for p in progress.values() for end in p.flying.values() if end > now]
            later += [t.arrival for t in trials if t.arrival > now]
            heapq.heappush(free, (min(later), rank))
            continue
        p = progress[chosen.trial_id]
        if shares is not None:
            shares.usage[chosen.team] = shares.usage.get(chosen.team, 0.0) + p.load.unit_s
            shares.served[chosen.team] = now
        lane, unit = p.ready()[0]
        end = now + p.load.unit_s
        base = chosen.next_base
        held = base is not None and base.overlaps(holding.get(device))
        yield Slot(device, chosen.trial_id, unit, now, end, base_held=held, lane=lane)
        holding[device] = base
        p.flying[unit] = end
        last_device[chosen.trial_id] = device
        heapq.heappush(free, (end, rank))


def _arrive(progress: Iterable[_Progress], now: float, active: set[str], shares: Shares) -> None:
    """Update the teams with work at `now` for `timetable`: an arriving team starts at `arrival_usage`."""
    with_work = {p.load.team for p in progress if (p.left > 0 and p.load.arrival <= now) or p.flying}
    for team in sorted(with_work - active):
        shares.usage[team] = arrival_usage(team, shares.usage, shares.weights, active)
    active.intersection_update(with_work)
    active.update(with_work)
