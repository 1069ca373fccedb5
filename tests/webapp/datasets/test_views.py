"""Dataset pages: login, CSRF, team scoping, uploads end to end, inert names."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from tests.webapp.datasets.factories import TINY_CORPUS, make_dataset
from webapp.datasets.models import Dataset

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
    page = alice_client.get(response["Location"]).content.decode()
    assert f"{dataset.train_tokens} / {dataset.val_tokens} tokens" in page


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
