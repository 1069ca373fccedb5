"""The web worker's experiment task (`webapp.background`): pack a trained model for download."""

from __future__ import annotations

from webapp.background.celery_app import app
from webapp.experiments import archives


@app.task(name=archives.BUILD_TASK)
def trial_archive_build(archive_id: int) -> None:
    archives.trial_archive_build(archive_id=archive_id)
