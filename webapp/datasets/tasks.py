"""The web worker's dataset task (`webapp.background`): tokenize an uploaded corpus."""

from __future__ import annotations

from webapp.background.celery_app import app
from webapp.datasets import services


@app.task(name=services.TOKENIZE_TASK)
def dataset_tokenize(dataset_id: int) -> None:
    services.dataset_tokenize(dataset_id=dataset_id)
