"""A team's notification settings, the notices its experiments and trials give, and their deliveries.

A `Notice` is one thing that happened (a trial failed, an experiment ended), recorded once whatever number of
times the event is applied (its ``key``). Each of the team's e-mail addresses and webhook URLs gets a
`Delivery` of it: an outbox row (`WebWork`) that the web worker delivers and retries, and that the team's
notification page lists with its status, tries and last error.
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from django.conf import settings
from django.db import models

from webapp.accounts.models import Team
from webapp.background.models import WebWork
from webapp.ground.models import Experiment

MAX_EMAILS = 20
MAX_WEBHOOKS = 5


class NotificationSettings(models.Model):
    """Where a team is told about its experiments, and the secret its webhooks are signed with.

    The secret is kept as it is (HMAC needs it to sign); the page shows it once, when it is made, and an
    owner can replace it at any time."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="notification_settings")
    emails = models.JSONField(default=list, blank=True, help_text=f"E-mail addresses, at most {MAX_EMAILS}.")
    webhook_urls = models.JSONField(default=list, blank=True, help_text=f"Webhook URLs, at most {MAX_WEBHOOKS}.")
    secret = models.CharField(max_length=100, blank=True, help_text="Signs the webhooks (HMAC-SHA256).")
    secret_created = models.DateTimeField(null=True, blank=True)
    updated = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        verbose_name_plural = "notification settings"

    def __str__(self) -> str:
        return f"notifications of {self.team}"

    @property
    def secret_hint(self) -> str:
        """The secret's first characters, so that a receiver's copy can be recognised without showing it."""
        return f"{self.secret[:6]}…" if self.secret else ""


class Notice(models.Model):
    class Event(models.TextChoices):
        TRIAL_FAILED = "trial.failed", "Trial failed"
        EXPERIMENT_ENDED = "experiment.ended", "Experiment ended"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="notices")
    event = models.CharField(max_length=20, choices=Event.choices)
    key = models.CharField(max_length=120, help_text="What makes it one notice however often its event is applied.")
    experiment = models.ForeignKey(Experiment, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    payload = models.JSONField(help_text="The webhooks' JSON body; the e-mails are written from it.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "key"], name="unique_notice_key")]

    def __str__(self) -> str:
        return f"{self.event} ({self.key})"


class Delivery(WebWork):
    """One notice to one e-mail address or webhook URL, delivered by the web worker (`delivery`)."""

    class Channel(models.TextChoices):
        EMAIL = "email", "E-mail"
        WEBHOOK = "webhook", "Webhook"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    PENDING = Status.PENDING
    TASK: ClassVar[str] = "webapp.notifications.deliver"
    RETRY_HINT = "This notification is not sent again."

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="deliveries")
    notice = models.ForeignKey(Notice, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=10, choices=Channel.choices)
    target = models.CharField(max_length=2000, help_text="The e-mail address or webhook URL.")
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False,
                           help_text="Sent as X-Hydra-Delivery: the same on every try, for receivers to deduplicate.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0, help_text="Tries so far.")
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="No try before this: the next retry's time, or the end of a try's lease.")
    message = models.TextField(blank=True, help_text="Why the last try failed.")
    created = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "deliveries"
        ordering = ["-created", "-pk"]
        indexes = [models.Index(fields=["team", "-created", "-id"], name="delivery_team_newest")]

    def __str__(self) -> str:
        return f"{self.notice.event} to {self.target}"
