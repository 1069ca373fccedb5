"""Writes about a team's notification settings: its e-mail addresses, webhook URLs and signing secret.

Only the team's owners change them (`webapp.accounts.roles.require_owner`). Addresses and URLs are checked
here, whichever view or command calls (and again by each delivery): e-mail addresses by
`email_address.email_address_check` (one bare address, nothing a mail header could read as more), URLs by
`allowlist.url_check` against the administrator's ``HYDRA_WEBHOOK_ALLOWED_HOSTS`` (so a URL the server may not
reach is refused when it is saved, and again when each delivery resolves it).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from webapp.accounts.models import Team
from webapp.accounts.roles import require_owner
from webapp.allowlist import WebhookRefused, url_check
from webapp.notifications.email_address import AddressRefused, email_address_check
from webapp.notifications.models import MAX_EMAILS, MAX_WEBHOOKS, NotificationSettings

SECRET_PREFIX = "hydra_whsec_"


def settings_get(*, team: Team) -> NotificationSettings:
    """The team's settings (unsaved and empty when it has none yet)."""
    return NotificationSettings.objects.filter(team=team).first() or NotificationSettings(team=team)


def emails_clean(values: Iterable[str]) -> list[str]:
    """The addresses, stripped and without repeats; raise ValidationError naming each bad one."""
    emails = list(dict.fromkeys(value.strip() for value in values if value.strip()))
    errors = []
    if len(emails) > MAX_EMAILS:
        errors.append(f"Give at most {MAX_EMAILS} e-mail addresses.")
    for email in emails:
        try:
            email_address_check(email)
        except AddressRefused as error:
            errors.append(f"{email!r} is not an e-mail address. {error}")
    if errors:
        raise ValidationError(errors)
    return emails


def webhook_urls_clean(values: Iterable[str]) -> list[str]:
    """The URLs, stripped and without repeats; raise ValidationError naming each that is malformed or that the
    administrator's allowlist does not let the server reach (after resolving its host)."""
    urls = list(dict.fromkeys(value.strip() for value in values if value.strip()))
    errors = []
    if len(urls) > MAX_WEBHOOKS:
        errors.append(f"Give at most {MAX_WEBHOOKS} webhook URLs.")
    for url in urls:
        try:
            url_check(url, settings.HYDRA.notify.webhook_allowlist)
        except WebhookRefused as error:
            errors.append(f"{url[:200]}: {error}")
    if errors:
        raise ValidationError(errors)
    return urls


def settings_save(*, team: Team, actor: AbstractBaseUser, emails: Iterable[str],
                  webhook_urls: Iterable[str]) -> tuple[NotificationSettings, str | None]:
    """Replace the team's addresses and URLs. Returns the settings and, when webhooks were added to a team
    without a signing secret, the secret just made (shown once). Raises PermissionDenied unless `actor` owns
    the team; ValidationError ({"emails": ..., "webhook_urls": ...}) for bad values."""
    require_owner(user=actor, team=team, action="change the team's notifications")
    errors = {}
    try:
        emails = emails_clean(emails)
    except ValidationError as error:
        errors["emails"] = error.messages
    try:
        webhook_urls = webhook_urls_clean(webhook_urls)
    except ValidationError as error:
        errors["webhook_urls"] = error.messages
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        row, _ = NotificationSettings.objects.select_for_update().get_or_create(team=team)
        row.emails, row.webhook_urls, row.updated_by = list(emails), list(webhook_urls), actor
        new_secret = _secret_set(row) if row.webhook_urls and not row.secret else None
        row.save()
    return row, new_secret


def secret_rotate(*, team: Team, actor: AbstractBaseUser) -> str:
    """Give the team a new signing secret and return it (to show once); the old one signs nothing more.
    Raises PermissionDenied unless `actor` owns the team."""
    require_owner(user=actor, team=team, action="change the team's webhook secret")
    with transaction.atomic():
        row, _ = NotificationSettings.objects.select_for_update().get_or_create(team=team)
        secret = _secret_set(row)
        row.updated_by = actor
        row.save()
    return secret


def _secret_set(row: NotificationSettings) -> str:
    row.secret, row.secret_created = SECRET_PREFIX + secrets.token_urlsafe(32), timezone.now()
    return row.secret
