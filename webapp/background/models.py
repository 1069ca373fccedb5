"""What a row whose work the web worker does keeps about sending that work (`webapp.background.outbox`)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models


class WebWork(models.Model):
    """A row whose pending work (its ``status`` is ``PENDING``) the web worker does: a dataset to tokenize, a
    model to pack, a preview to plan. Its model names the pending status, the web worker's task that does the
    work (`TASK`, called with the row's id) and what a user does when the work is given up (`RETRY_HINT`);
    the fields below say when its task is sent again."""

    PENDING: ClassVar[str]
    TASK: ClassVar[str]
    RETRY_HINT: ClassVar[str]

    send_attempts = models.PositiveSmallIntegerField(
        default=0, help_text="Times its task was sent to the web worker (or tried) since the work was asked for.")
    resend_at = models.DateTimeField(
        null=True, blank=True, help_text="When the ingest's pass sends its task again if the work is still pending.")
    send_error = models.TextField(blank=True, help_text="Why the last send failed; empty once one reached Redis.")

    class Meta:
        abstract = True
