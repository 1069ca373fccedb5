"""Password guessing is throttled on the login page and the admin's: five wrong passwords for a username from one
address refuse even the right one from that address until the cool-off ends or an administrator resets the
lockout; many wrong passwords from one address, for any usernames, lock that address for everyone. The address is
the connection's, or behind declared proxies the one the outermost proxy wrote into X-Forwarded-For."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.test import Client, RequestFactory
from django.urls import reverse

from tests.conftest import PASSWORD
from webapp.accounts.login_throttle import client_address

pytestmark = pytest.mark.django_db
FAILURE_LIMIT = 5
HOME = "198.51.100.7"  # where the guesses come from
ELSEWHERE = "203.0.113.9"
PROXY = "10.0.0.1"


def log_in(client: Client, url: str, username: str, password: str, **meta: str):
    return client.post(url, {"username": username, "password": password}, **meta)


def guess_wrong(client: Client, url: str, username: str, times: int = FAILURE_LIMIT, **meta: str) -> list[int]:
    """The status of each wrong guess: the form again (200) until the one that reaches the limit (429)."""
    return [log_in(client, url, username, "wrong-guess", **meta).status_code for _ in range(times)]


def spray(client: Client, usernames: int) -> list[int]:
    """The status of one wrong guess for each of that many usernames, none of them a user's."""
    return [log_in(client, reverse("login"), f"user{n}", "wrong-guess").status_code for n in range(usernames)]


def test_it_refuses_the_right_password_after_five_wrong_ones(alice, client):
    assert guess_wrong(client, reverse("login"), "alice") == [200] * (FAILURE_LIMIT - 1) + [429]
    response = log_in(client, reverse("login"), "alice", PASSWORD)
    assert response.status_code == 429
    page = response.content.decode()
    assert "logging in as alice from your address is locked for 15 minutes" in page
    assert "_auth_user_id" not in client.session


def test_it_lets_the_user_in_from_another_address_while_one_is_locked(alice):
    guesser = Client(REMOTE_ADDR=HOME)
    assert guess_wrong(guesser, reverse("login"), "alice") == [200] * (FAILURE_LIMIT - 1) + [429]
    assert log_in(guesser, reverse("login"), "alice", PASSWORD).status_code == 429
    user = Client(REMOTE_ADDR=ELSEWHERE)
    response = log_in(user, reverse("login"), "alice", PASSWORD)
    assert response.status_code == 302 and response["Location"] == reverse("home")
    assert user.session["_auth_user_id"] == str(alice.pk)
    assert log_in(Client(REMOTE_ADDR=HOME), reverse("login"), "alice", PASSWORD).status_code == 429


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


def test_it_locks_one_username_without_locking_the_others_at_the_same_address(alice, bob, client):
    guess_wrong(client, reverse("login"), "alice")
    assert log_in(client, reverse("login"), "alice", PASSWORD).status_code == 429
    assert log_in(Client(), reverse("login"), "bob", PASSWORD).status_code == 302


def test_it_locks_an_address_that_guesses_across_many_usernames(alice, settings):
    settings.LOGIN_FAILURES_PER_ADDRESS = 6
    sprayer = Client(REMOTE_ADDR=HOME)
    assert spray(sprayer, 6) == [200] * 5 + [429]
    assert log_in(Client(REMOTE_ADDR=HOME), reverse("login"), "alice", PASSWORD).status_code == 429
    assert log_in(Client(REMOTE_ADDR=ELSEWHERE), reverse("login"), "alice", PASSWORD).status_code == 302
    call_command("axes_reset_ip", HOME, verbosity=0)
    assert log_in(Client(REMOTE_ADDR=HOME), reverse("login"), "alice", PASSWORD).status_code == 302


def test_it_keeps_counting_an_address_across_a_successful_login_there(alice, settings):
    settings.LOGIN_FAILURES_PER_ADDRESS = 6
    sprayer = Client(REMOTE_ADDR=HOME)
    assert spray(sprayer, 5) == [200] * 5
    assert log_in(sprayer, reverse("login"), "alice", PASSWORD).status_code == 302
    sprayer.post(reverse("logout"))
    assert log_in(sprayer, reverse("login"), "mallory", "wrong-guess").status_code == 429


def test_it_reads_the_address_from_x_forwarded_for_behind_a_declared_proxy(alice, settings):
    settings.TRUSTED_PROXY_COUNT = 1
    proxy = Client(REMOTE_ADDR=PROXY)
    assert guess_wrong(proxy, reverse("login"), "alice", HTTP_X_FORWARDED_FOR=HOME)[-1] == 429
    # A client-written entry left of the proxy's does not move the guesser elsewhere.
    forged = f"{ELSEWHERE}, {HOME}"
    assert log_in(proxy, reverse("login"), "alice", PASSWORD, HTTP_X_FORWARDED_FOR=forged).status_code == 429
    response = log_in(proxy, reverse("login"), "alice", PASSWORD, HTTP_X_FORWARDED_FOR=ELSEWHERE)
    assert response.status_code == 302


def test_it_ignores_x_forwarded_for_without_a_declared_proxy(alice, client):
    forged = [{"HTTP_X_FORWARDED_FOR": f"192.0.2.{n}"} for n in range(FAILURE_LIMIT + 1)]
    statuses = [log_in(client, reverse("login"), "alice", "wrong-guess", **meta).status_code for meta in forged]
    assert statuses == [200] * (FAILURE_LIMIT - 1) + [429, 429]
    response = log_in(client, reverse("login"), "alice", PASSWORD, HTTP_X_FORWARDED_FOR=ELSEWHERE)
    assert response.status_code == 429


@pytest.mark.parametrize(
    ("proxies", "forwarded_for", "address"),
    [
        (0, HOME, PROXY),
        (1, HOME, HOME),
        (1, f"{ELSEWHERE}, {HOME}", HOME),
        (2, f"{ELSEWHERE}, {HOME}, 10.0.0.2", HOME),
        (2, HOME, PROXY),  # fewer entries than proxies: it did not come through them all
        (1, "", PROXY),
        (1, "unknown", PROXY),
        (1, "2001:db8::1", "2001:db8::1"),
    ],
)
def test_it_takes_the_address_the_outermost_trusted_proxy_saw(settings, proxies, forwarded_for, address):
    settings.TRUSTED_PROXY_COUNT = proxies
    request = RequestFactory().post(reverse("login"), REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=forwarded_for)
    assert client_address(request) == address


def test_it_throttles_the_admin_login_too(django_user_model, client):
    django_user_model.objects.create_user(username="oscar", password=PASSWORD, is_staff=True)
    assert guess_wrong(client, reverse("admin:login"), "oscar") == [200] * (FAILURE_LIMIT - 1) + [429]
    response = log_in(client, reverse("admin:login"), "oscar", PASSWORD)
    assert response.status_code == 429 and "logging in as oscar" in response.content.decode()
    call_command("axes_reset_username", "oscar", verbosity=0)
    assert log_in(client, reverse("admin:login"), "oscar", PASSWORD).status_code == 302
