"""What a team is told when its trials fail and its experiments end: recorded with the trial's status, once
however often an event is applied, only to the team that owns the experiment, and delivered by e-mail (the
locmem backend) and signed webhooks to a local server, refused when the allowlist does not cover the address."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection, transaction
from django.utils import timezone

from tests.webapp.notifications.conftest import notify_settings, trials_of
from webapp.experiments import services
from webapp.experiments.events import trial_event_apply
from webapp.notifications import services as notify_services
from webapp.notifications.delivery import delivery_run, signature
from webapp.notifications.models import Delivery, Notice

pytestmark = pytest.mark.django_db


def _notify(team, *, emails=(), webhook_urls=()) -> str | None:
    _, secret = notify_services.settings_save(team=team, actor=team.memberships.get().user, emails=list(emails),
                                              webhook_urls=list(webhook_urls))
    return secret


def _events(team) -> list[tuple[str, str]]:
    return list(Notice.objects.filter(team=team).order_by("pk").values_list("event", "key"))


def test_a_failed_trial_and_the_experiments_end_are_each_told_once(
        alice_team, alice_dataset, launched, loopback_allowed, django_capture_on_commit_callbacks):
    _notify(alice_team, emails=["ops@lab.example"])
    experiment = launched(alice_team, alice_dataset)
    first, second = trials_of(experiment)

    with django_capture_on_commit_callbacks(execute=False) as sends:
        assert trial_event_apply(trial_id=first.queue_id, status="failed", message="CUDA error: device lost")
    assert len(sends) == 1  # the delivery's task is sent once the status is committed
    assert [event for event, _ in _events(alice_team)] == ["trial.failed"]
    trial_event_apply(trial_id=first.queue_id, status="failed", message="CUDA error: device lost")  # again
    trial_event_apply(trial_id=second.queue_id, status="running")
    assert [event for event, _ in _events(alice_team)] == ["trial.failed"]

    trial_event_apply(trial_id=second.queue_id, status="finished")
    trial_event_apply(trial_id=second.queue_id, status="finished")
    assert [event for event, _ in _events(alice_team)] == ["trial.failed", "experiment.ended"]
    ended = Notice.objects.get(team=alice_team, event="experiment.ended").payload
    assert ended["trial_counts"] == {"finished": 1, "failed": 1}
    assert ended["experiment"]["id"] == experiment.pk
    assert ended["experiment"]["url"].endswith(f"/experiments/{experiment.pk}/")
    failed = Notice.objects.get(team=alice_team, event="trial.failed").payload
    assert failed["trial"] == {"number": 1, "attempt": 1, "status": "failed", "message": "CUDA error: device lost"}
    assert Delivery.objects.filter(team=alice_team, status="pending").count() == 2


def test_a_retried_trial_that_ends_again_ends_the_experiment_again(
        alice, alice_team, alice_dataset, launched, loopback_allowed, django_capture_on_commit_callbacks):
    _notify(alice_team, emails=["ops@lab.example"])
    experiment = launched(alice_team, alice_dataset)
    first, second = trials_of(experiment)
    trial_event_apply(trial_id=second.queue_id, status="cancelled")
    trial_event_apply(trial_id=first.queue_id, status="failed", message="out of memory")
    first.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        services.trial_retry(trial=first, actor=alice)
    first.refresh_from_db()
    trial_event_apply(trial_id=first.queue_id, status="finished")
    trial_event_apply(trial_id=first.queue_id, status="finished")

    assert [event for event, _ in _events(alice_team)] == ["trial.failed", "experiment.ended", "experiment.ended"]
    last = Notice.objects.filter(team=alice_team, event="experiment.ended").latest("pk").payload
    assert last["trial_counts"] == {"finished": 1, "cancelled": 1}


def test_another_teams_experiment_never_notifies_this_team(
        alice_team, bob_team, alice_dataset, bob_dataset, launched, loopback_allowed):
    _notify(alice_team, emails=["alice@lab.example"])
    bobs = launched(bob_team, bob_dataset, space={"lr": {"values": [0.001]}, "batch_size": {"values": [2]}})
    trial_event_apply(trial_id=trials_of(bobs)[0].queue_id, status="failed", message="bob's bug")
    assert not Notice.objects.exists() and not Delivery.objects.exists()  # Bob's team asked for nothing

    _notify(bob_team, emails=["bob@lab.example"])
    alices = launched(alice_team, alice_dataset, space={"lr": {"values": [0.001]}, "batch_size": {"values": [2]}})
    trial_event_apply(trial_id=trials_of(alices)[0].queue_id, status="failed", message="alice's bug")
    assert set(Delivery.objects.values_list("team__name", "target")) == {
        ("Alice lab", "alice@lab.example")}


def test_an_email_goes_through_the_configured_backend(alice_team, alice_dataset, launched, loopback_allowed):
    _notify(alice_team, emails=["ops@lab.example", "pi@lab.example"])
    experiment = launched(alice_team, alice_dataset, space={"lr": {"values": [0.001]}, "batch_size": {"values": [2]}})
    trial_event_apply(trial_id=trials_of(experiment)[0].queue_id, status="failed", message="NaN loss at step 40")
    for delivery in Delivery.objects.all():
        assert delivery_run(delivery_id=delivery.pk) == "delivered"

    by_subject = sorted((m.subject, tuple(m.to)) for m in mail.outbox)
    assert by_subject == [
        ("[Hydra] Experiment sweep ended: 1 failed", ("ops@lab.example",)),
        ("[Hydra] Experiment sweep ended: 1 failed", ("pi@lab.example",)),
        ("[Hydra] Trial #1 of sweep failed", ("ops@lab.example",)),
        ("[Hydra] Trial #1 of sweep failed", ("pi@lab.example",))]
    failure = next(m for m in mail.outbox if "Trial #1" in m.subject)
    assert "NaN loss at step 40" in failure.body and f"/experiments/{experiment.pk}/" in failure.body
    assert Delivery.objects.filter(status="delivered", attempts=1).count() == 4


def test_a_webhook_is_signed_with_the_teams_secret(alice_team, alice_dataset, launched, receiver, loopback_allowed):
    secret = _notify(alice_team, webhook_urls=[receiver.url])
    assert secret
    experiment = launched(alice_team, alice_dataset, space={"lr": {"values": [0.001]}, "batch_size": {"values": [2]}})
    trial_event_apply(trial_id=trials_of(experiment)[0].queue_id, status="finished")
    delivery = Delivery.objects.get()

    assert delivery_run(delivery_id=delivery.pk) == "delivered"
    (request,) = receiver.received
    assert request.path == "/hooks/hydra?team=a"
    signed = request.headers["X-Hydra-Timestamp"].encode() + b"." + request.body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(request.headers["X-Hydra-Signature"], f"sha256={expected}")
    assert request.headers["X-Hydra-Delivery"] == str(delivery.uid)
    assert request.headers["X-Hydra-Event"] == "experiment.ended"
    body = json.loads(request.body)
    assert body["event"] == "experiment.ended" and body["team"] == {"id": alice_team.pk, "name": "Alice lab"}
    assert body["trial_counts"] == {"finished": 1} and "time" in body
    assert signature("not the secret", request.headers["X-Hydra-Timestamp"], request.body) != \
        request.headers["X-Hydra-Signature"]


def test_an_address_the_allowlist_drops_is_refused_at_delivery_and_never_reached(
        alice_team, alice_dataset, launched, receiver, settings):
    notify_settings(settings, allowed=receiver.allowed)
    by_name = receiver.url.replace("127.0.0.1", "localhost")  # a name that resolves to the loopback
    _notify(alice_team, webhook_urls=[receiver.url, by_name])
    notify_settings(settings, allowed="hooks.example.org,192.0.2.0/24")  # the administrator narrows it since
    experiment = launched(alice_team, alice_dataset, space={"lr": {"values": [0.001]}, "batch_size": {"values": [2]}})
    trial_event_apply(trial_id=trials_of(experiment)[0].queue_id, status="cancelled")

    for delivery in Delivery.objects.all():
        assert delivery_run(delivery_id=delivery.pk) == "failed"
    assert receiver.received == []
    messages = dict(Delivery.objects.values_list("target", "message"))
    assert "does not allow webhooks to 127.0.0.1" in messages[receiver.url]
    assert "does not allow webhooks to localhost (it resolves to" in messages[by_name]
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {1}  # refused for good, not retried


def test_a_redirect_is_not_followed(alice_team, alice_dataset, launched, receiver, loopback_allowed):
    _notify(alice_team, webhook_urls=[receiver.url])
    receiver.statuses, receiver.redirect_to = [307], "http://169.254.169.254/latest/meta-data/"
    experiment = launched(alice_team, alice_dataset, space={"lr": {"values": [0.001]}, "batch_size": {"values": [2]}})
    trial_event_apply(trial_id=trials_of(experiment)[0].queue_id, status="finished")

    assert delivery_run(delivery_id=Delivery.objects.get().pk) == "failed"
    assert len(receiver.received) == 1
    assert "do not follow redirects" in Delivery.objects.get().message


def test_a_failing_endpoint_is_retried_after_the_waits_then_given_up(
        alice_team, alice_dataset, launched, receiver, settings):
    notify_settings(settings, allowed=receiver.allowed, retry_s=(10.0, 60.0))
    _notify(alice_team, webhook_urls=[receiver.url])
    receiver.statuses = [500, 502, 503]
    experiment = launched(alice_team, alice_dataset, space={"lr": {"values": [0.001]}, "batch_size": {"values": [2]}})
    trial_event_apply(trial_id=trials_of(experiment)[0].queue_id, status="finished")
    delivery = Delivery.objects.get()

    before = timezone.now()
    assert delivery_run(delivery_id=delivery.pk) == "pending"
    delivery.refresh_from_db()
    assert delivery.message == "Answered HTTP 500: ok" and delivery.resend_at == delivery.next_attempt_at
    assert before + timedelta(seconds=10) <= delivery.next_attempt_at <= timezone.now() + timedelta(seconds=10)
    assert delivery_run(delivery_id=delivery.pk) is None  # a message before the wait is over does nothing
    before = timezone.now()
    assert delivery_run(delivery_id=delivery.pk, now=delivery.next_attempt_at) == "pending"
    delivery.refresh_from_db()
    assert before + timedelta(seconds=60) <= delivery.next_attempt_at <= timezone.now() + timedelta(seconds=60)
    assert delivery_run(delivery_id=delivery.pk, now=delivery.next_attempt_at) == "failed"
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.message, len(receiver.received)) == (3, "Answered HTTP 503: ok", 3)
    assert len({r.headers["X-Hydra-Delivery"] for r in receiver.received}) == 1  # one id for every try


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite's in-memory test database locks whole tables "
                    "between threads, so the second write fails instead of waiting; the ordering this checks needs "
                    "PostgreSQL's row locks (CI runs it there)")
@pytest.mark.django_db(transaction=True)
def test_two_last_trials_ending_at_once_end_the_experiment_once(
        alice_team, alice_dataset, launched, loopback_allowed):
    _notify(alice_team, emails=["ops@lab.example"])
    first, second = trials_of(launched(alice_team, alice_dataset))
    first_applied = threading.Event()

    def end_first_and_commit_late() -> None:
        try:
            with transaction.atomic():  # as the ingest's pass does: its transaction is still open
                trial_event_apply(trial_id=first.queue_id, status="finished")
                first_applied.set()
                time.sleep(0.5)
        finally:
            connection.close()

    thread = threading.Thread(target=end_first_and_commit_late)
    thread.start()
    assert first_applied.wait(10)
    trial_event_apply(trial_id=second.queue_id, status="finished")  # waits for the first to commit, then sees it
    thread.join()

    assert [event for event, _ in _events(alice_team)] == ["experiment.ended"]
