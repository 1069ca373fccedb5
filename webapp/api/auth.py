"""Who calls the API and in which team: bearer tokens, their scope, the team header, the rate limit, the audit.

Every request carries ``Authorization: Bearer hyd_…``. A token of the ``read`` scope may only read (GET,
HEAD); anything else answers 403. The team is the one the caller names in the ``X-Hydra-Team`` header (by id,
and only one they belong to: else 404, as for any object of another team), or else the team they work in on
the pages. Each token may make `settings.HYDRA.api_rate_per_minute` requests a minute, counted in Redis so
that every web server process shares one count (429 beyond it, with Retry-After).
"""

from __future__ import annotations

import functools
import logging
import time

import redis
from django.conf import settings
from django.http import Http404, HttpRequest
from ninja.errors import HttpError
from ninja.security import HttpBearer
from ninja.throttling import BaseThrottle

from webapp.accounts.models import Team
from webapp.accounts.selectors import current_team, team_for_user
from webapp.api.models import AccessToken, AuditEntry
from webapp.api.tokens import token_authenticate
from webapp.ids import parse_id

log = logging.getLogger(__name__)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
TEAM_HEADER = "X-Hydra-Team"


class TokenAuth(HttpBearer):
    """A live personal access token: sets ``request.user``, ``request.token`` and ``request.team``."""

    def authenticate(self, request: HttpRequest, token: str) -> AccessToken | None:
        found = token_authenticate(token)
        if found is None:
            return None
        if request.method not in SAFE_METHODS and found.scope != AccessToken.Scope.WRITE:
            raise HttpError(403, "This token may only read; make one with the write scope on your tokens page.")
        request.user = found.user
        request.token = found  # type: ignore[attr-defined]
        request.team = _team(request, found)  # type: ignore[attr-defined]
        return found


def _team(request: HttpRequest, token: AccessToken) -> Team | None:
    raw = request.headers.get(TEAM_HEADER)
    if raw is None or raw.strip() == "":
        return current_team(user=token.user)
    team_id = parse_id(raw.strip())
    if team_id is None:
        raise Http404("No such team.")
    return team_for_user(user=token.user, team_id=team_id)


def team_of(request: HttpRequest) -> Team:
    """The request's team, or a 409 saying how to choose one."""
    team = getattr(request, "team", None)
    if team is None:
        raise HttpError(409, f"Choose a team: send its id in the {TEAM_HEADER} header, or pick a current team on "
                             "the teams page.")
    return team


@functools.cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.HYDRA.worker.redis_url, socket_connect_timeout=1.0, socket_timeout=1.0)


class TokenRateThrottle(BaseThrottle):
    """At most `settings.HYDRA.api_rate_per_minute` requests per token in each minute of the clock. Without
    Redis the request is let through: nothing the API does works without Redis for long anyway, and refusing
    every call would hide the real error."""

    def allow_request(self, request: HttpRequest) -> bool:
        token = getattr(request, "token", None)
        if token is None:
            return True
        minute = int(time.time() // 60)
        key = f"hydra:api-rate:{token.digest[:24]}:{minute}"  # the digest: a pk may be used again
        try:
            pipe = _redis().pipeline()
            pipe.incr(key)
            pipe.expire(key, 120)
            count, _ = pipe.execute()
        except redis.RedisError as error:
            log.warning("API rate limit not counted (Redis: %s)", error)
            return True
        return int(count) <= settings.HYDRA.api_rate_per_minute

    def wait(self) -> float | None:
        """Seconds until the next minute of the clock, when every token's count starts again."""
        return 60 - time.time() % 60


def audit(request: HttpRequest, action: str, target: object = "") -> None:
    """Record a write the request made in its team (call it once the write succeeded)."""
    team = getattr(request, "team", None)
    token: AccessToken | None = getattr(request, "token", None)
    if team is None or token is None:
        return
    AuditEntry.objects.create(team=team, user=request.user, username=request.user.get_username(), token=token,
                              token_name=token.name, method=request.method or "", path=request.path[:300],
                              action=action, target=str(target)[:200])
