"""Password guessing is throttled on the login page and the admin's: after five wrong passwords for a username,
even the right one is refused until the cool-off ends or an administrator resets the lockout."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db
FAILURE_LIMIT = 5


def log_in(client: Client, url: str, username: str, password: str):
    return client.post(url, {"username": username, "password": password})


def guess_wrong(client: Client, url: str, username: str, times: int = FAILURE_LIMIT) -> list[int]:
    """The status of each wrong guess: the form again (200) until the one that reaches the limit (429)."""
    return [log_in(client, url, username, "wrong-guess").status_code for _ in range(times)]


def test_it_refuses_the_right_password_after_five_wrong_ones(alice, client):
    assert guess_wrong(client, reverse("login"), "alice") == [200] * (FAILURE_LIMIT - 1) + [429]
    response = log_in(client, reverse("login"), "alice", PASSWORD)
    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed logins for alice" in page and "locked for 15 minutes" in page
    assert "_auth_user_id" not in client.session


def test_it_lets_the_user_in_after_an_administrator_resets_the_lockout(alice, client):
    guess_wrong(client, reverse("login"), "alice")
    assert log_in(client, reverse("login"), "alice", PASSWORD).status_code == 429
    call_command("axes_reset", verbosity=0)
    response = log_in(client, reverse("login"), "alice", PASSWORD)
    assert response.status_code == 302 and response["Location"] == reverse("home")
    assert client.session["_auth_user_id"] == str(alice.pk)


def test_it_counts_wrong_passwords_only_since_the_last_successful_login(alice, client):
    assert guess_wrong(client, reverse("login"), "alice", times=FAILURE_LIMIT - 1) == [200] * (FAILURE_LIMIT - 1)
    assert log_in(client, reverse("login"), "alice", PASSWORD).status_code == 302
    client.post(reverse("logout"))
    assert guess_wrong(client, reverse("login"), "alice", times=FAILURE_LIMIT - 1) == [200] * (FAILURE_LIMIT - 1)
    assert log_in(client, reverse("login"), "alice", PASSWORD).status_code == 302


def test_it_locks_one_username_without_locking_the_others(alice, bob, client):
    guess_wrong(client, reverse("login"), "alice")
    assert log_in(client, reverse("login"), "alice", PASSWORD).status_code == 429
    assert log_in(Client(), reverse("login"), "bob", PASSWORD).status_code == 302


def test_it_throttles_the_admin_login_too(django_user_model, client):
    django_user_model.objects.create_user(username="oscar", password=PASSWORD, is_staff=True)
    assert guess_wrong(client, reverse("admin:login"), "oscar") == [200] * (FAILURE_LIMIT - 1) + [429]
    response = log_in(client, reverse("admin:login"), "oscar", PASSWORD)
    assert response.status_code == 429 and "Too many failed logins for oscar" in response.content.decode()
    call_command("axes_reset_username", "oscar", verbosity=0)
    assert log_in(client, reverse("admin:login"), "oscar", PASSWORD).status_code == 302
