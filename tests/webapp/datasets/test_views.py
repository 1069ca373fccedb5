"""Dataset pages: login, CSRF, team scoping, uploads end to end (Redis down too), inert names."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from tests.webapp.datasets.factories import TINY_CORPUS, make_dataset
from tests.webapp.web_worker import CLOSED_PORT_URL, redis_at, silent_redis
from webapp.datasets.models import Dataset
from webapp.datasets.services import dataset_tokenize
from webapp.datasets.uploads import UploadLimitHandler

pytestmark = pytest.mark.django_db


def test_it_requires_login(client, alice_team):
    dataset = make_dataset(alice_team)
    for url in [
        reverse("dataset_list"),
        reverse("dataset_detail", args=[dataset.pk]),
        reverse("dataset_delete", args=[dataset.pk]),
    ]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_it_uploads_a_corpus(alice_client, alice_team):
    upload = SimpleUploadedFile("fox.txt", TINY_CORPUS.encode(), content_type="text/plain")
    response = alice_client.post(
        reverse("dataset_list"), {"source": "upload", "vocab_size": 300, "val_fraction": 0.1, "file": upload}
    )
    dataset = Dataset.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("dataset_detail", args=[dataset.pk])
    assert dataset.team == alice_team and dataset.name == "fox.txt"
    # The request stored the corpus only; tokenizing is the web worker's (this test runs without one).
    assert dataset.status == Dataset.Status.TOKENIZING and not dataset.tokens_path.exists()
    page = alice_client.get(response["Location"]).content.decode()
    assert 'data-status="tokenizing"' in page and 'http-equiv="refresh"' in page
    dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()
    page = alice_client.get(response["Location"]).content.decode()
    assert 'data-status="ready"' in page and 'http-equiv="refresh"' not in page
    assert f"{dataset.train_tokens} / {dataset.val_tokens} tokens" in page


def test_it_refuses_an_upload_over_the_limit_while_it_streams_in(alice_client, settings, data_dir, monkeypatch):
    settings.HYDRA = dataclasses.replace(settings.HYDRA, max_upload_bytes=256 * 1024)
    received = []
    receive = UploadLimitHandler.receive_data_chunk
    monkeypatch.setattr(UploadLimitHandler, "receive_data_chunk",
                        lambda self, data, start: received.append(len(data)) or receive(self, data, start))
    big = SimpleUploadedFile("big.txt", b"word " * 2_000_000, content_type="text/plain")  # 10 MB
    response = alice_client.post(reverse("dataset_list"), {"source": "upload", "file": big,
                                                           "vocab_size": 300, "val_fraction": 0.1})
    assert response.status_code == 413
    assert "larger than the limit of 256.0" in response.content.decode()
    # It stopped at the first chunk past the limit: the other 9.7 MB were never handed to a handler.
    assert sum(received) <= 256 * 1024 + 64 * 1024
    assert not Dataset.objects.exists()
    assert not (data_dir / "datasets").exists()


def test_it_shows_field_errors_and_stores_nothing_for_a_binary_upload(alice_client, data_dir):
    upload = SimpleUploadedFile("x.bin", b"\x00\x01\x02binary", content_type="application/octet-stream")
    response = alice_client.post(
        reverse("dataset_list"), {"source": "upload", "vocab_size": 300, "val_fraction": 0.1, "file": upload}
    )
    assert response.status_code == 400
    assert "looks binary" in response.content.decode()
    assert not Dataset.objects.exists()
    assert not (data_dir / "datasets").exists() or not any((data_dir / "datasets").iterdir())


def test_it_requires_csrf_on_upload(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(reverse("dataset_list"), {"source": "sample", "vocab_size": 300, "val_fraction": 0.1})
    assert response.status_code == 403
    assert not Dataset.objects.exists()


def test_it_answers_404_for_another_teams_dataset(alice_client, bob_team):
    dataset = make_dataset(bob_team)
    assert alice_client.get(reverse("dataset_detail", args=[dataset.pk])).status_code == 404
    assert alice_client.get(reverse("dataset_delete", args=[dataset.pk])).status_code == 404
    assert alice_client.post(reverse("dataset_delete", args=[dataset.pk])).status_code == 404
    assert Dataset.objects.filter(pk=dataset.pk).exists()


def test_it_renders_a_script_name_inert(alice_client, alice_team):
    dataset = make_dataset(alice_team, name="<script>alert(1)</script>")
    for url in [reverse("dataset_list"), reverse("dataset_detail", args=[dataset.pk])]:
        page = alice_client.get(url).content.decode()
        assert "<script>alert(1)</script>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_it_deletes_after_confirmation(alice_client, alice_team):
    dataset = make_dataset(alice_team)
    assert alice_client.get(reverse("dataset_delete", args=[dataset.pk])).status_code == 200
    assert Dataset.objects.filter(pk=dataset.pk).exists()
    response = alice_client.post(reverse("dataset_delete", args=[dataset.pk]))
    assert response.status_code == 302
    assert not Dataset.objects.filter(pk=dataset.pk).exists()


def test_it_sends_a_user_without_a_team_to_the_teams_page(charlie):
    client = Client()
    client.force_login(charlie)
    response = client.get(reverse("dataset_list"))
    assert response.status_code == 302 and response["Location"] == reverse("team_list")


def test_the_web_worker_tokenizes_an_upload_and_the_page_shows_it_ready(alice, data_dir, web_worker):
    client = Client()
    client.force_login(alice)
    upload = SimpleUploadedFile("fox.txt", TINY_CORPUS.encode(), content_type="text/plain")
    response = client.post(reverse("dataset_list"), {"source": "upload", "vocab_size": 300, "val_fraction": 0.1,
                                                     "file": upload})
    assert response.status_code == 302
    dataset = Dataset.objects.get()
    web_worker.wait(lambda: Dataset.objects.get().status != Dataset.Status.TOKENIZING, 60, "the tokenizer")
    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.READY, dataset.message
    assert dataset.n_tokens == len(np.load(dataset.tokens_path)) > 2
    page = client.get(response["Location"]).content.decode()
    assert 'data-status="ready"' in page and f"{dataset.train_tokens} / {dataset.val_tokens} tokens" in page


def test_the_page_says_why_the_web_worker_could_not_tokenize_a_corpus(alice, data_dir, web_worker):
    client = Client()
    client.force_login(alice)
    upload = SimpleUploadedFile("one.txt", b"a", content_type="text/plain")
    response = client.post(reverse("dataset_list"), {"source": "upload", "vocab_size": 300, "val_fraction": 0.1,
                                                     "file": upload})
    web_worker.wait(lambda: Dataset.objects.get().status != Dataset.Status.TOKENIZING, 60, "the tokenizer")
    page = client.get(response["Location"]).content.decode()
    assert 'data-status="failed"' in page and "The corpus is too small" in page
    assert Dataset.objects.get().corpus_path.read_text() == "a"


def _upload(client: Client, text: bytes = TINY_CORPUS.encode()):
    upload = SimpleUploadedFile("fox.txt", text, content_type="text/plain")
    return client.post(reverse("dataset_list"), {"source": "upload", "vocab_size": 300, "val_fraction": 0.1,
                                                 "file": upload})


def test_an_upload_while_redis_is_down_is_stored_and_tokenized_once_it_is_back(alice, data_dir, web_worker,
                                                                               settings):
    client = Client()
    client.force_login(alice)
    with redis_at(settings, CLOSED_PORT_URL):
        response = _upload(client)
        assert response.status_code == 302
        page = client.get(response["Location"]).content.decode()
    dataset = Dataset.objects.get()
    assert dataset.status == Dataset.Status.TOKENIZING
    assert dataset.corpus_path.read_bytes() == TINY_CORPUS.encode()
    assert f"Dataset {dataset.name} is stored." in page and 'data-status="tokenizing"' in page
    assert "The background worker could not be reached (" in page and "127.0.0.1:1" in page
    assert "it will be retried." in page

    call_command("hydra_ingest", "--once")  # Redis is back: the ingest's pass sends the dataset

    web_worker.wait(lambda: Dataset.objects.get().status != Dataset.Status.TOKENIZING, 60, "the tokenizer")
    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.READY, dataset.message
    assert (dataset.send_attempts, dataset.send_error) == (2, "")
    assert "could not be reached" not in client.get(response["Location"]).content.decode()


@pytest.mark.timeout(60)  # a send to a Redis that never answers used to hold the request for ever
@pytest.mark.django_db(transaction=True)
def test_an_upload_answers_when_redis_accepts_the_connection_but_never_replies(alice, data_dir, settings):
    client = Client()
    client.force_login(alice)
    with silent_redis() as url, redis_at(settings, url):
        response = _upload(client)
    assert response.status_code == 302
    dataset = Dataset.objects.get()
    assert dataset.status == Dataset.Status.TOKENIZING and dataset.corpus_path.exists()
    assert "Timeout" in dataset.send_error
