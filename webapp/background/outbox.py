"""Sending the web worker its tasks so that no work waits for ever, whether or not Redis answers.

A `WebWork` row is its own outbox, and its model names its task (``TASK``). The transaction that records its
work as pending also sends the task once it commits (`work_enqueue`). Every send is recorded on the row
(`work_send`): one that reaches Redis is due again `RESEND_AFTER` later, in case its message is lost; one that
fails keeps why (``send_error``, which the pages show) and is due at once. A request never fails for it and
never waits long: Redis down refuses at once, and a Redis that accepts the connection but never replies is given
up after two tries of ``SEND_TIMEOUT_S`` each.

`work_reconcile` (`reconcile.web_work_reconcile` runs it for each kind of work after each of the telemetry
ingest's passes) sends every pending row that is due, and gives up on a row sent `MAX_SENDS` times: its work
fails with a message. Tasks are idempotent (their state lives in the row, their files are renamed into place),
so a second message for the same work changes nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from kombu.exceptions import OperationalError

from webapp.background.celery_app import app, web_queue
from webapp.background.models import WebWork

SEND_GRACE = timedelta(minutes=1)  # a request's own send, on commit, comes well within this
RESEND_AFTER = timedelta(minutes=30)  # longer than any task runs: a pending row this old lost its message
MAX_SENDS = 5
FAILED = "failed"  # every WebWork model's status for work that will not be done
SEND_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5}
log = logging.getLogger(__name__)


def work_enqueue(*, row: WebWork) -> None:
    """Call in the transaction that records `row`'s work as pending (a request for it starts a new count of
    sends): sends its task with the row's id to this host's web worker once the transaction commits (at once
    outside one), so that the worker finds the row; the ingest's pass sends it if that never happens."""
    row.send_attempts, row.resend_at, row.send_error = 0, timezone.now() + SEND_GRACE, ""
    type(row).objects.filter(pk=row.pk).update(send_attempts=0, resend_at=row.resend_at, send_error="")
    transaction.on_commit(lambda: work_send(row=row))


def work_send(*, row: WebWork, now: datetime | None = None) -> bool:
    """Send `row`'s task and record the send at `now` (default: now) on it, and in the database while the work
    is pending; returns whether Redis took the message. Never raises for Redis being down."""
    now = now or timezone.now()
    pending = type(row).objects.filter(pk=row.pk, status=row.PENDING)
    # Recorded before the send: once the message is in Redis its task may run at once and write these fields
    # itself (a notification's delivery sets when its retry is due), which a later write would undo.
    row.resend_at, row.send_error, row.send_attempts = now + RESEND_AFTER, "", row.send_attempts + 1
    pending.update(send_attempts=F("send_attempts") + 1, resend_at=row.resend_at, send_error="")
    try:
        # A connection of its own to the Redis the settings name: a pooled one is stale after a Redis restart.
        with app.connection_for_write(url=settings.HYDRA.worker.redis_url) as connection:
            app.send_task(row.TASK, args=(row.pk,), queue=web_queue(), connection=connection,
                          retry_policy=SEND_RETRY_POLICY)
    except OperationalError as error:
        log.warning("%s %s not sent to the web worker: %s", type(row).__name__, row.pk, error)
        row.resend_at, row.send_error = now, str(error) or type(error).__name__
        pending.update(resend_at=row.resend_at, send_error=row.send_error)
    return not row.send_error


def work_reconcile(*, model: type[WebWork], now: datetime | None = None) -> tuple[int, int]:
    """Send the task of every pending row of `model` that is due at `now` (default: now), and fail the ones
    already sent `MAX_SENDS` times. Returns how many rows were sent and how many failed."""
    now = now or timezone.now()
    # A row without a time was asked for before sends were recorded: it is due at once.
    due = model.objects.filter(Q(resend_at__isnull=True) | Q(resend_at__lte=now), status=model.PENDING)
    sent = failed = 0
    for row in due.order_by("pk"):
        if row.send_attempts >= MAX_SENDS:
            failed += model.objects.filter(pk=row.pk, status=model.PENDING).update(
                status=FAILED, message=_given_up(row))
        else:
            sent += work_send(row=row, now=now)
    return sent, failed


def _given_up(row: WebWork) -> str:
    last = f" (the last send failed: {row.send_error})" if row.send_error else ""
    return (f"The web worker did not do this after {row.send_attempts} sends{last}; it may be stopped: ask an "
            f"administrator to check it. {row.RETRY_HINT}")
