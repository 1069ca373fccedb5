"""Who calls the API and in which team: bearer tokens, their scope, the team header, the rate limit, the audit.

Every request carries ``Authorization: Bearer hyd_…``. A token of the ``read`` scope may only read (GET,
HEAD); anything else answers 403. The team is the one the caller names in the ``X-Hydra-Team`` header (by id,
and only one they belong to: else 404, as for any object of another team), or else the team they work in on
the pages. Each token may make `settings.HYDRA.api_rate_per_minute` requests in any 60 seconds, and each
client address may send `settings.HYDRA.api_auth_failures_per_address` wrong tokens in 15 minutes, after which
its every request answers 429 until the oldest failure is 15 minutes old, so that an address cannot try
tokens at the rate limit's pace. Both are counted in Redis (`sliding_window`), so that every web server
process shares one count, and both answer 429 with Retry-After.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

import redis
from django.conf import settings
from django.http import Http404, HttpRequest
from ninja.errors import HttpError
from ninja.security import HttpBearer
from ninja.throttling import BaseThrottle

from webapp.accounts.login_throttle import client_address
from webapp.accounts.models import Team
from webapp.accounts.selectors import current_team, team_for_user
from webapp.api.models import AccessToken, AuditEntry
from webapp.api.sliding_window import SlidingWindow
from webapp.api.tokens import token_authenticate
from webapp.ids import parse_id

log = logging.getLogger(__name__)
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
TEAM_HEADER = "X-Hydra-Team"
REQUESTS = SlidingWindow("hydra:api-rate", 60.0)  # per token: the digest's start (a pk may be used again)
AUTH_FAILURES = SlidingWindow("hydra:api-auth-failures", 15 * 60.0)  # per client address
Clock = Callable[[], float]


class TooManyFailures(Exception):
    """The client's address sent too many wrong tokens lately; ``wait`` is the seconds until it may try again."""

    def __init__(self, wait: float) -> None:
        super().__init__(wait)
        self.wait = wait


class TokenAuth(HttpBearer):
    """A live personal access token: sets ``request.user``, ``request.token`` and ``request.team``. An address
    over its limit of wrong tokens is refused (`TooManyFailures`) before its token is even looked at, so that
    the answer tells nothing about the token."""

    clock: Clock = staticmethod(time.time)

    def authenticate(self, request: HttpRequest, token: str) -> AccessToken | None:
        address, now = client_address(request) or "unknown", self.clock()
        limit = settings.HYDRA.api_auth_failures_per_address
        try:
            wait = AUTH_FAILURES.full(_redis(), address, limit=limit, now=now)
        except redis.RedisError as error:
            log.warning("API authentication failures not counted (Redis: %s)", error)
            wait = None
        if wait is not None:
            raise TooManyFailures(wait)
        found = token_authenticate(token)
        if found is None:
            try:
                AUTH_FAILURES.add(_redis(), address, now=now)
            except redis.RedisError as error:
                log.warning("API authentication failure not counted (Redis: %s)", error)
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
    """At most `settings.HYDRA.api_rate_per_minute` requests per token in any 60 seconds (a request refused
    is not counted). Without Redis the request is let through: nothing the API does works without Redis for
    long anyway, and refusing every call would hide the real error."""

    clock: Clock = staticmethod(time.time)

    def __init__(self) -> None:
        self._refused = threading.local()  # one throttle serves every request: the wait is each thread's own

    def allow_request(self, request: HttpRequest) -> bool:
        token = getattr(request, "token", None)
        if token is None:
            return True
        try:
            wait = REQUESTS.take(_redis(), token.digest[:24], limit=settings.HYDRA.api_rate_per_minute,
                                 now=self.clock())
        except redis.RedisError as error:
            log.warning("API rate limit not counted (Redis: %s)", error)
            return True
        self._refused.wait = wait
        return wait is None

    def wait(self) -> float | None:
        """Seconds until the oldest of the token's counted requests is 60 s old, and one more is let in."""
        return getattr(self._refused, "wait", None)


def audit(request: HttpRequest, action: str, target: object = "") -> None:
    """Record a write the request made in its team (call it once the write succeeded)."""
    team = getattr(request, "team", None)
    token: AccessToken | None = getattr(request, "token", None)
    if team is None or token is None:
        return
    AuditEntry.objects.create(team=team, user=request.user, username=request.user.get_username(), token=token,
                              token_name=token.name, method=request.method or "", path=request.path[:300],
                              action=action, target=str(target)[:200])
