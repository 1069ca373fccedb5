"""The web worker's catalog task (`webapp.background`): check or import a checkpoint."""

from __future__ import annotations

from webapp.background.celery_app import app
from webapp.catalog import services, work


@app.task(name=services.IMPORT_TASK)
def checkpoint_import(checkpoint_id: int) -> None:
    work.checkpoint_import(checkpoint_id=checkpoint_id)
