"""Personal access tokens: shown once and stored hashed, scoped, expiring, revocable; and the page that makes
and revokes them."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.webapp.api.conftest import Api, api_for
from webapp.api.models import AccessToken
from webapp.api.tokens import token_create

pytestmark = pytest.mark.django_db


def test_a_token_made_on_the_page_is_shown_once_stored_hashed_and_works(alice, alice_client):
    assert reverse("api_tokens") in alice_client.get(reverse("team_list")).content.decode()  # every page links it
    response = alice_client.post(reverse("api_tokens"), {"name": "laptop", "scope": "read", "days": 7})
    assert response.status_code == 200
    secret = re.search(r'<code id="token-secret">([^<]+)</code>', response.content.decode()).group(1)
    token = AccessToken.objects.get(user=alice)
    assert secret.startswith("hyd_") and token.prefix == secret[:12]
    assert secret not in {token.digest, token.prefix} and len(token.digest) == 64
    assert timedelta(days=6, hours=23) < token.expires - timezone.now() <= timedelta(days=7)
    again = alice_client.get(reverse("api_tokens")).content.decode()
    assert secret not in again and token.prefix in again  # never shown again; its start tells it apart

    me = Api(secret).get("/me")
    assert me.status_code == 200
    assert me.json()["username"] == "alice" and me.json()["scope"] == "read"
    assert me.json()["team"]["name"] == "Alice lab" and me.json()["team"]["role"] == "owner"


@pytest.mark.parametrize("fields, error", [
    ({"name": "", "scope": "read", "days": 7}, "This field is required."),
    ({"name": "x", "scope": "admin", "days": 7}, "Select a valid choice."),
    ({"name": "x", "scope": "read", "days": 0}, "greater than or equal to 1"),
    ({"name": "x", "scope": "read", "days": 5000}, "less than or equal to 366"),
])
def test_the_page_refuses_a_bad_token_form_with_its_reason(alice, alice_client, fields, error):
    response = alice_client.post(reverse("api_tokens"), fields)
    assert response.status_code == 400
    assert error in response.content.decode()
    assert not AccessToken.objects.exists()


def test_without_a_live_token_every_call_is_401(alice):
    _, secret = token_create(user=alice, name="ci", scope="write", days=1)
    assert Client().get("/api/v1/me").status_code == 401
    assert Api("hyd_not-a-token").get("/me").status_code == 401
    assert Api("Basic something").get("/me").status_code == 401
    token = AccessToken.objects.get()
    AccessToken.objects.filter(pk=token.pk).update(expires=timezone.now() - timedelta(seconds=1))
    expired = Api(secret).get("/me")
    assert expired.status_code == 401 and "revoked or expired" in expired.json()["detail"]
    assert expired["WWW-Authenticate"] == "Bearer"


def test_a_revoked_token_is_401_at_once_and_only_its_owner_revokes_it(alice, bob, alice_client, bob_client):
    _, secret = token_create(user=alice, name="ci", scope="write", days=30)
    token = AccessToken.objects.get()
    assert Api(secret).get("/me").status_code == 200
    assert bob_client.post(reverse("api_token_revoke", args=[token.pk])).status_code == 404
    assert Api(secret).get("/me").status_code == 200
    assert alice_client.post(reverse("api_token_revoke", args=[token.pk])).status_code == 302
    assert Api(secret).get("/me").status_code == 401
    assert "revoked" in alice_client.get(reverse("api_tokens")).content.decode()


def test_a_deactivated_users_tokens_stop_working(alice):
    api = api_for(alice)
    alice.is_active = False
    alice.save()
    assert api.get("/me").status_code == 401


def test_a_read_token_reads_and_may_not_write(alice, alice_dataset):
    api = api_for(alice, scope="read")
    assert api.get("/datasets").status_code == 200
    refused = api.post(f"/experiments/{999}/launch")
    assert refused.status_code == 403 and "only read" in refused.json()["detail"]
    assert api.upload("/datasets", {"source": "sample"}).status_code == 403


def test_a_token_records_when_it_was_last_used(alice):
    api = api_for(alice)
    assert AccessToken.objects.get().last_used is None
    api.get("/me")
    assert AccessToken.objects.get().last_used is not None
