"""The web worker's dataset tasks (`webapp.background`): tokenize an uploaded corpus, and encode it with a
pretrained model's tokenizer."""

from __future__ import annotations

from webapp.background.celery_app import app
from webapp.datasets import services
from webapp.datasets.models import Dataset, DatasetTokens


@app.task(name=Dataset.TASK)
def dataset_tokenize(dataset_id: int) -> None:
    services.dataset_tokenize(dataset_id=dataset_id)


@app.task(name=DatasetTokens.TASK)
def dataset_tokens_build(tokens_id: int) -> None:
    services.dataset_tokens_build(tokens_id=tokens_id)
