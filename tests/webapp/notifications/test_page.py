"""The team's notification page: owners set addresses and webhooks (refused when the administrator does not allow
the address), see the signing secret once and replace it; members only read; other teams cannot reach it."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.notifications.conftest import notify_settings
from tests.webapp.team_factories import join
from webapp.notifications.models import NotificationSettings

pytestmark = pytest.mark.django_db


@pytest.fixture
def loopback_allowed(settings) -> None:
    """Webhooks may reach 127.0.0.1 on port 9, the port these tests' URLs name (they are saved, never sent)."""
    notify_settings(settings, allowed="127.0.0.1:9")


def _url(team) -> str:
    return reverse("notification_settings", args=[team.pk])


def _save(client, team, *, emails="", webhook_urls=""):
    return client.post(_url(team), {"emails": emails, "webhook_urls": webhook_urls})


def test_the_team_page_links_to_it_and_an_owner_saves_addresses_and_sees_the_new_secret_once(
        alice_client, alice_team, loopback_allowed):
    team_page = alice_client.get(reverse("team_detail", args=[alice_team.pk])).content.decode()
    assert f'href="{_url(alice_team)}"' in team_page

    answer = _save(alice_client, alice_team, emails="ops@lab.example\npi@lab.example, ops@lab.example",
                   webhook_urls="http://127.0.0.1:9/hook")
    assert answer.status_code == 200
    row = NotificationSettings.objects.get(team=alice_team)
    assert row.emails == ["ops@lab.example", "pi@lab.example"] and row.webhook_urls == ["http://127.0.0.1:9/hook"]
    assert row.secret.startswith("hydra_whsec_") and len(row.secret) > 40
    assert row.secret in answer.content.decode() and "not shown again" in answer.content.decode()

    page = alice_client.get(_url(alice_team)).content.decode()
    assert row.secret not in page and row.secret_hint in page
    assert "ops@lab.example" in page and "http://127.0.0.1:9/hook" in page

    assert _save(alice_client, alice_team, emails="ops@lab.example", webhook_urls="http://127.0.0.1:9/hook"
                 ).status_code == 302  # no new secret, nothing to show once
    rotated = alice_client.post(reverse("notification_secret_rotate", args=[alice_team.pk]))
    new = NotificationSettings.objects.get(team=alice_team).secret
    assert new != row.secret and new in rotated.content.decode()


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:8000/hook", "does not allow webhooks to 127.0.0.1"),
    ("http://localhost:8000/hook", "does not allow webhooks to localhost (it resolves to"),
    ("http://169.254.169.254/latest/meta-data/", "does not allow webhooks to 169.254.169.254"),
    ("ftp://hooks.example.org/", "not an http:// or https:// URL"),
])
def test_an_address_the_administrator_does_not_allow_is_refused_on_save(alice_client, alice_team, settings, url, why):
    notify_settings(settings, allowed="192.0.2.0/24")
    answer = _save(alice_client, alice_team, webhook_urls=url)
    assert answer.status_code == 400
    assert why in answer.content.decode()
    assert not NotificationSettings.objects.filter(team=alice_team).exists()


def test_with_no_allowlist_the_form_says_no_webhook_can_be_saved(alice_client, alice_team):
    page = alice_client.get(_url(alice_team)).content.decode()
    assert "The administrator allows no webhook addresses yet" in page
    answer = _save(alice_client, alice_team, emails="not-an-address", webhook_urls="https://hooks.example.org/x")
    assert answer.status_code == 400
    assert "allows no webhook addresses" in answer.content.decode()
    assert "&#x27;not-an-address&#x27; is not an e-mail address" in answer.content.decode()


def test_a_member_reads_without_the_secret_or_the_webhooks_path_and_cannot_change_them(
        alice, alice_client, alice_team, django_user_model, loopback_allowed):
    _save(alice_client, alice_team, emails="ops@lab.example", webhook_urls="http://127.0.0.1:9/hook?token=s3cret")
    member = django_user_model.objects.create(username="dana")
    join(alice_team, alice, member)
    client = Client()
    client.force_login(member)

    page = client.get(_url(alice_team)).content.decode()
    assert "ops@lab.example" in page and "http://127.0.0.1:9/…" in page and "s3cret" not in page
    assert 'id="notification-form"' not in page and 'id="rotate-form"' not in page
    assert _save(client, alice_team, emails="dana@lab.example").status_code == 403
    assert client.post(reverse("notification_secret_rotate", args=[alice_team.pk])).status_code == 403
    assert NotificationSettings.objects.get(team=alice_team).emails == ["ops@lab.example"]


def test_another_team_cannot_reach_the_page(alice_team, bob_client, loopback_allowed):
    assert bob_client.get(_url(alice_team)).status_code == 404
    assert _save(bob_client, alice_team, emails="bob@lab.example").status_code == 404
    assert bob_client.post(reverse("notification_secret_rotate", args=[alice_team.pk])).status_code == 404
    assert not NotificationSettings.objects.filter(team=alice_team).exists()
