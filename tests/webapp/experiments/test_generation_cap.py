"""The cap on a team's waiting generations, through the trial's page: a team that already waits for
`MAX_PENDING_PER_TEAM` is refused with a message and nothing more is sent to the web worker, another team is
not held up by it, a generation that ends frees a place, and two requests at once cannot both take the last
place."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.test import Client

from tests.webapp.experiments.conftest import scheduler  # noqa: F401 -- a fixture
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_generations import generate, random_export
from webapp.background.celery_app import web_queue
from webapp.experiments import generations
from webapp.ground.models import Generation

CAP = generations.MAX_PENDING_PER_TEAM
REFUSAL = f"Your team already waits for {CAP} generations; generate again once one of them is done."


def _sent(redis_client) -> int:
    """Tasks waiting in this test's web worker queue (no worker takes them)."""
    return redis_client.llen(web_queue())


@pytest.mark.django_db
def test_a_team_at_the_cap_is_refused_another_is_not_and_an_ended_generation_frees_a_place(
        alice_client, bob_client, alice_team, alice_dataset, bob_team, bob_dataset, scheduler, redis_client,  # noqa: F811
        django_capture_on_commit_callbacks):
    alices = random_export(make_experiment(alice_team, alice_dataset).trials.first())
    bobs = random_export(make_experiment(bob_team, bob_dataset).trials.first())
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(CAP):
            assert generate(alice_client, alices).status_code == 302
    assert _sent(redis_client) == CAP

    with django_capture_on_commit_callbacks(execute=True) as sends:
        refused = generate(alice_client, alices)
    assert refused.status_code == 400
    assert REFUSAL.replace("'", "&#x27;") in refused.content.decode()
    assert (len(sends), _sent(redis_client)) == (0, CAP)
    assert Generation.objects.filter(trial=alices).count() == CAP

    with django_capture_on_commit_callbacks(execute=True):
        assert generate(bob_client, bobs).status_code == 302  # Bob's team waits for none of Alice's
    assert Generation.objects.filter(trial=bobs, status=Generation.Status.PENDING).count() == 1

    first = Generation.objects.filter(trial=alices).order_by("pk").first()
    generations.trial_generate(generation_id=first.pk)  # the web worker's task, run here
    first.refresh_from_db()
    assert first.status == Generation.Status.DONE, first.message
    with django_capture_on_commit_callbacks(execute=True):
        assert generate(alice_client, alices).status_code == 302
    assert Generation.objects.filter(trial=alices, status=Generation.Status.PENDING).count() == CAP
    assert generate(alice_client, alices).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_two_requests_at_once_cannot_both_take_the_last_place(
        alice, alice_team, alice_dataset, scheduler, redis_client):  # noqa: F811
    if connection.vendor != "postgresql":
        pytest.skip("SQLite runs one writing transaction at a time; the race needs PostgreSQL (DATABASE_URL)")
    trial = random_export(make_experiment(alice_team, alice_dataset).trials.first())
    first_client, second_client = Client(), Client()
    first_client.force_login(alice)
    second_client.force_login(alice)
    for _ in range(CAP - 1):
        assert generate(first_client, trial).status_code == 302
    first_asked = threading.Event()
    answers: dict[str, int] = {}

    def ask_and_commit_late() -> None:
        try:
            with transaction.atomic():  # the first request's transaction is still open when the second comes
                answers["first"] = generate(first_client, trial).status_code
                first_asked.set()
                time.sleep(0.5)
        finally:
            connection.close()

    thread = threading.Thread(target=ask_and_commit_late)
    thread.start()
    assert first_asked.wait(30)
    answers["second"] = generate(second_client, trial).status_code  # waits for the first to commit
    thread.join()

    assert answers == {"first": 302, "second": 400}
    assert Generation.objects.filter(trial=trial, status=Generation.Status.PENDING).count() == CAP
    assert _sent(redis_client) == CAP
