"""The web worker's experiment tasks (`webapp.background`): pack a trained model for download, plan a large
sweep's preview, generate text with a trained model."""

from __future__ import annotations

from webapp.background.celery_app import app
from webapp.experiments import archives, generations, previews
from webapp.ground.models import ExperimentPreview, Generation, TrialArchive


@app.task(name=TrialArchive.TASK)
def trial_archive_build(archive_id: int) -> None:
    archives.trial_archive_build(archive_id=archive_id)


@app.task(name=ExperimentPreview.TASK)
def experiment_preview_plan(preview_id: int) -> None:
    previews.experiment_preview_plan(preview_id=preview_id)


@app.task(name=Generation.TASK)
def trial_generate(generation_id: int) -> None:
    generations.trial_generate(generation_id=generation_id)
