"""Writes about datasets. A dataset's files and its row appear together or not at all; the tokenizer and the
token ids follow from the web worker (`dataset_tokenize`; for instruction data, `webapp.datasets.instruction`, for
preference pairs `webapp.datasets.preference`)."""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.base import File
from django.db import transaction
from django.db.models import ProtectedError

from webapp.accounts.models import Team
from webapp.accounts.roles import require_creator_or_owner
from webapp.background.outbox import work_enqueue
from webapp.background.task_limits import memory_note
from webapp.datasets.instruction import InstructionDataError, instruction_dataset_build, instruction_tokens_build
from webapp.datasets.models import Dataset, DatasetTokens, datasets_root, template_sha256
from webapp.datasets.preference import preference_dataset_build, preference_tokens_build
from webapp.datasets.tokenization import TokenizedCorpus, encode_split, tokenize_corpus, validation_offset
from webapp.worker_door import TOKENIZER_JSON

log = logging.getLogger(__name__)


BOM = codecs.BOM_UTF8


class CorpusError(ValueError):
    """A stored corpus that cannot become a dataset; the message is shown on the dataset's page."""


def dataset_fingerprint(*, corpus_sha256: hashlib._Hash, vocab_size: int, val_fraction: float,
                        kind: str = Dataset.Kind.CORPUS, columns: Mapping[str, str] | None = None) -> str:
    """Equal fingerprints mean the same corpus, vocabulary and split, so results on them compare.
    `corpus_sha256` has hashed the corpus's UTF-8 bytes (no byte-order mark); instruction data is read as
    `kind` too, since one file may hold the columns of two kinds, and through `columns` (role -> column) when a
    role is read from a column of another name, since one file may hold two columns fit for a role."""
    digest = corpus_sha256.copy()
    settings: list[object] = [vocab_size, round(val_fraction, 6)]
    if kind != Dataset.Kind.CORPUS:
        settings.append(kind)
        if any(role != column for role, column in (columns or {}).items()):
            settings.append(sorted((columns or {}).items()))
    digest.update(json.dumps(settings).encode())
    return digest.hexdigest()


def dataset_create(
    *,
    team: Team,
    user: AbstractBaseUser | None,
    name: str,
    corpus: File,
    source: str,
    vocab_size: int,
    val_fraction: float,
    filename: str = "",
    kind: str = Dataset.Kind.CORPUS,
    columns: Mapping[str, str] | None = None,
) -> Dataset:
    """Store `corpus` (UTF-8 text, or for another `kind` a file of instruction data in the format its
    `filename`'s suffix says, whose roles the `columns` hold, checked by the form) and record the dataset as
    tokenizing; the web worker
    trains its tokenizer (`dataset_tokenize`) once the transaction commits. When Redis cannot be reached the
    dataset is stored all the same, its ``send_error`` saying why, and the ingest's pass sends it later.

    The corpus is copied chunk by chunk into a temporary directory that is renamed into place only when
    complete, and removed again if the row cannot be saved, so a failure leaves neither files nor a row.
    Raises ValidationError for a missing or duplicate name.
    """
    name = name.strip()
    if not name:
        raise ValidationError({"name": "A dataset needs a name."})
    if Dataset.objects.filter(team=team, name=name).exists():
        raise ValidationError({"name": f"Your team already has a dataset named {name!r}."})
    key = uuid.uuid4().hex
    root = datasets_root()
    staging = root / f".staging-{key}"
    final = root / key
    staging.mkdir(parents=True)
    try:
        digest, n_bytes = hashlib.sha256(), 0
        with (staging / Dataset.stored_name(kind, filename)).open("wb") as out, corpus.open("rb") as source_file:
            for index, chunk in enumerate(source_file.chunks()):
                if index == 0 and kind == Dataset.Kind.CORPUS:
                    chunk = chunk.removeprefix(BOM)
                digest.update(chunk)
                n_bytes += len(chunk)
                out.write(chunk)
        staging.rename(final)
        with transaction.atomic():
            dataset = Dataset.objects.create(
                team=team, name=name, source=source, kind=kind, columns=dict(columns or {}), filename=filename[:255],
                status=Dataset.Status.TOKENIZING, vocab_size=vocab_size, val_fraction=val_fraction, n_bytes=n_bytes,
                fingerprint=dataset_fingerprint(corpus_sha256=digest, vocab_size=vocab_size,
                                                val_fraction=val_fraction, kind=kind, columns=columns),
                corpus_sha256=digest.hexdigest(), storage_key=key, created_by=user,
            )
            work_enqueue(row=dataset)
            return dataset
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)
        raise


def dataset_tokenize(*, dataset_id: int) -> None:
    """Train the tokenizer on a tokenizing dataset's stored corpus and write its token ids (for instruction
    data, its examples: `instruction_dataset_build`): the dataset becomes ready, or failed with a message
    saying why (the file stays, nothing is lost).

    Idempotent, for a task that runs again: a dataset no longer tokenizing (or deleted) is left alone, and the
    files are written under temporary names and renamed into place.
    """
    dataset = Dataset.objects.filter(pk=dataset_id, status=Dataset.Status.TOKENIZING).first()
    if dataset is None:
        return
    pending = Dataset.objects.filter(pk=dataset_id, status=Dataset.Status.TOKENIZING)
    try:
        figures = _dataset_build(dataset)
    except (CorpusError, InstructionDataError) as error:
        pending.update(status=Dataset.Status.FAILED, message=str(error))
        return
    except MemoryError:
        what = "file" if dataset.is_instruction else "corpus"
        pending.update(status=Dataset.Status.FAILED, message=(
            f"Reading and tokenizing this {what} took more memory than a task of the web worker may take "
            f"({memory_note()}). The {what} is kept; split it into smaller files, or ask an administrator to raise "
            "the limit."))
        return
    except Exception as error:  # a dataset deleted meanwhile updates no row below
        log.exception("tokenizing dataset %s failed", dataset_id)
        what = "file" if dataset.is_instruction else "corpus"
        pending.update(status=Dataset.Status.FAILED, message=(
            f"Tokenizing failed ({type(error).__name__}: {error}). The {what} is kept; delete the dataset and "
            "upload it again, or ask an administrator to look at the web worker's log."))
        return
    pending.update(status=Dataset.Status.READY, message="", **figures)


def _dataset_build(dataset: Dataset) -> dict[str, Any]:
    if dataset.is_preference:
        return preference_dataset_build(dataset)
    return instruction_dataset_build(dataset) if dataset.is_instruction else _tokenize_corpus(dataset)


def _tokenize_corpus(dataset: Dataset) -> dict[str, int]:
    """Train the tokenizer on the corpus, write it and the token ids; returns the row's figures."""
    text = dataset.corpus_path.read_text(encoding="utf-8")
    try:
        val_offset = validation_offset(text.encode("utf-8"), dataset.val_fraction)
    except ValueError:
        raise CorpusError("The corpus is too small to hold out a validation text. Upload a longer text.") from None
    corpus = tokenize_corpus(text, vocab_size=dataset.vocab_size, val_offset=val_offset)
    if len(corpus.ids) < 2:
        raise CorpusError("The corpus is too small: it must give at least two tokens. Upload a longer text.")
    _write_tokenized(dataset, corpus)
    return {"vocab_size": corpus.vocab_size, "n_tokens": len(corpus.ids), "val_offset": val_offset,
            "val_start": corpus.val_start}


def _write_tokenized(dataset: Dataset, corpus: TokenizedCorpus) -> None:
    """Write tokenizer, token ids and bytes per token under temporary names, then rename them into place (none
    left behind)."""
    partial = [dataset.directory / f".partial-{uuid.uuid4().hex}{suffix}" for suffix in (".json", ".npy", ".npy")]
    try:
        corpus.tokenizer.save(str(partial[0]))
        with partial[1].open("wb") as out:
            np.save(out, corpus.ids)
        if corpus.token_bytes is not None:
            with partial[2].open("wb") as out:
                np.save(out, corpus.token_bytes)
            os.replace(partial[2], dataset.token_bytes_path)
        os.replace(partial[0], dataset.tokenizer_path)
        os.replace(partial[1], dataset.tokens_path)
    finally:
        for path in partial:
            path.unlink(missing_ok=True)


def dataset_tokens_request(*, dataset: Dataset, tokenizer_sha256: str, tokenizer_dir: str,
                           model_name: str, chat_template: str = "") -> DatasetTokens:
    """The ready dataset's token ids under the tokenizer `tokenizer_sha256` (in `tokenizer_dir`), for instruction
    data with `chat_template` (blank: the tokenizer's own, else ChatML): the row if it exists, else a new one
    the web worker fills (`dataset_tokens_build`) once the transaction commits. A failed one is asked for
    again. The same dataset, tokenizer and template are tokenized once, whichever experiments ask."""
    with transaction.atomic():
        tokens, created = DatasetTokens.objects.select_for_update().get_or_create(
            dataset=dataset, tokenizer_sha256=tokenizer_sha256, template_sha256=template_sha256(chat_template),
            defaults={"tokenizer_dir": tokenizer_dir, "model_name": model_name[:200], "chat_template": chat_template},
        )
        if created or tokens.status == DatasetTokens.Status.FAILED:
            tokens.status, tokens.message = DatasetTokens.Status.TOKENIZING, ""
            tokens.tokenizer_dir, tokens.model_name = tokenizer_dir, model_name[:200]
            tokens.save(update_fields=["status", "message", "tokenizer_dir", "model_name"])
            work_enqueue(row=tokens)
    return tokens


def dataset_tokens_build(*, tokens_id: int) -> None:
    """Encode the dataset's corpus (for instruction data, its examples: `instruction_tokens_build`) with the
    pretrained tokenizer of a tokenizing `DatasetTokens` row and write the ids: the row becomes ready, or failed
    with why. Idempotent like `dataset_tokenize`."""
    tokens = DatasetTokens.objects.select_related("dataset").filter(
        pk=tokens_id, status=DatasetTokens.Status.TOKENIZING).first()
    if tokens is None:
        return
    pending = DatasetTokens.objects.filter(pk=tokens_id, status=DatasetTokens.Status.TOKENIZING)
    try:
        figures = _tokens_build(tokens)
    except (CorpusError, InstructionDataError) as error:
        pending.update(status=DatasetTokens.Status.FAILED, message=str(error))
        return
    except MemoryError:
        pending.update(status=DatasetTokens.Status.FAILED, message=(
            f"Tokenizing with {tokens.model_name}'s tokenizer took more memory than a task of the web worker may "
            f"take ({memory_note()})."))
        return
    except Exception as error:
        log.exception("tokenizing dataset tokens %s failed", tokens_id)
        pending.update(status=DatasetTokens.Status.FAILED, message=(
            f"Tokenizing with {tokens.model_name}'s tokenizer failed ({type(error).__name__}: {error})."))
        return
    pending.update(**({"status": DatasetTokens.Status.READY, "message": ""} | figures))


def _tokens_build(tokens: DatasetTokens) -> dict[str, Any]:
    if tokens.dataset.is_preference:
        return preference_tokens_build(tokens)
    return instruction_tokens_build(tokens) if tokens.dataset.is_instruction else _encode_corpus(tokens)


def _encode_corpus(tokens: DatasetTokens) -> dict[str, int | None]:
    """Encode the corpus with the row's tokenizer and write the ids; returns the row's figures."""
    from tokenizers import Tokenizer

    source = os.path.join(tokens.tokenizer_dir, TOKENIZER_JSON)
    try:
        tokenizer = Tokenizer.from_file(source)
    except Exception as error:
        raise CorpusError(f"{tokens.model_name}'s tokenizer could not be read from {source} "
                          f"({type(error).__name__}: {str(error)[:200]}).") from None
    text = tokens.dataset.corpus_path.read_text(encoding="utf-8")
    val_offset = tokens.dataset.val_offset
    if val_offset is None:  # a dataset split by blocks of tokens: its split is the engine's block fraction
        val_offset = validation_offset(text.encode("utf-8"), tokens.dataset.val_fraction)
    split = encode_split(text, tokenizer, val_offset=val_offset)
    ids = split.ids
    if len(ids) < 2:
        raise CorpusError("The corpus is too small: it must give at least two tokens.")
    partial = [tokens.dataset.directory / f".partial-{uuid.uuid4().hex}{suffix}" for suffix in (".npy", ".b.npy")]
    try:
        with partial[0].open("wb") as out:
            np.save(out, ids)
        if split.token_bytes is not None:
            with partial[1].open("wb") as out:
                np.save(out, split.token_bytes)
            os.replace(partial[1], tokens.token_bytes_path)
        os.replace(partial[0], tokens.path)
    finally:
        for path in partial:
            path.unlink(missing_ok=True)
    return {"n_tokens": len(ids), "max_id": int(ids.max()),
            "val_start": split.val_start if tokens.dataset.val_offset is not None else None}


def dataset_require_delete(*, actor: AbstractBaseUser, dataset: Dataset) -> None:
    """Raise PermissionDenied unless `actor` owns the dataset's team or created the dataset."""
    require_creator_or_owner(user=actor, team=dataset.team, created_by_id=dataset.created_by_id,
                             what=f"dataset {dataset.name!r}")


def dataset_delete(*, dataset: Dataset, actor: AbstractBaseUser) -> None:
    """Delete a dataset and its files. Raises PermissionDenied unless `dataset_require_delete` passes, and
    ValidationError while experiments still use it."""
    dataset_require_delete(actor=actor, dataset=dataset)
    directory = dataset.directory
    try:
        with transaction.atomic():
            dataset.delete()
    except ProtectedError:
        raise ValidationError(
            f"{dataset.name} is used by experiments; delete those experiments first."
        ) from None
    transaction.on_commit(lambda: shutil.rmtree(directory, ignore_errors=True))
