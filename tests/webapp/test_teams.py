"""Teams: a user sees only their teams; only owners manage members."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.urls import reverse

from webapp.accounts import services
from webapp.accounts.models import Membership, Team
from webapp.accounts.selectors import team_scoped_get

pytestmark = pytest.mark.django_db


def test_it_requires_login_for_every_team_page(client, alice_team):
    for url in [reverse("home"), reverse("team_list"), reverse("team_detail", args=[alice_team.pk])]:
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_it_logs_in_and_out(client, alice):
    response = client.post(reverse("login"), {"username": "alice", "password": "correct-horse-battery-staple"})
    assert response.status_code == 302
    assert client.get(reverse("home")).status_code == 200
    client.post(reverse("logout"))
    assert client.get(reverse("home")).status_code == 302


def test_it_answers_404_for_another_teams_page(alice_client, bob_team):
    assert alice_client.get(reverse("team_detail", args=[bob_team.pk])).status_code == 404
    response = alice_client.post(reverse("member_add", args=[bob_team.pk]), {"username": "alice", "role": "owner"})
    assert response.status_code == 404
    assert not bob_team.memberships.filter(user__username="alice").exists()


def test_it_scopes_objects_to_the_team(alice_team, bob_team):
    own = team_scoped_get(Membership.objects.all(), team=alice_team, user__username="alice")
    assert own.team == alice_team
    with pytest.raises(Http404):
        team_scoped_get(Membership.objects.all(), team=alice_team, user__username="bob")


def test_it_lets_an_owner_add_and_remove_members(alice_client, alice_team, bob):
    response = alice_client.post(reverse("member_add", args=[alice_team.pk]), {"username": "bob", "role": "member"})
    assert response.status_code == 302
    assert alice_team.memberships.filter(user=bob, role="member").exists()
    alice_client.post(reverse("member_remove", args=[alice_team.pk]), {"username": "bob"})
    assert not alice_team.memberships.filter(user=bob).exists()


def test_it_forbids_a_member_from_managing_members(alice, alice_team, bob, charlie):
    services.membership_add(team=alice_team, actor=alice, username="bob")
    with pytest.raises(PermissionDenied):
        services.membership_add(team=alice_team, actor=bob, username="charlie")
    with pytest.raises(PermissionDenied):
        services.membership_remove(team=alice_team, actor=bob, username="alice")


def test_it_shows_a_member_no_management_forms(alice, alice_team, bob, bob_client):
    services.membership_add(team=alice_team, actor=alice, username="bob")
    page = bob_client.get(reverse("team_detail", args=[alice_team.pk])).content.decode()
    assert "alice" in page and "Add a member" not in page


def test_it_keeps_the_last_owner(alice, alice_team):
    with pytest.raises(ValidationError, match="at least one owner"):
        services.membership_remove(team=alice_team, actor=alice, username="alice")


def test_it_rejects_unknown_users_and_duplicates(alice, alice_team, bob):
    with pytest.raises(ValidationError, match="no user called 'nobody'"):
        services.membership_add(team=alice_team, actor=alice, username="nobody")
    services.membership_add(team=alice_team, actor=alice, username="bob")
    with pytest.raises(ValidationError, match="already in"):
        services.membership_add(team=alice_team, actor=alice, username="bob")


def test_it_switches_between_the_users_teams_only(alice, alice_client, alice_team, bob_team):
    second = services.team_create(name="Alice second lab", owner=alice)
    alice_client.post(reverse("team_switch"), {"team": second.pk})
    assert alice_client.get(reverse("home")).context["current_team"] == second
    assert alice_client.post(reverse("team_switch"), {"team": bob_team.pk}).status_code == 404
    assert alice_client.get(reverse("home")).context["current_team"] == second


def test_it_creates_a_team_owned_by_its_creator(charlie, client):
    client.force_login(charlie)
    client.post(reverse("team_list"), {"name": "Charlie lab"})
    team = Team.objects.get(name="Charlie lab")
    assert team.memberships.get(user=charlie).role == Membership.Role.OWNER


def test_it_renders_team_names_inert(alice):
    team = services.team_create(name="<script>alert(1)</script>", owner=alice)
    from django.test import Client

    client = Client()
    client.force_login(alice)
    page = client.get(reverse("team_detail", args=[team.pk])).content.decode()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_it_checks_csrf_on_team_forms(alice, alice_team):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(reverse("member_add", args=[alice_team.pk]), {"username": "alice"})
    assert response.status_code == 403
