"""Reads for the team's notification page."""

from __future__ import annotations

from django.db.models import QuerySet

from webapp.accounts.models import Team
from webapp.allowlist import WebhookRefused, url_parse
from webapp.notifications.models import Delivery

RECENT = 50


def deliveries_recent(*, team: Team) -> QuerySet[Delivery]:
    """The team's last `RECENT` deliveries, newest first, with their notices."""
    return Delivery.objects.filter(team=team).select_related("notice", "notice__experiment")[:RECENT]


def url_shown(url: str) -> str:
    """A webhook URL as members who are not owners see it: its scheme and host, not its path or query, which
    often hold a token of the receiver's."""
    try:
        parts = url_parse(url)
    except WebhookRefused:
        return "…"
    return f"{parts.scheme}://{parts.netloc}/…"
