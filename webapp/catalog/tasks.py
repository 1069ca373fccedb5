"""The web worker's catalog task (`webapp.background`): check or import a checkpoint."""

from __future__ import annotations

from webapp.background.celery_app import app
from webapp.catalog import work
from webapp.catalog.models import Checkpoint


@app.task(name=Checkpoint.TASK)
def checkpoint_import(checkpoint_id: int) -> None:
    work.checkpoint_import(checkpoint_id=checkpoint_id)
