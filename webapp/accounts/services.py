"""Writes about teams, invitations and memberships. Permission checks live here, not in views.

Membership is by consent: an owner invites a username (`invitation_send`), and only the invitee's
`invitation_accept` adds them. Nothing here tells an owner whether a username belongs to anyone.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import Http404

from webapp.accounts.models import Invitation, Membership, Team
from webapp.accounts.roles import require_owner
from webapp.accounts.selectors import team_for_user


def team_create(*, name: str, owner: AbstractBaseUser) -> Team:
    """Create a team owned by `owner`, who starts working in it. Raises ValidationError for a bad name."""
    name = name.strip()
    if not name:
        raise ValidationError("A team needs a name.")
    if Team.objects.filter(name__iexact=name).exists():
        raise ValidationError(f"A team named {name!r} already exists.")
    with transaction.atomic():
        team = Team.objects.create(name=name)
        Membership.objects.create(team=team, user=owner, role=Membership.Role.OWNER)
        current_team_set(user=owner, team_id=team.pk)
    return team


def current_team_set(*, user: AbstractBaseUser, team_id: int) -> Team:
    """Make team `team_id` the one `user` works in. Raises Http404 unless they belong to it."""
    team = team_for_user(user=user, team_id=team_id)
    with transaction.atomic():
        list(Membership.objects.select_for_update().filter(user=user))  # two switches at once: one waits
        Membership.objects.filter(user=user, is_current=True).exclude(team=team).update(is_current=False)
        Membership.objects.filter(user=user, team=team).update(is_current=True)
    return team


def _role_check(role: str) -> None:
    if role not in Membership.Role.values:
        raise ValidationError(f"Unknown role {role!r}; use one of {Membership.Role.values}.")


def invitation_send(
    *, team: Team, actor: AbstractBaseUser, username: str, role: str = Membership.Role.MEMBER
) -> None:
    """Invite `username` to `team` with `role`; only an owner may (PermissionDenied otherwise).

    Sending again updates the role. The answer is the same whether or not an account has that name, so an
    owner cannot use it to find out which usernames exist. Raises ValidationError for an empty name, an
    unknown role, or someone already in the team (whom the owner can see in the member list anyway).
    """
    require_owner(user=actor, team=team, action="invite people")
    _role_check(role)
    username = username.strip()
    if not username:
        raise ValidationError("Give the username to invite.")
    if Membership.objects.filter(team=team, user__username=username).exists():
        raise ValidationError(f"{username} is already in {team.name}.")
    Invitation.objects.update_or_create(team=team, username=username,
                                        defaults={"role": role, "invited_by": actor})


def invitation_withdraw(*, team: Team, actor: AbstractBaseUser, invitation_id: int) -> None:
    """Withdraw a pending invitation to `team`; only an owner may. Raises Http404 for another team's."""
    require_owner(user=actor, team=team, action="withdraw invitations")
    deleted, _ = Invitation.objects.filter(team=team, pk=invitation_id).delete()
    if not deleted:
        raise Http404("No such invitation.")


def _invitation_for(*, user: AbstractBaseUser, invitation_id: int) -> Invitation:
    invitation = Invitation.objects.select_related("team").filter(
        pk=invitation_id, username=user.get_username()).first()
    if invitation is None:
        raise Http404("No such invitation.")
    return invitation


def invitation_accept(*, user: AbstractBaseUser, invitation_id: int) -> Membership:
    """Join the team `user` was invited to, with the invited role. Raises Http404 unless the invitation is
    addressed to `user`. A user with no current team starts working in the one they joined; a user who has
    one keeps it."""
    with transaction.atomic():
        invitation = _invitation_for(user=user, invitation_id=invitation_id)
        membership, _ = Membership.objects.get_or_create(team=invitation.team, user=user,
                                                         defaults={"role": invitation.role})
        invitation.delete()
        if not Membership.objects.filter(user=user, is_current=True).exists():
            current_team_set(user=user, team_id=invitation.team.pk)
    membership.refresh_from_db()
    return membership


def invitation_decline(*, user: AbstractBaseUser, invitation_id: int) -> Team:
    """Decline an invitation addressed to `user` (Http404 otherwise); returns the team it was from."""
    invitation = _invitation_for(user=user, invitation_id=invitation_id)
    invitation.delete()
    return invitation.team


def _lock(team: Team) -> None:
    """Serialize changes to `team`'s members, so two of them cannot together remove its last owner."""
    Team.objects.select_for_update().filter(pk=team.pk).first()


def _owner_count(team: Team) -> int:
    return Membership.objects.filter(team=team, role=Membership.Role.OWNER).count()


def membership_remove(*, team: Team, actor: AbstractBaseUser, username: str) -> None:
    """Remove `username` from `team`; only an owner may, and the last owner cannot leave the team ownerless."""
    require_owner(user=actor, team=team, action="remove members")
    with transaction.atomic():
        _lock(team)
        membership = Membership.objects.filter(team=team, user__username=username).first()
        if membership is None:
            raise ValidationError(f"{username!r} is not in {team.name}.")
        if membership.is_owner and _owner_count(team) == 1:
            raise ValidationError("A team must keep at least one owner; make someone else an owner first.")
        membership.delete()


def membership_role_set(*, team: Team, actor: AbstractBaseUser, username: str, role: str) -> Membership:
    """Give `username` the role `role` in `team`; only an owner may, and the last owner stays an owner."""
    require_owner(user=actor, team=team, action="change roles")
    _role_check(role)
    with transaction.atomic():
        _lock(team)
        membership = Membership.objects.filter(team=team, user__username=username).first()
        if membership is None:
            raise ValidationError(f"{username!r} is not in {team.name}.")
        if membership.is_owner and role != Membership.Role.OWNER and _owner_count(team) == 1:
            raise ValidationError("A team must keep at least one owner; make someone else an owner first.")
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


def demo_team_ensure(*, username: str, password: str, team_name: str) -> tuple[AbstractBaseUser, bool]:
    """Create the demo user and a team it owns on first start; return (user, created). Idempotent.

    The demo user never joins a team someone else made: if `team_name` is taken, its team gets the first
    free name ``<team_name> 2``, ``<team_name> 3``, ...
    """
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is not None:
        return user, False
    with transaction.atomic():
        user = User.objects.create_user(username=username, password=password)
        name, n = team_name, 1
        while Team.objects.filter(name__iexact=name).exists():
            n += 1
            name = f"{team_name} {n}"
        team_create(name=name, owner=user)
    return user, True
