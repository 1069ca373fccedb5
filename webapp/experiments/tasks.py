"""The web worker's experiment tasks (`webapp.background`): pack a trained model for download, plan a large
sweep's preview, generate text with a trained model, check a chat template."""

from __future__ import annotations

from webapp.background.celery_app import app
from webapp.experiments import archives, chat_template, generations, previews
from webapp.ground.models import ChatTemplateCheck, ExperimentPreview, Generation, TrialArchive


@app.task(name=TrialArchive.TASK)
def trial_archive_build(archive_id: int) -> None:
    archives.trial_archive_build(archive_id=archive_id)


@app.task(name=ExperimentPreview.TASK)
def experiment_preview_plan(preview_id: int) -> None:
    previews.experiment_preview_plan(preview_id=preview_id)


@app.task(name=Generation.TASK)
def trial_generate(generation_id: int) -> None:
    generations.trial_generate(generation_id=generation_id)


@app.task(name=ChatTemplateCheck.TASK)
def chat_template_check(check_id: int) -> None:
    chat_template.chat_template_check(check_id=check_id)
