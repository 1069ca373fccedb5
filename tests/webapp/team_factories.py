"""Team membership for the web tests, made the only way the app allows: invited, then accepted."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from webapp.accounts import services
from webapp.accounts.models import Invitation, Team


def join(team: Team, owner: AbstractBaseUser, user: AbstractBaseUser, role: str = "member") -> None:
    """`owner` invites `user` to `team` with `role`; `user` accepts and works in `team`."""
    services.invitation_send(team=team, actor=owner, username=user.get_username(), role=role)
    invitation = Invitation.objects.get(team=team, username=user.get_username())
    services.invitation_accept(user=user, invitation_id=invitation.pk)
    services.current_team_set(user=user, team_id=team.pk)
