"""The pass that sends the web worker's pending work again (`outbox.work_reconcile`) for each kind of work it
does: every installed `WebWork` model, each naming its task. The ingest (``manage.py hydra_ingest``) runs it
after each of its own passes."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from django.apps import apps

from webapp.background.models import WebWork
from webapp.background.outbox import work_reconcile


class WebWorkReconciled(NamedTuple):
    sent: int  # pending rows whose task this pass sent
    failed: int  # pending rows it gave up on


def web_work_models() -> list[type[WebWork]]:
    """Every kind of work the web worker does: the installed models of `WebWork` rows (a notification's
    deliveries too, whose retries are due at their ``resend_at``)."""
    return [model for model in apps.get_models() if issubclass(model, WebWork)]


def web_work_reconcile(*, now: datetime | None = None) -> WebWorkReconciled:
    """Send the tasks of the pending work due at `now` (default: now) and fail the work sent too often."""
    sent = failed = 0
    for model in web_work_models():
        model_sent, model_failed = work_reconcile(model=model, now=now)
        sent, failed = sent + model_sent, failed + model_failed
    return WebWorkReconciled(sent=sent, failed=failed)
