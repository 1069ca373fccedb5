"""What the workers report about trials, applied to the web app's records in one place.

`trial_event_apply` is the only writer of a launched trial's status: it mirrors the scheduler's state,
keeps the trial's message, step, best validation loss, measured memory plan and export path, asks TPE for
the next trials when one ends, and asks a finished chat trial's model for its held-out answers. It never
moves a trial out of an ended state (a late report after a cancel is ignored) and ignores reports about an
old attempt or an unknown trial.

`trial_events_sync` reads a host's events stream after the stored cursor and applies each event. The
telemetry ingest calls it on every pass, and the experiment and trial pages call it before reading, so a
trial's status never waits on the ingest process. (The curves poll does not: its curves come from the
ingest anyway.) Concurrent callers take turns on the cursor's row.

No single event can stop the others: each is applied in a savepoint of its own, and one that cannot be applied
(a value the database refuses, a bug on either side) is undone alone, recorded against its trial, which
fails with why (`trial_event_refuse`), and listed on the health page (`SkippedEntry`); the cursor moves past
it and every other trial keeps updating. Only what may pass (Redis or the database out of reach) stops a
batch, which is then read again whole.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from webapp import queue_client
from webapp.experiments.generations import held_out_request
from webapp.experiments.launching import experiment_extend_tpe
from webapp.ground.models import Experiment, Trial
from webapp.health.models import SkippedEntry
from webapp.notifications import notices
from webapp.telemetry.models import StreamCursor
from webapp.telemetry.services import TRANSIENT
from webapp.worker_door import TrialEvent, TrialState

log = logging.getLogger(__name__)
Status = Trial.Status
EVENTS_BATCH = 1000


def trial_event_apply(
    *,
    trial_id: str,
    status: str,
    step: int | None = None,
    remaining_s: float | None = None,
    message: str | None = None,
    best_val_loss: float | None = None,
    plan: dict[str, Any] | None = None,
    export_path: str | None = None,
    rung: int | None = None,
) -> bool:
    """Apply what the scheduler reports about the trial it knows as `trial_id` (its queue id).

    Any subset of fields may be given. ``best_val_loss`` only ever improves (its perplexity is derived);
    ``plan`` replaces the pre-launch estimate with the measured plan; ``rung`` is the pruner's rung where a
    pruned trial stopped; a finished or pruned trial without
    ``export_path`` gets the export directory its launch named, if the model is there. Returns whether
    anything was recorded. When a TPE trial ends, TPE is asked for the next one; when a trial of instruction
    data finishes with its export, its model's answers to held-out examples are asked for (once an attempt).
    """
    if status not in Status.values:
        raise ValueError(f"Unknown trial status {status!r}; use one of {', '.join(Status.values)}.")
    with transaction.atomic():
        trial = Trial.objects.select_for_update().filter(queue_id=trial_id).first()
        if trial is None or (trial.status in Trial.ENDED and status != trial.status):
            return False
        now = timezone.now()
        if status == Status.RUNNING and trial.started is None:
            trial.started = now
        if status in Trial.ENDED and trial.finished is None:
            trial.finished = now
        trial.status = status
        if step is not None:
            trial.step = max(trial.step, step)
        if remaining_s is not None:
            trial.remaining_s = remaining_s
        if message is not None:
            trial.message = message
        if best_val_loss is not None and (trial.best_val_loss is None or best_val_loss < trial.best_val_loss):
            trial.best_val_loss = best_val_loss
            trial.best_val_ppl = math.exp(min(best_val_loss, 700.0))
        if plan is not None:
            trial.plan = plan | {"source": "measured"}
        if rung is not None:
            trial.rung = rung
        if export_path is not None:
            trial.export_path = export_path
        elif status in (Status.FINISHED, Status.PRUNED) and not trial.export_path:
            # The scheduler exports a trial before it reports it finished, into the directory its launch named.
            exported = trial.export_dir_for(trial.queue_id)
            if exported.is_dir():
                trial.export_path = str(exported)
        trial.save()
        if status == Status.FINISHED:
            held_out_request(trial=trial)  # under the trial's lock: a second finished event finds the first's
        if status in Trial.ENDED and trial.experiment.strategy == Experiment.Strategy.TPE:
            experiment_extend_tpe(experiment=trial.experiment)
        notices.trial_ended(trial=trial)  # the team's e-mails and webhooks, sent once this commits
    return True


def trial_events_sync(*, host_id: str | None = None, max_batches: int = 50) -> int:
    """Apply the events of `host_id` (default: this host) not applied yet; returns how many were read.

    Raises redis.RedisError when Redis cannot be reached (the cursor stays where it was).
    """
    host = host_id or settings.HYDRA.worker.host_id
    read = 0
    for _ in range(max_batches):
        with transaction.atomic():
            cursor, _ = StreamCursor.objects.select_for_update().get_or_create(host=host, stream="events")
            events, after = queue_client.events_read(after=cursor.cursor, count=EVENTS_BATCH, host_id=host)
            for event in events:
                _apply_alone(event, host)
            if after != cursor.cursor:
                StreamCursor.objects.filter(pk=cursor.pk).update(cursor=after)
        read += len(events)
        if len(events) < EVENTS_BATCH:
            break
    return read


SCHEDULER_DOWN = ("The scheduler cannot be reached (Redis is down): the statuses shown are the last it reported, "
                  "and no trial trains until it is back.")


def trial_events_sync_quietly(*, host_id: str | None = None) -> bool:
    """`trial_events_sync` for a page about to show statuses: a Redis outage leaves them as they were, and the
    page says so (`SCHEDULER_DOWN`) when this returns False."""
    try:
        trial_events_sync(host_id=host_id)
    except redis.RedisError as error:
        log.warning("trial events not read: %s", error)
        return False
    return True


def _apply_alone(event: TrialEvent, host: str) -> None:
    """Apply `event` in a savepoint; one that cannot be applied is undone alone and refused."""
    try:
        with transaction.atomic():
            _apply(event, host)
    except TRANSIENT:
        raise
    except Exception as error:  # whatever it is, it must not stop the events after it
        log.exception("trial event %s of %s on %s could not be applied", event.entry_id, event.trial_id, host)
        trial_event_refuse(event=event, host=host, error=error)


def trial_event_refuse(*, event: TrialEvent, host: str, error: Exception) -> None:
    """Record that `event` could not be applied: its trial, unless it ended already, fails with a message that
    says which event and why (and the team hears of it as of any failed trial), and the entry is listed on the
    health page."""
    reason = f"{type(error).__name__}: {error}"[:1000]
    message = (f"The scheduler reported this trial {event.state}, and that report could not be recorded ({reason}). "
               f"The trial is marked failed so that every other trial's reports go on. An administrator finds the "
               f"report on the health page (host {host}, events entry {event.entry_id}); retry the trial to run it "
               "again.")
    try:
        with transaction.atomic():
            trial_event_apply(trial_id=event.trial_id, status=Status.FAILED, message=message)
    except TRANSIENT:
        raise
    except Exception:  # the failure's own follow-ups (notices, TPE) failed too: the status alone, then
        log.exception("trial %s could not be failed through its event service", event.trial_id)
        now = timezone.now()
        Trial.objects.filter(queue_id=event.trial_id).exclude(status__in=Trial.ENDED).update(
            status=Status.FAILED, message=message, finished=now, updated=now)
    SkippedEntry.objects.create(host=host, stream="events", entry_id=event.entry_id[:40],
                                trial=event.trial_id[:64], error=f"{event.state}: {reason}")


def _apply(event: TrialEvent, host: str) -> None:
    plan = None
    if event.state == TrialState.RUNNABLE:  # a device planned it: keep the plan it measured
        record = queue_client.trial_record(trial_id=event.trial_id, host_id=host)
        plan = record.plan if record is not None else None
    trial_event_apply(trial_id=event.trial_id, status=event.state, message=event.message or None, plan=plan,
                      step=event.steps_done, rung=event.rung)
