"""Reads for the lab queue page: the host's queue as a viewer may see it, and the teams' shares of device time.

The queue is the whole host's, every team's, so each trial is shown to the viewer only as much as the viewer
may know: the viewer's own team's trials by experiment name and number, linked; every other trial as
"another team's trial", without its name, experiment, parameters or team.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.conf import settings
from django.core.paginator import Page
from django.db.models import F, FloatField, Sum, Value
from django.db.models.functions import Greatest, Least

from webapp import queue_client
from webapp.accounts.models import Team
from webapp.ground.models import Trial
from webapp.labqueue.estimates import Estimate, Timing, estimate
from webapp.paging import page_get
from webapp.telemetry.models import UnitSpan
from webapp.worker_door import TrialRecord

OTHER_TEAM = "another team's trial"
WINDOWS = (("day", 86400.0), ("week", 7 * 86400.0))


@dataclass(frozen=True)
class TrialRef:
    """A queued trial as the viewer may see it: `trial_pk` and `label` only for the viewer's team's trials."""

    queue_id: str
    own: bool
    label: str
    trial_pk: int | None = None


@dataclass(frozen=True)
class DeviceRow:
    name: str
    online: bool
    seen_s_ago: float | None
    state: str  # what the device does: "running", "planning" or "" (idle)
    trial: TrialRef | None
    end_s: float | None = None  # when its running trial is expected to end, in seconds from now
    spread: str = ""  # on how many devices its running trial runs, and why (`estimates.spread`)


@dataclass(frozen=True)
class WaitingRow:
    position: int
    trial: TrialRef
    state: str
    reason: str
    label: str
    detail: str
    timing: Timing | None


@dataclass(frozen=True)
class LabQueue:
    """The devices, one page of the waiting trials (`waiting`, of `page`), and how much of the queue the
    estimate replayed: `replayed` running or runnable trials, `left_out` more past `MAX_REPLAY_TRIALS`."""

    devices: list[DeviceRow]
    waiting: list[WaitingRow]
    running: int
    page: Page
    replayed: int = 0
    left_out: int = 0


@dataclass(frozen=True)
class Ends:
    """Seconds from now until each running or runnable trial the estimate replayed is expected to end, by
    queue id; `at_least`: the estimate left trials out (`Estimate.ends_at_least`), so each end may come later."""

    seconds: dict[str, float]
    at_least: bool


def host_estimate(*, host_id: str | None = None, now: float | None = None, waiting: bool = True) -> Estimate:
    """The queue of `host_id` (default: this host), estimated (`webapp.labqueue.estimates`; without the
    devices and waiting trials unless `waiting`). Raises SchedulerUnavailable (Redis down)."""
    held = queue_client.host_queue_read(host_id=host_id)
    return estimate(held.trials, held.devices, held.weights, time.time() if now is None else now, waiting=waiting)


def trial_end_estimates(*, host_id: str | None = None, now: float | None = None) -> Ends | None:
    """When each running or runnable trial of `host_id` (default: this host) is expected to end; None when the
    scheduler cannot be reached."""
    try:
        found = host_estimate(host_id=host_id, now=now, waiting=False)
    except queue_client.SchedulerUnavailable:
        return None
    return Ends({trial_id: timing.end_s for trial_id, timing in found.timings.items()}, found.ends_at_least)


def lab_queue(*, team: Team | None, host_id: str | None = None, now: float | None = None,
              page: object = None) -> LabQueue:
    """The devices and the waiting trials of `host_id` (default: this host) as `team`'s member sees them, the
    waiting ones a page at a time (`page`, a query string's value: the first by default). Raises
    SchedulerUnavailable."""
    found = host_estimate(host_id=host_id, now=now)
    shown = page_get(found.waiting, page)
    records = [d.trial for d in found.devices if d.trial is not None] + [w.record for w in shown]
    refs = _refs(records, team)
    devices = [DeviceRow(d.name, d.online, d.seen_s_ago, d.trial.state if d.trial else "",
                         refs[d.trial.trial_id] if d.trial else None,
                         found.end_s(d.trial.trial_id) if d.trial else None, d.spread) for d in found.devices]
    waiting = [WaitingRow(position, refs[w.record.trial_id], w.record.state, w.reason, w.label, w.detail, w.timing)
               for position, w in enumerate(shown, start=shown.start_index())]
    return LabQueue(devices=devices, waiting=waiting, running=sum(1 for d in found.devices if d.trial), page=shown,
                    replayed=found.replayed, left_out=found.left_out)


def _refs(records: list[TrialRecord], team: Team | None) -> dict[str, TrialRef]:
    """Each record's trial as the viewer may see it. A trial is the viewer's only when the web app's own row
    says so (its experiment's team), never from what the queue was told."""
    rows = {}
    if team is not None:
        rows = {t.queue_id: t for t in Trial.objects.filter(
            queue_id__in=[r.trial_id for r in records], experiment__team=team).select_related("experiment")}
    refs = {}
    for record in records:
        trial = rows.get(record.trial_id)
        if trial is None:
            refs[record.trial_id] = TrialRef(record.trial_id, own=False, label=OTHER_TEAM)
        else:
            refs[record.trial_id] = TrialRef(record.trial_id, own=True, trial_pk=trial.pk,
                                             label=f"{trial.experiment.name} #{trial.number}")
    return refs


@dataclass(frozen=True)
class TeamShare:
    """A team's device time on this host over the last day and week (seconds, and as a share of all teams'),
    and the share its weight entitles it to among the teams that used the devices in the week."""

    team_id: int
    name: str
    weight: float
    seconds: dict[str, float]
    share: dict[str, float]
    weight_share: float


def team_shares(*, host: str | None = None, now: float | None = None) -> list[TeamShare]:
    """Every team that ran units on `host` (default: this host) in the last week, with its share of the device
    time of the last day and of the last week (from the stored unit spans, each counted for the part of it
    inside the window), against its weight's share. Sorted by team name."""
    host = host or settings.HYDRA.worker.host_id
    now = time.time() if now is None else now
    seconds: dict[int, dict[str, float]] = {}
    for window, length in WINDOWS:
        since = now - length
        inside = Least(F("end"), Value(now), output_field=FloatField()) - Greatest(
            F("start"), Value(since), output_field=FloatField())
        rows = (UnitSpan.objects.filter(host=host, end__gt=since, start__lt=now)
                .values("trial__experiment__team_id").annotate(seconds=Sum(inside, output_field=FloatField())))
        for row in rows:
            seconds.setdefault(row["trial__experiment__team_id"], {})[window] = max(0.0, row["seconds"] or 0.0)
    teams = {t.pk: t for t in Team.objects.filter(pk__in=seconds)}
    totals = {window: sum(s.get(window, 0.0) for s in seconds.values()) for window, _ in WINDOWS}
    weights = {pk: teams[pk].share_weight for pk in seconds if pk in teams}
    all_weight = sum(weights.values())
    shares = []
    for pk, used in seconds.items():
        if pk not in teams:
            continue
        shares.append(TeamShare(
            team_id=pk, name=teams[pk].name, weight=weights[pk],
            seconds={window: used.get(window, 0.0) for window, _ in WINDOWS},
            share={window: used.get(window, 0.0) / totals[window] if totals[window] else 0.0 for window, _ in WINDOWS},
            weight_share=weights[pk] / all_weight if all_weight else 0.0,
        ))
    return sorted(shares, key=lambda s: s.name)
