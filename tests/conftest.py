"""Shared fixtures: named users in separate teams, and the Redis that `make test` provides."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.test import Client

from webapp.accounts.models import Membership, Team

PASSWORD = "correct-horse-battery-staple"

# Fixtures that start real processes (Celery device workers, the web worker, the whole stack, Chromium): a
# test using one is marked `processes`, and slow, which `make test-fast` (``-m "not slow"``) leaves out. A
# whole `make test` runs the `processes` tests in one pytest and the others beside it (scripts/devstack.py).
PROCESS_FIXTURES = frozenset({"device_workers", "shared_device_workers", "web_worker", "notify_worker", "devstack",
                              "browser", "page"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)
        if item.get_closest_marker("processes"):
            item.add_marker(pytest.mark.slow)


@functools.cache
def _password_hash() -> str:
    """PASSWORD hashed once per run: hashing it for every user of every test costs about a second each."""
    return make_password(PASSWORD)


def _user(django_user_model, username: str):
    return django_user_model.objects.create(username=username, password=_password_hash())


@pytest.fixture
def alice(django_user_model):
    user = _user(django_user_model, "alice")
    team = Team.objects.create(name="Alice lab")
    Membership.objects.create(team=team, user=user, role=Membership.Role.OWNER, is_current=True)
    return user


@pytest.fixture
def bob(django_user_model):
    user = _user(django_user_model, "bob")
    team = Team.objects.create(name="Bob lab")
    Membership.objects.create(team=team, user=user, role=Membership.Role.OWNER, is_current=True)
    return user


@pytest.fixture
def charlie(django_user_model):
    """A user in no team."""
    return _user(django_user_model, "charlie")


@pytest.fixture
def alice_team(alice) -> Team:
    return Team.objects.get(name="Alice lab")


@pytest.fixture
def bob_team(bob) -> Team:
    return Team.objects.get(name="Bob lab")


@pytest.fixture
def alice_client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob) -> Client:
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def redis_url() -> str:
    return settings.HYDRA.worker.redis_url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()
