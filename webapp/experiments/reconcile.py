"""Bringing the trials' rows and the scheduler's queue back in line after a crash on either side.

The database says what should run; the queue (Redis) says what does; each host's spill stores hold the
trials' state. They part ways when a process dies between two writes, when Redis is down, or when Redis
loses its data (emptied, or restarted from an append-only file a second behind). `trials_reconcile`
repairs all of it, in one pass that may run any number of times, alongside launches, controls and deletes:

- every launched trial still to submit is sent (`launching.trial_send`: a repeat of a send that landed is
  one submission);
- every trial the queue would still run that no row names as an attempt that may run (its row is gone:
  deleted while Redis was down; or it was cancelled or failed meanwhile) is cancelled, and the device that
  reaps it frees its spill store;
- every submitted trial that may run (planning, runnable, running, paused) but that the queue does not hold
  is submitted again to resume (`EngineJob.resume`): the device that plans it takes up its spill store at the
  last committed unit, exactly as after a killed worker; with its store gone, from its last checkpoint, or it
  fails with the reason and the page offers to retry it. Its row shows planning, with why, from this pass on;
  a paused one is paused again;
- every row that may run whose attempt the queue says ended takes that end (its event was lost with Redis).

Stores live on the worker hosts, which this process cannot see: whether a store exists is the planning
device's to find. The one reconciler is the telemetry ingest (``manage.py hydra_ingest``, one per web app),
which runs a pass for this web app's host after each of its own, every second: a trial no queue holds is
never shown running for longer than that. Every trial in the queue of that host is one of its trials'
attempts.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from webapp import queue_client
from webapp.accounts.models import Team
from webapp.experiments.events import trial_event_apply, trial_events_sync
from webapp.experiments.launching import trial_send, trial_sent_job
from webapp.ground.models import Trial
from webapp.health.models import HostCapacity
from webapp.worker_door import ENDED, Control, TrialState

log = logging.getLogger(__name__)
Status = Trial.Status
LOST = ("The scheduler lost this trial (Redis lost its data); it was sent again and resumes where its state was "
        "last saved.")
# A row in one of these states names an attempt that must not run: the queue's copy is cancelled.
STOPPED = (Status.CANCELLED, Status.FAILED)


class Reconciled(NamedTuple):
    submitted: list[str]  # queue ids of the trials this pass sent
    cancelled: list[str]  # queue ids of the attempts without a row that may run it, asked to stop
    resubmitted: list[str] = []  # queue ids of the trials the queue lost, sent again to resume
    ended: list[str] = []  # queue ids of the rows that took the end the queue recorded


def trials_reconcile(*, host_id: str | None = None) -> Reconciled:
    """One pass over the queue of `host_id` (default: this web app's own host): cancel what no row may run,
    resubmit what the queue lost, and end the rows whose attempt ended; on the own host's pass, also submit
    what is to submit (placing each trial on a host).

    Raises redis.RedisError or queue_client.SchedulerUnavailable when Redis cannot be reached; what was done
    before stays done, and the next pass does the rest.
    """
    host = host_id or settings.HYDRA.worker.host_id
    # The queue is read before the rows: an attempt is submitted only after its row committed, so every
    # attempt read here that has a row has it by the time the rows are read.
    states = queue_client.trial_states(host_id=host)
    # Redis may have lost what administrators set with the rest: it is sent again at every pass.
    queue_client.team_limits_send(*Team.limits(), host_id=host)
    queue_client.host_capacity_send(host_id=host, capacity_bytes=HostCapacity.bytes_for(host))
    cancelled = _orphans_cancel(states, host)
    resubmitted, ended = _lost_resubmit(states, host)
    submitted = []
    if host == settings.HYDRA.worker.host_id:
        waiting = Trial.objects.filter(status=Status.PLANNING, submitted=False).order_by("pk")
        submitted = [queue_id for queue_id in waiting.values_list("queue_id", flat=True)
                     if trial_send(queue_id=queue_id)]
    return Reconciled(submitted=submitted, cancelled=cancelled, resubmitted=resubmitted, ended=ended)


def trial_hosts() -> set[str]:
    """The hosts that hold an active trial of this database: reconciled even when Redis lost the registry of
    hosts with the rest (their trials are sent again to their host, whose workers register it again when
    they restart)."""
    return set(Trial.objects.filter(status__in=Trial.ACTIVE).exclude(host="").values_list("host", flat=True)
               .distinct())


def _on_host(host: str) -> Q:
    """The rows whose attempt `host`'s queue holds (a row without a host is the web app's own host's)."""
    return Q(host=host) | Q(host="") if host == settings.HYDRA.worker.host_id else Q(host=host)


def _orphans_cancel(states: dict[str, TrialState], host: str) -> list[str]:
    live = [trial_id for trial_id, state in states.items() if state not in ENDED]
    may_run = set(Trial.objects.filter(queue_id__in=live).exclude(status__in=STOPPED)
                  .values_list("queue_id", flat=True))
    cancelled = []
    for trial_id in live:
        if trial_id in may_run:
            continue
        try:
            queue_client.trial_control(trial_id=trial_id, control=Control.CANCEL, host_id=host)
        except queue_client.SchedulerUnavailable:
            raise
        except queue_client.SchedulerError as error:  # it ended meanwhile: nothing left to stop
            log.info("trial %s on host %s not cancelled: %s", trial_id, host, error)
            continue
        log.warning("cancelled trial %s: the scheduler ran it, but no trial record may run it", trial_id)
        cancelled.append(trial_id)
    return cancelled


def _lost_resubmit(states: dict[str, TrialState], host: str) -> tuple[list[str], list[str]]:
    """Resubmit the submitted trials of `host` that may run and that its queue does not hold; end those whose
    attempt the queue says ended."""
    rows = (Trial.objects.filter(_on_host(host), status__in=Trial.ACTIVE, submitted=True).order_by("pk")
            .values_list("queue_id", "status"))
    resubmitted, ending = [], []
    for queue_id, status in rows:
        state = states.get(queue_id)
        if state is None:
            if _resubmit(queue_id, host):
                resubmitted.append(queue_id)
        elif state in ENDED:
            ending.append((queue_id, status))
    if not ending:
        return resubmitted, []
    # The queue writes a trial's end and its event in one step, so an end read above whose event is still in
    # the events stream (the trial ended after the ingest's last read) is applied from it now, with the steps
    # it took; only the rows still active after that lost their event, and take the end from the queue.
    trial_events_sync(host_id=host)
    still_active = set(Trial.objects.filter(queue_id__in=[queue_id for queue_id, _ in ending],
                                            status__in=Trial.ACTIVE).values_list("queue_id", flat=True))
    return resubmitted, [queue_id for queue_id, status in ending
                         if queue_id in still_active and _end(queue_id, status, host)]


def _resubmit(queue_id: str, host: str) -> bool:
    """Send the attempt `queue_id` again to resume, under its row's lock, unless it stopped, or the queue
    holds it after all (a launch's send landed after this pass read the queue)."""
    with transaction.atomic():
        trial = (Trial.objects.select_for_update(of=("self",)).select_related("experiment")
                 .filter(queue_id=queue_id, status__in=Trial.ACTIVE, submitted=True).first())
        if trial is None or queue_client.trial_record(trial_id=queue_id, host_id=host) is not None:
            return False
        # A trial that never left planning made no state worth finding: it is planned afresh.
        resume = trial.status != Status.PLANNING or trial.step > 0
        job = trial_sent_job(trial=trial, resume=resume)
        try:
            queue_client.trial_submit(trial_id=queue_id, job=job, export_dir=str(trial.export_dir_for(queue_id)),
                                      team=str(trial.experiment.team_id), priority=trial.experiment.priority,
                                      host_bytes=trial.host_bytes(), lane_bytes=trial.lane_bytes(),
                                      host_id=host)
            if trial.status == Status.PAUSED:
                queue_client.trial_control(trial_id=queue_id, control=Control.PAUSE, host_id=host)
        except queue_client.SchedulerUnavailable:
            raise
        except queue_client.SchedulerError as error:
            log.warning("trial %s could not be sent again: %s", queue_id, error)
            trial_event_apply(trial_id=queue_id, status=Status.FAILED, message=str(error))
            return False
        log.warning("trial %s was not in the queue of host %s; sent again (resume: %s)", queue_id, host, resume)
        trial_event_apply(trial_id=queue_id, status=Status.PLANNING, message=LOST)
    return True


def _end(queue_id: str, status: str, host: str) -> bool:
    """Give the row the end its attempt reached in the queue (the event that said so was lost)."""
    record = queue_client.trial_record(trial_id=queue_id, host_id=host)
    if record is None or record.state not in ENDED:
        return False
    log.warning("trial %s is %s in the database but %s in the queue; recording its end", queue_id, status,
                record.state)
    return trial_event_apply(trial_id=queue_id, status=record.state, message=record.message or None)
