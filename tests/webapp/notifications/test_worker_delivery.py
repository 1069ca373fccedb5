"""Webhooks delivered by a real web worker (`manage.py hydra_web_worker`) from the outbox the trial's event
wrote: a signed payload reaches a local server, a failing endpoint is retried after the (tiny) back-off until
it answers, and a hanging endpoint never holds up applying the trial's events."""

from __future__ import annotations

import hashlib
import hmac
import time

import pytest
from django.urls import reverse

from tests.webapp.notifications.conftest import delivered, trials_of
from webapp.experiments.events import trial_event_apply
from webapp.notifications import services as notify_services
from webapp.notifications.delivery import TIMEOUT_S
from webapp.notifications.models import Delivery

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]
ONE_TRIAL = {"lr": {"values": [0.001]}, "batch_size": {"values": [2]}}


def _webhook(team, url: str) -> str:
    _, secret = notify_services.settings_save(team=team, actor=team.memberships.get().user, emails=[],
                                              webhook_urls=[url])
    assert secret
    return secret


def test_the_worker_delivers_a_signed_payload_and_retries_a_failing_endpoint(
        alice_team, alice_dataset, alice_client, launched, receiver, notify_worker):
    secret = _webhook(alice_team, receiver.url)
    receiver.statuses = [500]  # the first try fails, the retry succeeds
    experiment = launched(alice_team, alice_dataset, space=ONE_TRIAL)

    trial_event_apply(trial_id=trials_of(experiment)[0].queue_id, status="failed", message="loss is NaN")

    deliveries = list(Delivery.objects.order_by("pk"))
    assert [d.notice.event for d in deliveries] == ["trial.failed", "experiment.ended"]
    done = [delivered(d, worker=notify_worker) for d in deliveries]
    assert {d.status for d in done} == {"delivered"}
    assert sorted(d.attempts for d in done) == [1, 2]  # the one that met the 500 was tried again
    requests = receiver.wait_for(3)
    for request in requests:
        signed = request.headers["X-Hydra-Timestamp"].encode() + b"." + request.body
        digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(request.headers["X-Hydra-Signature"], f"sha256={digest}")
    failed = next(r for r in requests if r.json["event"] == "trial.failed")
    assert failed.json["trial"]["message"] == "loss is NaN"
    retried = [r.headers["X-Hydra-Delivery"] for r in requests]
    assert len(set(retried)) == 2  # the retry carries the same delivery id

    page = alice_client.get(reverse("notification_settings", args=[alice_team.pk])).content.decode()
    assert page.count('data-status="delivered"') == 2 and "Answered HTTP 500" not in page


def test_a_hanging_endpoint_never_holds_up_applying_a_trials_events(
        alice_team, alice_dataset, launched, receiver, notify_worker):
    _webhook(alice_team, receiver.url)
    receiver.hang_s = 10.0  # longer than the worker's timeout
    experiment = launched(alice_team, alice_dataset)
    first, second = trials_of(experiment)

    started = time.monotonic()
    assert trial_event_apply(trial_id=first.queue_id, status="failed", message="device lost")
    applied_s = time.monotonic() - started
    receiver.wait_for(1)  # the worker is now held by the endpoint
    started = time.monotonic()
    assert trial_event_apply(trial_id=second.queue_id, status="running")
    assert trial_event_apply(trial_id=second.queue_id, status="finished")
    applied_s += time.monotonic() - started

    assert receiver.answered == 0  # every event was applied while the endpoint still held the first request
    assert [t.status for t in trials_of(experiment)] == ["failed", "finished"]
    assert applied_s < TIMEOUT_S  # no apply waited for a try, which takes TIMEOUT_S against this endpoint
    hung = Delivery.objects.get(notice__event="trial.failed")
    deadline = time.monotonic() + 30
    while not (hung.attempts and hung.message):
        assert time.monotonic() < deadline, notify_worker.log()
        time.sleep(0.2)
        hung.refresh_from_db()
    assert hung.status == "pending" and "timed out" in hung.message  # given up after TIMEOUT_S, to be retried
