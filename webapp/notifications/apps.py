"""What a team is told when its experiments end or its trials fail: e-mail to the addresses it lists and signed
webhooks to its URLs. The change is recorded with the trial's status (an outbox row) and delivered by the web
worker, so no device worker, ingest pass or request ever waits on a mail server or a team's endpoint."""
from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "webapp.notifications"
    label = "notifications"
    verbose_name = "Team notifications (e-mail, webhooks)"
