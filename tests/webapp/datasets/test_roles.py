"""Roles on datasets: a team's owners delete any of its datasets; a member only one they created. The
service refuses, the page answers 403, and a refused delete leaves the row and the files."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.urls import reverse

from tests.webapp.datasets.factories import make_dataset
from tests.webapp.team_factories import join
from webapp.datasets import services
from webapp.datasets.models import Dataset

pytestmark = pytest.mark.django_db

REFUSED = [("charlie", "bob"), ("bob", "alice")]  # (who deletes, who created the dataset)
ALLOWED = [("bob", "bob"), ("alice", "bob")]


@pytest.fixture
def users(alice, alice_team, bob, charlie):
    join(alice_team, alice, bob)
    join(alice_team, alice, charlie)
    return {"alice": alice, "bob": bob, "charlie": charlie}


def made_by(users, team, creator: str) -> Dataset:
    dataset = make_dataset(team, name=f"{creator}'s corpus")
    Dataset.objects.filter(pk=dataset.pk).update(created_by=users[creator])
    dataset.refresh_from_db()
    return dataset


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("actor, creator", REFUSED)
def test_the_service_refuses_a_member_on_someone_elses_dataset(users, alice_team, actor, creator):
    dataset = made_by(users, alice_team, creator)
    with pytest.raises(PermissionDenied, match="owners"):
        services.dataset_delete(dataset=dataset, actor=users[actor])
    assert Dataset.objects.filter(pk=dataset.pk).exists() and dataset.directory.exists()


@pytest.mark.parametrize("actor, creator", REFUSED)
def test_the_page_refuses_a_member_on_someone_elses_dataset(users, alice_team, actor, creator):
    dataset = made_by(users, alice_team, creator)
    client = _client(users[actor])
    url = reverse("dataset_delete", args=[dataset.pk])
    assert client.get(url).status_code == 403
    assert client.post(url).status_code == 403
    assert url not in client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert Dataset.objects.filter(pk=dataset.pk).exists() and dataset.directory.exists()


@pytest.mark.parametrize("actor, creator", ALLOWED)
def test_the_creator_and_the_owners_delete_it(users, alice_team, actor, creator, django_capture_on_commit_callbacks):
    dataset = made_by(users, alice_team, creator)
    with django_capture_on_commit_callbacks(execute=True):
        services.dataset_delete(dataset=dataset, actor=users[actor])
    assert not Dataset.objects.filter(pk=dataset.pk).exists() and not dataset.directory.exists()


@pytest.mark.parametrize("actor, creator", ALLOWED)
def test_the_creators_and_the_owners_pages_delete_it(users, alice_team, actor, creator,
                                                     django_capture_on_commit_callbacks):
    dataset = made_by(users, alice_team, creator)
    client = _client(users[actor])
    url = reverse("dataset_delete", args=[dataset.pk])
    assert url in client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(url).status_code == 302
    assert not Dataset.objects.filter(pk=dataset.pk).exists() and not dataset.directory.exists()
