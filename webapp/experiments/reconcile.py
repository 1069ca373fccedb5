"""Bringing the trials' rows and the scheduler's queue back in line after a crash on either side.

Two things can be left half done. A launch commits its rows before it submits (`launching`); if the web
process dies between the two, or Redis is down then, the trial stays to submit (``submitted`` false). A
trial's attempt can also outlive its row: a delete that raced the attempt's own send, or any other path that
removed a row the queue still runs. `trials_reconcile` repairs both, in one pass that may run any number of
times, alongside launches and deletes:

- every trial still to submit is sent (`launching.trial_send`: a repeat of a send that landed is one
  submission);
- every trial the queue would still run that no row names as its current attempt is cancelled.

Every trial in the queue of the host this web app submits to is one of its trials' attempts; the telemetry
ingest (``manage.py hydra_ingest``) runs a pass for that host after each of its own.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from django.conf import settings

from webapp import queue_client
from webapp.experiments.launching import trial_send
from webapp.experiments.models import Trial

log = logging.getLogger(__name__)


class Reconciled(NamedTuple):
    submitted: list[str]  # queue ids of the trials this pass sent
    cancelled: list[str]  # queue ids of the attempts without a row it asked to stop


def trials_reconcile() -> Reconciled:
    """Submit the launched trials not submitted yet and cancel the queue's trials that no row names.

    Raises redis.RedisError or queue_client.SchedulerUnavailable when Redis cannot be reached; what was done
    before stays done, and the next pass does the rest.
    """
    cancelled = _orphans_cancel()
    waiting = Trial.objects.filter(status=Trial.Status.PLANNING, submitted=False).order_by("pk")
    submitted = [queue_id for queue_id in waiting.values_list("queue_id", flat=True) if trial_send(queue_id=queue_id)]
    return Reconciled(submitted=submitted, cancelled=cancelled)


def _orphans_cancel() -> list[str]:
    # The queue is read before the rows: an attempt is submitted only after its row committed, so every attempt
    # read here that has a row has it by the time the rows are read.
    live = [trial_id for trial_id, state in queue_client.trial_states().items() if state not in queue_client.ENDED]
    named = set(Trial.objects.filter(queue_id__in=live).values_list("queue_id", flat=True))
    cancelled = []
    for trial_id in live:
        if trial_id in named:
            continue
        try:
            queue_client.trial_control(trial_id=trial_id, control=queue_client.Control.CANCEL)
        except queue_client.SchedulerUnavailable:
            raise
        except queue_client.SchedulerError as error:  # it ended meanwhile: nothing left to stop
            log.info("trial %s on host %s not cancelled: %s", trial_id, settings.HYDRA.worker.host_id, error)
            continue
        log.warning("cancelled trial %s: the scheduler ran it, but no trial record names it", trial_id)
        cancelled.append(trial_id)
    return cancelled
