"""The pass that sends the web worker's pending work again (`outbox.work_reconcile`) for each kind of work it
does; the telemetry ingest (``manage.py hydra_ingest``) runs it after each of its own passes."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from webapp.background.models import WebWork
from webapp.background.outbox import work_reconcile
from webapp.catalog.models import Checkpoint
from webapp.catalog.services import IMPORT_TASK
from webapp.datasets.models import Dataset, DatasetTokens
from webapp.datasets.services import TOKENIZE_TASK, TOKENS_TASK
from webapp.experiments.archives import BUILD_TASK
from webapp.experiments.generations import GENERATE_TASK
from webapp.experiments.models import ExperimentPreview, Generation, TrialArchive
from webapp.experiments.previews import PLAN_TASK
from webapp.notifications.models import Delivery
from webapp.notifications.notices import DELIVER_TASK

WORK: tuple[tuple[type[WebWork], str], ...] = (
    (Dataset, TOKENIZE_TASK), (DatasetTokens, TOKENS_TASK), (TrialArchive, BUILD_TASK),
    (ExperimentPreview, PLAN_TASK), (Generation, GENERATE_TASK), (Checkpoint, IMPORT_TASK),
    (Delivery, DELIVER_TASK))  # a notification's retries too: their resend_at is when each is due


class WebWorkReconciled(NamedTuple):
    sent: int  # pending rows whose task this pass sent
    failed: int  # pending rows it gave up on


def web_work_reconcile(*, now: datetime | None = None) -> WebWorkReconciled:
    """Send the tasks of the pending work due at `now` (default: now) and fail the work sent too often."""
    sent = failed = 0
    for model, task_name in WORK:
        model_sent, model_failed = work_reconcile(model=model, task_name=task_name, now=now)
        sent, failed = sent + model_sent, failed + model_failed
    return WebWorkReconciled(sent=sent, failed=failed)
