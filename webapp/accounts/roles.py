"""Who may change what in a team: owners change everything of their team, members what they created.

Services call `require_owner` and `require_creator_or_owner` before any destructive or controlling write, so
the rule holds whichever view, command or task calls them; pages call `can_change` to show only the
controls that will work. A refusal is a PermissionDenied, which Django answers with 403.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied

from webapp.accounts.models import Membership, Team


def _membership(*, user: AbstractBaseUser, team: Team) -> Membership | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, team=team).first()


def can_change(*, user: AbstractBaseUser, team: Team, created_by_id: int | None) -> bool:
    """True if `user` owns `team`, or is a member of it and created the object (`created_by_id`)."""
    membership = _membership(user=user, team=team)
    if membership is None:
        return False
    return membership.is_owner or (created_by_id is not None and created_by_id == user.pk)


def require_creator_or_owner(*, user: AbstractBaseUser, team: Team, created_by_id: int | None, what: str) -> None:
    """Raise PermissionDenied unless `can_change`; `what` names the object for the message."""
    if not can_change(user=user, team=team, created_by_id=created_by_id):
        raise PermissionDenied(f"Only the team's owners and the person who created {what} can change it.")


def require_owner(*, user: AbstractBaseUser, team: Team, action: str) -> None:
    """Raise PermissionDenied unless `user` owns `team`; `action` says what was refused."""
    membership = _membership(user=user, team=team)
    if membership is None or not membership.is_owner:
        raise PermissionDenied(f"Only the team's owners can {action}.")
