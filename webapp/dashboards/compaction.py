"""Compact old telemetry to what the dashboards draw of it, so that the database grows with the number of trials
and experiments, not with the number of steps, units and device samples ever measured. It lives with the
dashboards because what it keeps is decided by what their selectors read (`webapp.dashboards.selectors`).

Telemetry older than the age (``HYDRA_TELEMETRY_KEEP_DAYS``) keeps:

- Step metrics of a trial that ended before then: the rows of the level of detail its learning curve is read
  at (`selectors.curve_level` of its step count) and of every coarser level, which include its first, last
  and lowest-loss step. Rows of an attempt that a retry replaced are drawn nowhere and go.
- Evaluations: every one.
- Unit spans of such a trial: those among its experiment's newest `SPAN_LIMIT` (what the timeline draws),
  its earliest (where its run window and the timeline's origin begin) and one per device it ran on (whose
  samples the devices page shows).
- Device samples: per device, those that the devices page of an experiment draws, the lowest and highest
  utilization and memory of each time bucket of its run windows (`selectors.sample_thin`). Samples outside
  every experiment's run windows are drawn nowhere and go.

So every page draws the same after a compaction as before. A trial that runs, or ended within the age, is
never touched, nor are the samples of an experiment that has one from its first run window on: its pages
still redraw every window at a resolution that changes as it goes on.

Each DELETE removes at most `BATCH_SIZE` rows, in a transaction of its own, so the ingest writing meanwhile
never waits long. A pass is idempotent: a trial's current attempt is marked once compacted (`CompactedTrial`)
and a device's samples are compacted up to a time that only moves forward (`SampleLane`); a pass cut short
by its time budget, or run twice at once, deletes nothing that the other would keep, because what is kept
is the same whichever rows not kept are gone already (`downsample.minmax`).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Exists, Min, OuterRef, Q, QuerySet

from webapp.dashboards import selectors
from webapp.ground.models import Experiment, Trial
from webapp.telemetry.models import CompactedTrial, DeviceSample, SampleLane, StepMetric, UnitSpan

BATCH_SIZE = 5000  # rows per DELETE
TRIAL_PAGE = 100  # trials read per query
SAMPLE_CHUNK_S = 6 * 3600.0  # a device's samples are compacted this much time at a time (21,600 at one a second)
EVERY_S = 600.0  # how often the ingest loop compacts once nothing is left to do
BUDGET_S = 2.0  # the most one pass of the ingest loop spends compacting
BACKLOG_GAP_S = 10.0  # between compactions while there is more to do: the ingest keeps most of its time


@dataclass
class Compaction:
    """What a compaction removed (or, in a dry run, would remove)."""

    trials: int = 0  # trials whose telemetry was compacted
    steps: int = 0
    spans: int = 0
    samples: int = 0
    done: bool = True  # False: the time budget ran out with more to do

    def __str__(self) -> str:
        more = "" if self.done else " (more to do)"
        return (f"{self.trials} trials compacted: {self.steps} step metrics, {self.spans} unit spans and "
                f"{self.samples} device samples removed{more}")


def telemetry_compact(*, older_than: datetime.timedelta, dry_run: bool = False, budget_s: float | None = None,
                      now: float | None = None) -> Compaction:
    """Compact the telemetry older than `older_than` (see the module's description); return what went.

    With `dry_run`, count what would go and change nothing. With `budget_s`, stop between two batches once
    that many seconds have passed (``done`` is then False); the next call goes on where this one stopped.
    """
    now = time.time() if now is None else now
    cutoff = now - older_than.total_seconds()
    deadline = None if budget_s is None else time.monotonic() + budget_s
    result = Compaction()

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    result.done = (_compact_trials(_datetime(cutoff), result, dry_run, out_of_time)
                   and _compact_samples(cutoff, result, dry_run, out_of_time))
    return result


class Schedule:
    """When the ingest loop compacts: at its first pass, then `every_s` after a compaction that left nothing to
    do, or `backlog_gap_s` after one that ran out of its `budget_s`. Nothing while the age is off."""

    def __init__(self, *, every_s: float = EVERY_S, budget_s: float = BUDGET_S, backlog_gap_s: float = BACKLOG_GAP_S,
                 clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self.budget_s = budget_s
        self.backlog_gap_s = backlog_gap_s
        self.clock = clock
        self.next_at = clock()

    def run_if_due(self) -> Compaction | None:
        days = settings.HYDRA.telemetry_keep_days
        if days is None or self.clock() < self.next_at:
            return None
        result = telemetry_compact(older_than=datetime.timedelta(days=days), budget_s=self.budget_s)
        self.next_at = self.clock() + (self.every_s if result.done else self.backlog_gap_s)
        return result


def _datetime(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)


def _remove(rows: QuerySet, dry_run: bool, out_of_time: Callable[[], bool]) -> tuple[int, bool]:
    """Delete `rows` `BATCH_SIZE` at a time; return how many went and whether all did."""
    if dry_run:
        return rows.count(), True
    removed = 0
    while not out_of_time():
        ids = list(rows.order_by().values_list("pk", flat=True)[:BATCH_SIZE])
        if not ids:
            return removed, True
        removed += rows.model.objects.filter(pk__in=ids).delete()[0]
    return removed, False


def _compact_trials(cutoff: datetime.datetime, result: Compaction, dry_run: bool,
                    out_of_time: Callable[[], bool]) -> bool:
    """Compact the steps and spans of every trial that ended before `cutoff` and is not compacted yet."""
    compacted = CompactedTrial.objects.filter(trial=OuterRef("pk"), attempt=OuterRef("attempt"))
    pending = (Trial.objects.filter(status__in=Trial.ENDED, finished__lt=cutoff).exclude(Exists(compacted))
               .order_by("finished", "pk").only("pk", "experiment_id", "attempt", "step", "finished"))
    after: Trial | None = None
    while True:
        page = pending if after is None else pending.filter(
            Q(finished__gt=after.finished) | Q(finished=after.finished, pk__gt=after.pk))
        trials = list(page[:TRIAL_PAGE])
        if not trials:
            return True
        for trial in trials:
            steps, steps_done = _remove(_steps_not_drawn(trial), dry_run, out_of_time)
            result.steps += steps
            spans, spans_done = (0, False) if not steps_done else _remove(_spans_not_drawn(trial), dry_run,
                                                                          out_of_time)
            result.spans += spans
            if not spans_done:
                return False
            if not dry_run:
                CompactedTrial.objects.update_or_create(trial_id=trial.pk, defaults={"attempt": trial.attempt})
            result.trials += 1
        after = trials[-1]


def _steps_not_drawn(trial: Trial) -> QuerySet[StepMetric]:
    """Rows below the level its curve is read at, and rows of earlier attempts (attempts only grow: a retry
    starting meanwhile writes above `trial.attempt`)."""
    level = selectors.curve_level(trial.step)
    return StepMetric.objects.filter(Q(attempt__lt=trial.attempt) | Q(attempt=trial.attempt, level__lt=level),
                                     trial_id=trial.pk)


def _spans_not_drawn(trial: Trial) -> QuerySet[UnitSpan]:
    """Its spans older than its experiment's newest `SPAN_LIMIT`, but for its earliest and one per device.

    The timeline draws an experiment's newest spans, and spans only come newer, so one below that line now
    is never drawn again."""
    newest = (UnitSpan.objects.filter(trial__experiment_id=trial.experiment_id).order_by("-pk")
              .values_list("pk", flat=True)[selectors.SPAN_LIMIT - 1:selectors.SPAN_LIMIT])
    line = newest.first()
    mine = UnitSpan.objects.filter(trial_id=trial.pk)
    if line is None:
        return mine.none()
    earliest = mine.order_by("start", "pk").values_list("pk", flat=True)[:1]
    per_device = mine.values("host", "device").annotate(first=Min("pk")).values_list("first", flat=True)
    keep = {*earliest, *per_device}
    return mine.filter(pk__lt=line).exclude(pk__in=keep)


def _compact_samples(cutoff: float, result: Compaction, dry_run: bool, out_of_time: Callable[[], bool]) -> bool:
    """Compact each device's samples older than `cutoff`, a `SAMPLE_CHUNK_S` of time at a time."""
    for lane in SampleLane.objects.filter(compacted_before__lt=cutoff).order_by("pk"):
        samples = DeviceSample.objects.filter(host=lane.host, device=lane.device)
        start = lane.compacted_before
        while True:
            if out_of_time():
                return False
            first = samples.filter(time__gte=start).order_by("time").values_list("time", flat=True).first()
            if first is None or first >= cutoff:
                break
            end = _compactable_until(lane, first, min(first + SAMPLE_CHUNK_S, cutoff), cutoff)
            if end <= first:
                break  # an experiment that still runs draws these samples
            keep = _samples_drawn(lane, first, end)
            doomed = samples.filter(time__gte=first, time__lt=end).exclude(pk__in=keep)
            removed, done = _remove(doomed, dry_run, out_of_time)
            result.samples += removed
            if not done:
                return False
            if not dry_run:
                SampleLane.objects.filter(pk=lane.pk, compacted_before__lt=end).update(compacted_before=end)
            start = end
    return True


def _experiments_on(lane: SampleLane, start: float, end: float) -> Iterable[tuple[Experiment, list]]:
    """The experiments that ran a unit on the lane's device and may have run between `start` and `end`,
    with their trials (`selectors.TrialInfo`)."""
    ran = Trial.objects.filter(created__lt=_datetime(end)).filter(
        Q(finished__isnull=True) | Q(finished__gte=_datetime(start))).exclude(status=Trial.Status.NEW)
    on_lane = UnitSpan.objects.filter(trial__experiment=OuterRef("pk"), host=lane.host, device=lane.device)
    experiments = Experiment.objects.filter(pk__in=ran.values("experiment_id")).filter(Exists(on_lane))
    for experiment in experiments.order_by("pk"):
        yield experiment, selectors.experiment_trials(experiments=[experiment])


def _compactable_until(lane: SampleLane, start: float, end: float, cutoff: float) -> float:
    """`end`, or earlier where the first run window of an experiment on the lane that is not compactable
    begins (one whose trial runs, or ended since `cutoff`: its page draws all its windows)."""
    for _, trials in _experiments_on(lane, start, end):
        if any(t.status in Trial.ACTIVE or (t.status in Trial.ENDED and (t.finished is None or t.finished >= cutoff))
               for t in trials):
            windows = [w for w in selectors.run_windows(trials) if w[1] is None or w[1] >= start]
            if windows:
                end = min(end, max(windows[0][0], start))
    return end


def _samples_drawn(lane: SampleLane, start: float, end: float) -> set[int]:
    """Ids of the lane's samples from `start` to `end` that an experiment's devices page draws.

    Within the range, per experiment, each time bucket's extremes of the samples in the range: every sample
    drawn is among them (a bucket's extreme is also the extreme of its part in the range, and the first and
    last of the whole series are the first and last of their range)."""
    keep: set[int] = set()
    for experiment, trials in _experiments_on(lane, start, end):
        windows = selectors.run_windows(trials)
        if not windows:
            continue
        since = selectors.experiment_origin(experiment=experiment, trials=trials) or 0.0
        rows = list(selectors.sample_rows([(lane.host, lane.device)], since, windows)
                    .filter(time__gte=start, time__lt=end).values_list("pk", "time", "utilization", "memory_used"))
        drawn = selectors.sample_thin([r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], windows)
        keep.update(rows[i][0] for i in drawn)
    return keep
