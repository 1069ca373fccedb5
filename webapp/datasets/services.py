"""Writes about datasets. A dataset's files and its row appear together or not at all."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid

import numpy as np
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import ProtectedError

from webapp.accounts.models import Team
from webapp.datasets.models import Dataset, datasets_root
from webapp.datasets.tokenization import tokenize_corpus


def dataset_fingerprint(*, text: str, vocab_size: int, val_fraction: float) -> str:
    """Equal fingerprints mean the same corpus, vocabulary and split, so results on them compare."""
    digest = hashlib.sha256(text.encode("utf-8"))
    digest.update(json.dumps([vocab_size, round(val_fraction, 6)]).encode())
    return digest.hexdigest()


def dataset_create(
    *,
    team: Team,
    user: AbstractBaseUser | None,
    name: str,
    text: str,
    source: str,
    vocab_size: int,
    val_fraction: float,
    filename: str = "",
) -> Dataset:
    """Train a tokenizer on `text`, store corpus, tokenizer and token ids, and record the dataset.

    Files are written into a temporary directory that is renamed into place only when complete, and removed
    again if the row cannot be saved, so a failure leaves neither files nor a row. Raises ValidationError
    for a duplicate name or a corpus too small to hold a training and a validation token.
    """
    name = name.strip()
    if not name:
        raise ValidationError({"name": "A dataset needs a name."})
    if Dataset.objects.filter(team=team, name=name).exists():
        raise ValidationError({"name": f"Your team already has a dataset named {name!r}."})
    corpus = tokenize_corpus(text, vocab_size=vocab_size)
    if len(corpus.ids) < 2:
        raise ValidationError({"file": "The corpus is too small: it must give at least two tokens."})

    key = uuid.uuid4().hex
    root = datasets_root()
    staging = root / f".staging-{key}"
    final = root / key
    staging.mkdir(parents=True)
    try:
        (staging / Dataset.CORPUS_FILE).write_text(text, encoding="utf-8")
        corpus.tokenizer.save(str(staging / Dataset.TOKENIZER_FILE))
        np.save(staging / Dataset.TOKENS_FILE, corpus.ids)
        staging.rename(final)
        with transaction.atomic():
            return Dataset.objects.create(
                team=team, name=name, source=source, filename=filename[:255],
                vocab_size=corpus.vocab_size, val_fraction=val_fraction,
                n_bytes=len(text.encode("utf-8")), n_tokens=len(corpus.ids),
                fingerprint=dataset_fingerprint(text=text, vocab_size=vocab_size, val_fraction=val_fraction),
                storage_key=key, created_by=user,
            )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        raise


def dataset_delete(*, dataset: Dataset) -> None:
    """Delete a dataset and its files. Raises ValidationError while experiments still use it."""
    directory = dataset.directory
    try:
        with transaction.atomic():
            dataset.delete()
    except ProtectedError:
        raise ValidationError(
            f"{dataset.name} is used by experiments; delete those experiments first."
        ) from None
    transaction.on_commit(lambda: shutil.rmtree(directory, ignore_errors=True))
