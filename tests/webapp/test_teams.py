"""Teams: a user sees only their teams, joins one only by accepting an invitation, works in the team they
chose and no other, and only owners manage members."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps as django_apps
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.test import Client
from django.urls import reverse

from tests.webapp.team_factories import join
from webapp.accounts import services
from webapp.accounts.models import Invitation, Membership, Team
from webapp.accounts.selectors import current_team, team_scoped_get
from webapp.accounts.views import INVITED

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
    assert not Invitation.objects.exists()


def test_it_scopes_objects_to_the_team(alice_team, bob_team):
    own = team_scoped_get(Membership.objects.all(), team=alice_team, user__username="alice")
    assert own.team == alice_team
    with pytest.raises(Http404):
        team_scoped_get(Membership.objects.all(), team=alice_team, user__username="bob")


def test_it_switches_between_the_users_teams_only(alice, alice_client, alice_team, bob_team):
    second = services.team_create(name="Alice second lab", owner=alice)
    assert alice_client.get(reverse("home")).context["current_team"] == second  # she made it: she works in it
    alice_client.post(reverse("team_switch"), {"team": alice_team.pk})
    assert alice_client.get(reverse("home")).context["current_team"] == alice_team
    assert alice_client.post(reverse("team_switch"), {"team": bob_team.pk}).status_code == 404
    assert alice_client.get(reverse("home")).context["current_team"] == alice_team


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


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _messages(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_an_invitation_adds_nobody_until_the_invitee_accepts(alice_client, alice_team, bob, bob_team):
    response = alice_client.post(reverse("member_add", args=[alice_team.pk]), {"username": "bob", "role": "owner"},
                                 follow=True)
    assert _messages(response) == [INVITED]
    assert not alice_team.memberships.filter(user=bob).exists()

    bob_client = _client(bob)
    invitation = Invitation.objects.get(team=alice_team, username="bob")
    page = bob_client.get(reverse("team_list")).content.decode()
    assert "Alice lab" in page and reverse("invitation_accept", args=[invitation.pk]) in page
    bob_client.post(reverse("invitation_accept", args=[invitation.pk]))
    assert alice_team.memberships.get(user=bob).role == Membership.Role.OWNER
    assert not Invitation.objects.exists()
    assert current_team(user=bob) == bob_team  # joining is not switching: his work still goes to his own team


def test_the_answer_does_not_say_whether_a_username_exists(alice_client, alice_team, bob):
    answers = []
    for username in ["bob", "nobody-by-that-name"]:
        response = alice_client.post(reverse("member_add", args=[alice_team.pk]),
                                     {"username": username, "role": "member"}, follow=True)
        answers.append((response.status_code, response.redirect_chain, _messages(response)))
    assert answers[0] == answers[1]
    pending = alice_client.get(reverse("team_detail", args=[alice_team.pk])).content.decode()
    assert "bob" in pending and "nobody-by-that-name" in pending  # the pending list shows both alike


def test_the_invitee_may_decline(alice, alice_team, bob):
    services.invitation_send(team=alice_team, actor=alice, username="bob")
    invitation = Invitation.objects.get()
    _client(bob).post(reverse("invitation_decline", args=[invitation.pk]))
    assert not Invitation.objects.exists() and not alice_team.memberships.filter(user=bob).exists()


def test_only_the_invitee_answers_an_invitation(alice, alice_client, alice_team, bob, charlie):
    services.invitation_send(team=alice_team, actor=alice, username="bob", role="owner")
    invitation = Invitation.objects.get()
    for client in [_client(charlie), alice_client]:
        for url in ["invitation_accept", "invitation_decline"]:
            assert client.post(reverse(url, args=[invitation.pk])).status_code == 404
    with pytest.raises(Http404):
        services.invitation_accept(user=charlie, invitation_id=invitation.pk)
    assert Invitation.objects.filter(pk=invitation.pk).exists()
    assert set(alice_team.memberships.values_list("user__username", flat=True)) == {"alice"}


def test_an_owner_withdraws_an_invitation(alice, alice_client, alice_team, bob):
    services.invitation_send(team=alice_team, actor=alice, username="bob")
    invitation = Invitation.objects.get()
    alice_client.post(reverse("invitation_withdraw", args=[alice_team.pk, invitation.pk]))
    assert not Invitation.objects.exists()
    with pytest.raises(Http404):
        services.invitation_accept(user=bob, invitation_id=invitation.pk)


def test_it_refuses_to_invite_a_member_again(alice, alice_team, bob):
    join(alice_team, alice, bob)
    with pytest.raises(ValidationError, match="already in"):
        services.invitation_send(team=alice_team, actor=alice, username="bob")


def _team_state(team: Team) -> tuple[object, ...]:
    return (sorted(team.memberships.values_list("user__username", "role")),
            sorted(Invitation.objects.filter(team=team).values_list("username", "role")))


MEMBER_ACTIONS = {
    "invite": ("member_add", {"username": "dave", "role": "owner"},
               lambda team, actor: services.invitation_send(team=team, actor=actor, username="dave", role="owner")),
    "remove a member": ("member_remove", {"username": "alice"},
                        lambda team, actor: services.membership_remove(team=team, actor=actor, username="alice")),
    "demote an owner": ("member_role", {"username": "alice", "role": "member"},
                        lambda team, actor: services.membership_role_set(team=team, actor=actor, username="alice",
                                                                         role="member")),
    "promote oneself": ("member_role", {"username": "bob", "role": "owner"},
                        lambda team, actor: services.membership_role_set(team=team, actor=actor, username="bob",
                                                                         role="owner")),
}


@pytest.mark.parametrize("name", MEMBER_ACTIONS)
def test_a_member_may_not_manage_the_team(alice, alice_team, bob, name):
    join(alice_team, alice, bob)
    services.invitation_send(team=alice_team, actor=alice, username="erin")
    url_name, data, call = MEMBER_ACTIONS[name]
    before = _team_state(alice_team)
    with pytest.raises(PermissionDenied, match="Only the team's owners"):
        call(alice_team, bob)
    assert _team_state(alice_team) == before
    assert _client(bob).post(reverse(url_name, args=[alice_team.pk]), data).status_code == 403
    assert _team_state(alice_team) == before


def test_a_member_may_not_withdraw_an_invitation(alice, alice_team, bob):
    join(alice_team, alice, bob)
    services.invitation_send(team=alice_team, actor=alice, username="erin")
    invitation = Invitation.objects.get(username="erin")
    with pytest.raises(PermissionDenied):
        services.invitation_withdraw(team=alice_team, actor=bob, invitation_id=invitation.pk)
    url = reverse("invitation_withdraw", args=[alice_team.pk, invitation.pk])
    assert _client(bob).post(url).status_code == 403
    assert Invitation.objects.filter(pk=invitation.pk).exists()


def test_it_shows_a_member_no_management_forms(alice, alice_team, bob):
    join(alice_team, alice, bob)
    page = _client(bob).get(reverse("team_detail", args=[alice_team.pk])).content.decode()
    assert "alice" in page and "Invite someone" not in page and "Remove" not in page


def test_an_owner_removes_members_and_changes_roles_but_keeps_an_owner(alice, alice_client, alice_team, bob):
    join(alice_team, alice, bob)
    alice_client.post(reverse("member_role", args=[alice_team.pk]), {"username": "bob", "role": "owner"})
    assert alice_team.memberships.get(user=bob).role == Membership.Role.OWNER
    services.membership_role_set(team=alice_team, actor=bob, username="alice", role="member")
    with pytest.raises(ValidationError, match="at least one owner"):
        services.membership_role_set(team=alice_team, actor=bob, username="bob", role="member")
    with pytest.raises(ValidationError, match="at least one owner"):
        services.membership_remove(team=alice_team, actor=bob, username="bob")
    _client(bob).post(reverse("member_remove", args=[alice_team.pk]), {"username": "alice"})
    assert list(alice_team.memberships.values_list("user__username", "role")) == [("bob", "owner")]


def test_joining_a_team_never_moves_the_users_work_into_it(alice, alice_client, alice_team, charlie):
    # A team whose name sorts first ("AAA ...") used to become the current team of anyone added to it.
    helpdesk = services.team_create(name="AAA helpdesk", owner=charlie)
    services.invitation_send(team=helpdesk, actor=charlie, username="alice")
    assert alice_client.get(reverse("dataset_list")).context["current_team"] == alice_team
    alice_client.post(reverse("invitation_accept", args=[Invitation.objects.get().pk]))
    assert helpdesk.memberships.filter(user=alice).exists()
    for url in [reverse("dataset_list"), reverse("experiment_list"), reverse("team_list")]:
        assert alice_client.get(url).context["current_team"] == alice_team, url


def test_a_user_whose_team_is_not_chosen_is_asked_to_choose(alice, alice_client, alice_team, charlie):
    helpdesk = services.team_create(name="AAA helpdesk", owner=charlie)
    join(helpdesk, charlie, alice)  # alice chose to work in it ...
    services.membership_remove(team=helpdesk, actor=charlie, username="alice")  # ... and was removed
    assert current_team(user=alice) is None  # not her other team, nor the first by name
    for url in [reverse("dataset_list"), reverse("experiment_list"), reverse("experiment_create")]:
        response = alice_client.get(url, follow=True)
        assert response.redirect_chain == [(reverse("team_list"), 302)], url
        assert _messages(response) == ["Choose the team to work in first."], url
    response = alice_client.post(reverse("dataset_list"), {"name": "secret", "source": "sample"})
    assert response.status_code == 302 and not alice_team.datasets.exists()
    page = alice_client.get(reverse("team_list")).content.decode()
    assert "Choose a team…" in page and "Work in this team" in page
    alice_client.post(reverse("team_switch"), {"team": alice_team.pk})
    assert alice_client.get(reverse("dataset_list")).status_code == 200


def test_accepting_with_no_team_chosen_makes_it_the_users_team(alice, alice_team, charlie):
    services.invitation_send(team=alice_team, actor=alice, username="charlie")
    services.invitation_accept(user=charlie, invitation_id=Invitation.objects.get().pk)
    assert current_team(user=charlie) == alice_team


def test_the_demo_user_never_joins_someone_elses_team(alice):
    services.team_create(name="Demo lab", owner=alice)
    demo, created = services.demo_team_ensure(username="demo", password="pw-for-the-demo", team_name="Demo lab")
    assert created
    assert current_team(user=demo).name == "Demo lab 2"
    assert list(Team.objects.get(name="Demo lab").memberships.values_list("user__username", flat=True)) == ["alice"]


def test_upgrading_gives_a_current_team_only_to_users_with_one_team(alice, alice_team, bob, bob_team, charlie):
    migration = importlib.import_module("webapp.accounts.migrations.0002_invitations_current_team")
    join(bob_team, bob, alice)  # alice is in two teams, bob in one, charlie in none
    Membership.objects.update(is_current=False)  # as every membership was before the upgrade
    migration.current_team_for_single_team_users(django_apps, None)
    assert list(Membership.objects.filter(is_current=True).values_list("user__username", "team__name")) == [
        ("bob", "Bob lab")]
