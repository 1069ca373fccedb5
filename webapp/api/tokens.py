"""Making, finding and revoking personal access tokens (`models.AccessToken`)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone

from webapp.api.models import AccessToken

TOKEN_PREFIX = "hyd_"  # tells a Hydra token apart in a secret scanner or a config file
MAX_DAYS = 366
MAX_LIVE_TOKENS = 50  # per user: more is a sign of tokens made and forgotten


def digest(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def token_create(*, user: AbstractBaseUser, name: str, scope: str, days: int) -> tuple[AccessToken, str]:
    """A new token of `user`; returns it with the secret, which is never stored and cannot be shown again."""
    name = name.strip()
    if not name:
        raise ValidationError({"name": "Name the token after what will use it."})
    if scope not in AccessToken.Scope.values:
        raise ValidationError({"scope": f"Choose a scope: {', '.join(AccessToken.Scope.values)}."})
    if not 1 <= days <= MAX_DAYS:
        raise ValidationError({"days": f"A token lasts from 1 to {MAX_DAYS} days."})
    if token_list(user=user).filter(revoked=None, expires__gt=timezone.now()).count() >= MAX_LIVE_TOKENS:
        raise ValidationError(f"You have {MAX_LIVE_TOKENS} live tokens; revoke one you no longer use first.")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = AccessToken.objects.create(user=user, name=name[:80], scope=scope, prefix=raw[:12], digest=digest(raw),
                                       expires=timezone.now() + timedelta(days=days))
    return token, raw


def token_list(*, user: AbstractBaseUser) -> QuerySet[AccessToken]:
    return AccessToken.objects.filter(user=user)


def token_revoke(*, user: AbstractBaseUser, token_id: int) -> AccessToken:
    """Revoke one of `user`'s tokens (Http404 for anyone else's); revoking twice keeps the first time."""
    token = token_list(user=user).filter(pk=token_id).first()
    if token is None:
        raise Http404("No such token.")
    if token.revoked is None:
        token.revoked = timezone.now()
        token.save(update_fields=["revoked"])
    return token


def token_authenticate(raw: str) -> AccessToken | None:
    """The live token whose secret is `raw`, with its active user; None for anything else (unknown, revoked,
    expired, or of a deactivated user). Marks when it was last used, at most once a minute."""
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    token = AccessToken.objects.select_related("user").filter(digest=digest(raw)).first()
    if token is None or not token.is_live or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used is None or now - token.last_used > timedelta(minutes=1):
        AccessToken.objects.filter(pk=token.pk).update(last_used=now)
    return token
