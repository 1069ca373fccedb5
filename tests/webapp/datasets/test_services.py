"""dataset_create stores corpus, tokenizer and tokens together, or nothing at all."""

from __future__ import annotations

import numpy as np
import pytest
from django.core.exceptions import ValidationError
from tokenizers import Tokenizer

from tests.webapp.datasets.factories import TINY_CORPUS, make_dataset
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


def test_it_leaves_nothing_behind_when_saving_fails(alice_team, data_dir, monkeypatch):
    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        make_dataset(alice_team)
    assert not Dataset.objects.exists()
    assert list((data_dir / "datasets").iterdir()) == []


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


def test_it_deletes_the_files_with_the_dataset(alice_team, django_capture_on_commit_callbacks):
    dataset = make_dataset(alice_team)
    with django_capture_on_commit_callbacks(execute=True):
        services.dataset_delete(dataset=dataset)
    assert not dataset.directory.exists()
    assert not Dataset.objects.exists()


def test_it_splits_the_tail_for_validation():
    assert split_sizes(100, 0.1) == (90, 10)
    assert split_sizes(5, 0.01) == (4, 1)
    assert split_sizes(0, 0.1) == (0, 0)
