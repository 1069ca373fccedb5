"""Attach the user's current team to every request as ``request.team``."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject

from webapp.accounts.models import Team
from webapp.accounts.selectors import user_teams

SESSION_KEY = "hydra_team_id"


def current_team(request: HttpRequest) -> Team | None:
    """The team chosen in this session if the user still belongs to it, else their first team, else None."""
    if not request.user.is_authenticated:
        return None
    teams = user_teams(user=request.user)
    chosen = request.session.get(SESSION_KEY)
    team = teams.filter(pk=chosen).first() if chosen is not None else None
    return team or teams.first()


class CurrentTeamMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.team = SimpleLazyObject(lambda: current_team(request))  # type: ignore[attr-defined]
        return self.get_response(request)
