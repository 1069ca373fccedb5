from __future__ import annotations

from django.http import HttpRequest

from webapp.accounts.selectors import user_teams


def teams(request: HttpRequest) -> dict[str, object]:
    if not request.user.is_authenticated:
        return {}
    return {"user_teams": list(user_teams(user=request.user)), "current_team": request.team}
