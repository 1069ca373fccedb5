"""Personal access tokens and the API's audit log.

A token is shown once, when it is made; only its SHA-256 digest is stored, with its first characters
(``prefix``) so that its owner can tell their tokens apart. A token reads (``read``) or also writes
(``write``), ends at ``expires`` and can be revoked; a revoked or expired token is refused (401) exactly like
an unknown one. Every write through the API is an `AuditEntry` of the team it acted in, which the team's
owners read.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AccessToken(models.Model):
    class Scope(models.TextChoices):
        READ = "read", "Read: list and look"
        WRITE = "write", "Write: also create, launch and control"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="access_tokens")
    name = models.CharField(max_length=80, help_text="What the token is for (a laptop, a CI job).")
    prefix = models.CharField(max_length=12, help_text="The token's first characters, to recognise it.")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the whole token, in hex.")
    scope = models.CharField(max_length=5, choices=Scope.choices, default=Scope.READ)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField()
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_live(self) -> bool:
        return self.revoked is None and self.expires > timezone.now()


class AuditEntry(models.Model):
    """One write through the API: who, with which token, what, on which object, and the answer's status."""

    team = models.ForeignKey("accounts.Team", on_delete=models.CASCADE, related_name="api_audit")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    username = models.CharField(max_length=150, help_text="Kept when the user is deleted.")
    token = models.ForeignKey(AccessToken, null=True, on_delete=models.SET_NULL, related_name="+")
    token_name = models.CharField(max_length=80)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=300)
    action = models.CharField(max_length=60, help_text="What was done, e.g. experiment.create.")
    target = models.CharField(max_length=200, blank=True, help_text="The object acted on, e.g. experiment 12.")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["team", "-at"], name="audit_team_newest")]

    def __str__(self) -> str:
        return f"{self.username} {self.action} {self.target}"
