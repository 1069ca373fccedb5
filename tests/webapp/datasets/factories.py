"""Small real datasets for the web tests (a tokenizer trained on a few KB takes milliseconds)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from django.conf import LazySettings
from django.core.files.base import ContentFile
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpResponse
from django.test import Client
from django.urls import reverse

from webapp.accounts.models import Team
from webapp.datasets.models import Dataset
from webapp.datasets.sample_preference import SAMPLE_PAIRS_FILENAME, sample_preference_rows
from webapp.datasets.services import dataset_create, dataset_tokenize
from worker.engine.tokenizer import END_OF_TEXT, train_tokenizer

TINY_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A hydra has many heads, and each head trains a model.\n"
    "Shards of every model take turns on the device, so that no device waits while another works.\n"
) * 20


def use_data_dir(settings: LazySettings, path: Path) -> None:
    """Point HYDRA_DATA_DIR (and the spill and models roots and the import folder under it) at `path` for one
    test."""
    worker = dataclasses.replace(settings.HYDRA.worker, data_dir=path, spill_dir=path / "spill")
    settings.HYDRA = dataclasses.replace(settings.HYDRA, data_dir=path, models_root=path / "models",
                                         import_dir=path / "imports", worker=worker)


def make_dataset(team: Team, name: str = "tiny", text: str = TINY_CORPUS, vocab_size: int = 300) -> Dataset:
    """A ready dataset: stored, then tokenized here as the web worker would."""
    dataset = dataset_create(
        team=team, user=None, name=name, corpus=ContentFile(text.encode()), source=Dataset.Source.UPLOAD,
        vocab_size=vocab_size, val_fraction=0.1, filename=f"{name}.txt",
    )
    dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()
    return dataset


def upload(client: Client, filename: str, content: bytes, /, **fields: object) -> HttpResponse:
    """Post `content` as the file `filename` through the dataset page's form, as a browser does."""
    data = {"source": "upload", "vocab_size": 300, "val_fraction": 0.25, "kind": "",
            "file": SimpleUploadedFile(filename, content), **fields}
    return client.post(reverse("dataset_list"), data)


def upload_and_build(client: Client, filename: str, content: bytes, /, **fields: object) -> Dataset:
    """`upload` the file, then build the dataset here as the web worker would."""
    response = upload(client, filename, content, **fields)
    assert response.status_code == 302, response.content.decode()
    dataset = Dataset.objects.latest("pk")
    assert response["Location"] == reverse("dataset_detail", args=[dataset.pk])
    dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()
    return dataset


def make_preference_dataset(team: Team, name: str = "pairs", *, pairs: int | None = None,
                            rows: list[dict[str, object]] | None = None, vocab_size: int = 1000,
                            val_fraction: float = 0.1) -> Dataset:
    """A ready preference dataset, built here as the web worker would: the built-in sample's pairs (the first
    `pairs` of them, all when None) or `rows` of ``{"prompt", "chosen", "rejected"}`` (strings or messages)."""
    chosen = rows if rows is not None else sample_preference_rows()[:pairs]
    content = "".join(json.dumps(row) + "\n" for row in chosen).encode()
    dataset = dataset_create(
        team=team, user=None, name=name, corpus=ContentFile(content), source=Dataset.Source.SAMPLE_PAIRS,
        vocab_size=vocab_size, val_fraction=val_fraction, filename=SAMPLE_PAIRS_FILENAME,
        kind=Dataset.Kind.PREFERENCE, columns={"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"},
    )
    dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.READY, dataset.message
    return dataset


def pretrained_tokenizer_dir(path: Path) -> Path:
    """A tokenizer directory as ``save_pretrained`` writes it: a byte-level BPE with an end-of-text token."""
    from transformers import PreTrainedTokenizerFast

    text = "### user:\n### assistant:\nWhat is 2 + 2? Capital of France? Paris. Blue. Green. Yes.\n" * 20
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(text, vocab_size=300),
                                        eos_token=END_OF_TEXT)
    tokenizer.save_pretrained(path)
    return path
