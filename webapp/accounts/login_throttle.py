"""Login throttling with django-axes: which address a login comes from, and when wrong passwords lock it.

Two counts of wrong passwords within the cool-off (AXES_COOLOFF_TIME) lock a login, each at its own limit:

- one username from one client address, at AXES_FAILURE_LIMIT: that username is locked from that address only,
  so guesses from elsewhere never lock the real user out;
- any usernames from one client address, at LOGIN_FAILURES_PER_ADDRESS: every login from that address is
  locked, so one address cannot spray guesses across many accounts.

axes counts both (AXES_LOCKOUT_PARAMETERS) but compares the larger with one limit; `PairAndAddressHandler`
gives each count its own.
"""

from __future__ import annotations

import ipaddress

from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import QuerySet, Sum
from django.http import HttpRequest

# The pair first, the address second: `PairAndAddressHandler` reads axes's counts in this order.
LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]


def client_address(request: HttpRequest) -> str | None:
    """The address a login comes from (AXES_CLIENT_IP_CALLABLE).

    With no trusted proxy (TRUSTED_PROXY_COUNT = 0) it is the connection's, REMOTE_ADDR. With N proxies in
    front of the server, each appending the address it saw to X-Forwarded-For, it is the N-th entry from the
    right: the one the outermost proxy wrote. Entries further left came from the client and are never read. A
    request without that entry, or with something other than an IP address there, did not come through the
    proxies as declared and counts under REMOTE_ADDR.
    """
    remote = request.META.get("REMOTE_ADDR")
    proxies = settings.TRUSTED_PROXY_COUNT
    if proxies == 0:
        return remote
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    if len(hops) < proxies:
        return remote
    try:
        return str(ipaddress.ip_address(hops[-proxies]))
    except ValueError:
        return remote


def _total(attempts: QuerySet) -> int:
    return attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0


class PairAndAddressHandler(AxesDatabaseHandler):
    """axes's database handler with a limit for each of the two counts of LOCKOUT_PARAMETERS."""

    def __init__(self) -> None:
        if settings.AXES_LOCKOUT_PARAMETERS != LOCKOUT_PARAMETERS:
            raise ImproperlyConfigured(
                f"AXES_LOCKOUT_PARAMETERS={settings.AXES_LOCKOUT_PARAMETERS!r}; {type(self).__name__} counts "
                f"{LOCKOUT_PARAMETERS!r}, in that order.")

    def get_failures(self, request: HttpRequest, credentials: dict | None = None) -> int:
        """The failures axes compares with AXES_FAILURE_LIMIT: the address's once they reach
        LOGIN_FAILURES_PER_ADDRESS (never below AXES_FAILURE_LIMIT, `webapp.config`), otherwise the pair's."""
        pair, address = (_total(attempts) for attempts in self.get_user_attempts(request, credentials))
        return address if address >= settings.LOGIN_FAILURES_PER_ADDRESS else pair

    def reset_user_attempts(self, request: HttpRequest, credentials: dict | None = None) -> int:
        """After a successful login, forget that username's failures from that address, not the address's:
        otherwise anyone with an account could log in between guesses at others and never reach the address's
        limit."""
        pair, _address = self.filter_user_attempts(request, credentials)
        count, _ = pair.delete()
        return count
