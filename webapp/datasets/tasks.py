"""The web worker's dataset tasks (`webapp.background`): tokenize an uploaded corpus, and encode it with a
pretrained model's tokenizer."""

from __future__ import annotations

from webapp.background.celery_app import app
from webapp.datasets import services


@app.task(name=services.TOKENIZE_TASK)
def dataset_tokenize(dataset_id: int) -> None:
    services.dataset_tokenize(dataset_id=dataset_id)


@app.task(name=services.TOKENS_TASK)
def dataset_tokens_build(tokens_id: int) -> None:
    services.dataset_tokens_build(tokens_id=tokens_id)
