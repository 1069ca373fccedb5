"""Attach the user's current team to every request as ``request.team``."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject

from webapp.accounts.models import Team
from webapp.accounts.selectors import current_team


def request_team(request: HttpRequest) -> Team | None:
    """The team the signed-in user chose to work in; None for visitors and for users who have not chosen."""
    if not request.user.is_authenticated:
        return None
    return current_team(user=request.user)


class CurrentTeamMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.team = SimpleLazyObject(lambda: request_team(request))  # type: ignore[attr-defined]
        return self.get_response(request)
