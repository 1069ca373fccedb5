"""dataset_create stores the corpus and its row together, or nothing at all; dataset_tokenize (the web
worker's task) adds tokenizer and tokens, or fails the dataset with a message and keeps the corpus."""

from __future__ import annotations

import codecs

import numpy as np
import pytest
from django.core.exceptions import ValidationError
from django.core.files.base import ContentFile
from tokenizers import Tokenizer

from tests.webapp.datasets.factories import TINY_CORPUS, make_dataset
from webapp.background import celery_app
from webapp.datasets import services
from webapp.datasets.models import Dataset
from webapp.datasets.tokenization import split_sizes

pytestmark = pytest.mark.django_db


def test_it_trains_a_tokenizer_and_stores_the_token_ids(alice_team):
    dataset = make_dataset(alice_team)
    ids = np.load(dataset.tokens_path)
    assert ids.ndim == 1 and len(ids) == dataset.n_tokens
    tokenizer = Tokenizer.from_file(str(dataset.tokenizer_path))
    assert tokenizer.decode(ids[:40].tolist()) == TINY_CORPUS[: len(tokenizer.decode(ids[:40].tolist()))]
    assert dataset.vocab_size <= 300
    assert dataset.n_bytes == len(TINY_CORPUS.encode())
    assert dataset.train_tokens + dataset.val_tokens == dataset.n_tokens
    assert dataset.val_tokens == round(dataset.n_tokens * 0.1)


def test_it_stores_the_corpus_as_tokenizing_and_sends_it_to_the_web_worker_after_commit(
        alice_team, django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr(celery_app.app, "send_task",
                        lambda name, args, queue, **options: sent.append((name, args, queue)))
    with django_capture_on_commit_callbacks(execute=True):
        dataset = services.dataset_create(
            team=alice_team, user=None, name="bom", corpus=ContentFile(codecs.BOM_UTF8 + TINY_CORPUS.encode()),
            source=Dataset.Source.UPLOAD, vocab_size=300, val_fraction=0.1,
        )
        assert sent == []  # not before the row is committed, or the worker would not find it
    assert sent == [(Dataset.TASK, (dataset.pk,), celery_app.web_queue())]
    assert dataset.status == Dataset.Status.TOKENIZING and dataset.n_tokens == 0
    assert dataset.corpus_path.read_bytes() == TINY_CORPUS.encode()  # without the byte-order mark
    assert not dataset.tokens_path.exists() and not dataset.tokenizer_path.exists()


def test_it_fails_a_corpus_too_small_to_tokenize_and_keeps_it(alice_team):
    dataset = services.dataset_create(team=alice_team, user=None, name="tiny", corpus=ContentFile(b"a"),
                                      source=Dataset.Source.UPLOAD, vocab_size=300, val_fraction=0.1)
    services.dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.FAILED
    assert "too small" in dataset.message
    assert dataset.corpus_path.read_text() == "a"
    assert not dataset.tokens_path.exists()


def test_it_fails_with_a_message_and_leaves_no_partial_files_when_saving_fails(alice_team, monkeypatch):
    dataset = services.dataset_create(team=alice_team, user=None, name="tiny", corpus=ContentFile(TINY_CORPUS.encode()),
                                      source=Dataset.Source.UPLOAD, vocab_size=300, val_fraction=0.1)

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", broken_save)
    services.dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.FAILED
    assert "OSError: disk full" in dataset.message and "The corpus is kept" in dataset.message
    assert [p.name for p in dataset.directory.iterdir()] == ["corpus.txt"]


def test_it_tokenizes_a_dataset_once(alice_team):
    dataset = make_dataset(alice_team)
    written = dataset.tokens_path.stat().st_mtime_ns
    services.dataset_tokenize(dataset_id=dataset.pk)  # a message delivered twice
    services.dataset_tokenize(dataset_id=dataset.pk + 1000)  # a dataset deleted before its task ran
    assert dataset.tokens_path.stat().st_mtime_ns == written


def test_it_removes_the_files_when_the_row_cannot_be_saved(alice_team, data_dir, monkeypatch):
    def broken_create(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(Dataset.objects, "create", broken_create)
    with pytest.raises(RuntimeError):
        make_dataset(alice_team)
    assert list((data_dir / "datasets").iterdir()) == []


def test_it_refuses_a_duplicate_name_in_a_team(alice_team, bob_team):
    make_dataset(alice_team, name="same")
    with pytest.raises(ValidationError, match="already has a dataset"):
        make_dataset(alice_team, name="same")
    make_dataset(bob_team, name="same")


def test_it_gives_equal_fingerprints_to_equal_corpora(alice_team, bob_team):
    reference = make_dataset(bob_team)
    assert make_dataset(alice_team).fingerprint == reference.fingerprint
    assert make_dataset(alice_team, name="other", vocab_size=320).fingerprint != reference.fingerprint


def test_it_deletes_the_files_with_the_dataset(alice, alice_team, django_capture_on_commit_callbacks):
    dataset = make_dataset(alice_team)
    with django_capture_on_commit_callbacks(execute=True):
        services.dataset_delete(dataset=dataset, actor=alice)
    assert not dataset.directory.exists()
    assert not Dataset.objects.exists()


def test_it_splits_the_tail_for_validation():
    assert split_sizes(100, 0.1) == (90, 10)
    assert split_sizes(5, 0.01) == (4, 1)
    assert split_sizes(0, 0.1) == (0, 0)
