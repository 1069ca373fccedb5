"""Notification e-mail addresses carry one bare address and nothing a mail header could read as more: the
team's page refuses line breaks, display names, quoted parts and lists, and a bad value stored by another way
is refused again when its delivery comes, so no message ever reaches an injected recipient."""

from __future__ import annotations

import pytest
from django.core import mail
from django.urls import reverse

from tests.webapp.notifications.conftest import trials_of
from webapp.experiments.events import trial_event_apply
from webapp.notifications.delivery import delivery_run
from webapp.notifications.models import Delivery, NotificationSettings

pytestmark = pytest.mark.django_db
ONE_TRIAL = {"lr": {"values": [0.001]}, "batch_size": {"values": [2]}}
SPY = "spy@evil.example"
INJECTED = [
    f"ops@lab.example\r\nBcc: {SPY}",
    f"ops@lab.example\nBcc: {SPY}",
    f"ops@lab.example\rBcc: {SPY}",
    f"ops@lab.example, {SPY}",
    f"ops@lab.example;{SPY}",
    f"Ops <ops@lab.example>\r\nBcc: {SPY}",
    f"ops@lab.example\u2028Bcc: {SPY}",
    "ops@lab.example\u2028bcc",
    f'"{SPY}"@lab.example',
    '"ops\x0bBcc"@lab.example',
    "ops@[10.0.0.1]",
]


def _save(client, team, emails: str):
    return client.post(reverse("notification_settings", args=[team.pk]), {"emails": emails, "webhook_urls": ""})


@pytest.mark.parametrize("emails", [
    f"ops@lab.example\r\nBcc: {SPY}", f"ops@lab.example\rBcc: {SPY}", f"Ops <ops@lab.example>\r\nBcc: {SPY}",
    "ops@lab.example\u2028bcc", f'"{SPY}"@lab.example', '"ops\x0bBcc"@lab.example', "ops@[10.0.0.1]",
    "Ops <ops@lab.example>", "ops @lab.example", "ops@lab.example\u200b"])
def test_the_page_refuses_an_address_with_header_breaking_content_and_stores_nothing(
        alice_client, alice_team, emails):
    answer = _save(alice_client, alice_team, emails)
    assert answer.status_code == 400
    assert "is not an e-mail address." in answer.content.decode()
    assert not NotificationSettings.objects.filter(team=alice_team).exists()


def test_the_page_reads_a_comma_or_a_line_as_a_separator_and_checks_every_address(alice_client, alice_team):
    answer = _save(alice_client, alice_team, f"ops@lab.example, {SPY}\nBcc: {SPY}")
    assert answer.status_code == 400
    assert "&#x27;Bcc: spy@evil.example&#x27; is not an e-mail address." in answer.content.decode()
    assert not NotificationSettings.objects.filter(team=alice_team).exists()

    assert _save(alice_client, alice_team, "ops@lab.example,\r\npi@lab.example").status_code == 302
    assert NotificationSettings.objects.get(team=alice_team).emails == ["ops@lab.example", "pi@lab.example"]


def test_a_bad_address_stored_by_another_way_is_refused_at_delivery_and_never_mailed(
        alice_team, alice_dataset, launched):
    NotificationSettings.objects.create(team=alice_team, emails=["ops@lab.example", *INJECTED])
    experiment = launched(alice_team, alice_dataset, space=ONE_TRIAL)
    trial_event_apply(trial_id=trials_of(experiment)[0].queue_id, status="failed", message="NaN loss")

    outcomes = {d.target: delivery_run(delivery_id=d.pk) for d in Delivery.objects.all()}
    assert outcomes == {"ops@lab.example": "delivered", **dict.fromkeys(INJECTED, "failed")}
    for delivery in Delivery.objects.exclude(target="ops@lab.example"):
        assert delivery.message.startswith("Refused: ") and delivery.attempts == 1, delivery.target  # for good
    assert len(mail.outbox) == 2  # the trial's failure and the experiment's end, to the one good address
    for message in mail.outbox:
        assert message.recipients() == ["ops@lab.example"]
        assert SPY not in message.message().as_string()


def test_an_experiment_name_with_a_line_break_cannot_add_a_header(alice_team, alice_dataset, launched):
    NotificationSettings.objects.create(team=alice_team, emails=["ops@lab.example"])
    experiment = launched(alice_team, alice_dataset, space=ONE_TRIAL, name=f"sweep\r\nBcc: {SPY}")
    trial_event_apply(trial_id=trials_of(experiment)[0].queue_id, status="finished")

    assert delivery_run(delivery_id=Delivery.objects.get().pk) == "delivered"
    (message,) = mail.outbox
    assert message.subject == f"[Hydra] Experiment sweep Bcc: {SPY} ended: 1 finished"
    assert message.recipients() == ["ops@lab.example"]
    assert "Bcc" not in message.message()  # no such header
