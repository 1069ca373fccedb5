"""Writes about teams and memberships. Permission checks live here, not in views."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from webapp.accounts.models import Membership, Team
from webapp.accounts.selectors import membership_get


def team_create(*, name: str, owner: AbstractBaseUser) -> Team:
    name = name.strip()
    if not name:
        raise ValidationError("A team needs a name.")
    if Team.objects.filter(name__iexact=name).exists():
        raise ValidationError(f"A team named {name!r} already exists.")
    with transaction.atomic():
        team = Team.objects.create(name=name)
        Membership.objects.create(team=team, user=owner, role=Membership.Role.OWNER)
    return team


def _require_owner(*, team: Team, actor: AbstractBaseUser) -> None:
    membership = membership_get(user=actor, team=team)
    if membership is None or not membership.is_owner:
        raise PermissionDenied("Only the team's owners can change its members.")


def membership_add(
    *, team: Team, actor: AbstractBaseUser, username: str, role: str = Membership.Role.MEMBER
) -> Membership:
    """Add the user called `username` to `team`; only an owner may. Raises ValidationError on bad input."""
    _require_owner(team=team, actor=actor)
    if role not in Membership.Role.values:
        raise ValidationError(f"Unknown role {role!r}; use one of {Membership.Role.values}.")
    user = get_user_model().objects.filter(username=username.strip()).first()
    if user is None:
        raise ValidationError(f"There is no user called {username.strip()!r}.")
    if Membership.objects.filter(team=team, user=user).exists():
        raise ValidationError(f"{user.username} is already in {team.name}.")
    return Membership.objects.create(team=team, user=user, role=role)


def membership_remove(*, team: Team, actor: AbstractBaseUser, username: str) -> None:
    """Remove `username` from `team`; only an owner may, and the last owner cannot leave the team ownerless."""
    _require_owner(team=team, actor=actor)
    with transaction.atomic():
        membership = (
            Membership.objects.select_for_update().filter(team=team, user__username=username).first()
        )
        if membership is None:
            raise ValidationError(f"{username!r} is not in {team.name}.")
        owners = Membership.objects.filter(team=team, role=Membership.Role.OWNER).count()
        if membership.is_owner and owners == 1:
            raise ValidationError("A team must keep at least one owner; make someone else an owner first.")
        membership.delete()


def demo_team_ensure(*, username: str, password: str, team_name: str) -> tuple[AbstractBaseUser, bool]:
    """Create the demo user and team on first start; return (user, created). Idempotent."""
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is not None:
        return user, False
    with transaction.atomic():
        user = User.objects.create_user(username=username, password=password)
        team = Team.objects.filter(name=team_name).first() or Team.objects.create(name=team_name)
        Membership.objects.create(team=team, user=user, role=Membership.Role.OWNER)
    return user, True
