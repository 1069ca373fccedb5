"""Reads about teams. `team_scoped_get` is the one door to any team-owned object."""

from __future__ import annotations

from typing import TypeVar

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Model, QuerySet
from django.http import Http404

from webapp.accounts.models import Invitation, Membership, Team

M = TypeVar("M", bound=Model)


def user_teams(*, user: AbstractBaseUser) -> QuerySet[Team]:
    return Team.objects.filter(memberships__user=user).order_by("name")


def current_team(*, user: AbstractBaseUser) -> Team | None:
    """The team `user` chose to work in, or None when they have not chosen one (or left it)."""
    membership = Membership.objects.filter(user=user, is_current=True).select_related("team").first()
    return membership.team if membership is not None else None


def invitations_for_user(*, user: AbstractBaseUser) -> QuerySet[Invitation]:
    """Invitations addressed to `user` that they have not answered yet."""
    return Invitation.objects.filter(username=user.get_username()).select_related("team", "invited_by")


def invitations_for_team(*, team: Team) -> QuerySet[Invitation]:
    """The team's invitations that nobody has answered yet (for its owners)."""
    return Invitation.objects.filter(team=team).order_by("username")


def membership_get(*, user: AbstractBaseUser, team: Team) -> Membership | None:
    return Membership.objects.filter(user=user, team=team).first()


def team_for_user(*, user: AbstractBaseUser, team_id: int) -> Team:
    """The team `team_id` if `user` belongs to it; else Http404 (never a hint that it exists)."""
    team = user_teams(user=user).filter(pk=team_id).first()
    if team is None:
        raise Http404("No such team.")
    return team


def team_scoped_get(queryset: QuerySet[M], *, team: Team, team_field: str = "team", **lookup: object) -> M:
    """Fetch one object of `queryset` that belongs to `team`, or raise Http404.

    Every view that reaches a team-owned object by an id from the URL goes through here, so an object of
    another team answers exactly like one that does not exist.
    """
    obj = queryset.filter(**{team_field: team}, **lookup).first()
    if obj is None:
        raise Http404(f"No such {queryset.model._meta.verbose_name}.")
    return obj
