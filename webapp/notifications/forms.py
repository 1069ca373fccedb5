"""The team's notification form: addresses and URLs one a line (or comma-separated). They are checked by
`services.settings_save`, which the view maps back onto the fields."""

from __future__ import annotations

import re

from django import forms

from webapp.notifications.models import MAX_EMAILS, MAX_WEBHOOKS

MAX_FIELD_CHARS = 12_000  # MAX_WEBHOOKS URLs of 2,000 characters, with room for blank lines


def lines(text: str) -> list[str]:
    return [item.strip() for item in re.split(r"[\n,]", text) if item.strip()]


class NotificationSettingsForm(forms.Form):
    emails = forms.CharField(
        required=False, max_length=MAX_FIELD_CHARS, label="E-mail addresses",
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "someone@lab.example.org"}),
        help_text=f"One a line, at most {MAX_EMAILS}. Each gets an e-mail when an experiment ends or a trial fails.")
    webhook_urls = forms.CharField(
        required=False, max_length=MAX_FIELD_CHARS, label="Webhook URLs",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "https://hooks.example.org/hydra"}),
        help_text=f"One a line, at most {MAX_WEBHOOKS}: http:// or https://, on a host and port the administrator "
                  "allows (80 for http://, 443 for https://, unless an entry names another). "
                  "Each gets a signed JSON POST when an experiment ends or a trial fails; redirects are not "
                  "followed.")

    @classmethod
    def initial_from(cls, emails: list[str], webhook_urls: list[str]) -> NotificationSettingsForm:
        return cls(initial={"emails": "\n".join(emails), "webhook_urls": "\n".join(webhook_urls)})
