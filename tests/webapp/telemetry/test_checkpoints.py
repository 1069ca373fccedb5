"""Durable checkpoints in the web app: the experiment's interval reaches the trials' jobs, and the last
checkpoint the workers report (the telemetry stream ``checkpoints``) is shown on the trial's page."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.factories import make_experiment as make_planned
from tests.webapp.experiments.test_forms import bound, post_data
from tests.webapp.telemetry.factories import make_experiment
from webapp.experiments.ingest import telemetry_ingest
from webapp.experiments.launching import trial_job, trial_sent_job
from webapp.ground.models import Trial
from worker.scheduling import telemetry
from worker.scheduling.telemetry import CheckpointMetrics

pytestmark = pytest.mark.django_db


def report(client, host_id: str, trial: Trial, *, step: int, at: float, queue_id: str | None = None) -> None:
    pipe = client.pipeline()
    telemetry.add(pipe, host_id, "checkpoints",
                  CheckpointMetrics(trial=queue_id or trial.queue_id, step=step, time=at, bytes=1 << 20))
    pipe.execute()


def test_the_trial_page_shows_the_last_checkpoint_the_workers_reported(redis_client, host_id, alice_team,
                                                                        alice_client):
    trial = make_experiment(alice_team, trials=[{"lr": 1e-3}], total_steps=100).trials.get()
    page = reverse("trial_detail", args=[trial.pk])
    assert "none yet (every 30 min)" in alice_client.get(page).content.decode()
    now = time.time()
    report(redis_client, host_id, trial, step=40, at=now - 600)
    report(redis_client, host_id, trial, step=12, at=now - 1800)  # an older one, written later by another device
    report(redis_client, host_id, trial, step=90, at=now, queue_id=f"{trial.pk}.2")  # an attempt not launched

    assert telemetry_ingest(host_id=host_id)["checkpoints"] == 3

    trial.refresh_from_db()
    assert (trial.checkpoint_step, round(trial.checkpoint_at.timestamp())) == (40, round(now - 600))
    html = alice_client.get(page).content.decode()
    assert "step 40, <span" in html and "10\xa0minutes ago</span>" in html, html[html.index("Last checkpoint"):][:300]


def test_the_experiments_checkpoint_interval_reaches_every_job_of_its_trials(alice_team):
    dataset = make_dataset(alice_team, name="corpus")
    trial = make_planned(alice_team, dataset).trials.first()
    assert trial_job(trial=trial).checkpoint_minutes == 30  # the default
    trial = make_planned(alice_team, dataset, checkpoint_minutes=0).trials.first()
    assert trial.experiment.checkpoint_minutes == 0
    assert trial_job(trial=trial).checkpoint_minutes == 0
    trial.spec = trial_job(trial=trial).trial.to_dict()
    assert trial_sent_job(trial=trial, resume=True).checkpoint_minutes == 0  # sent again after the queue lost it


@pytest.mark.parametrize(("value", "error"), [("-1", "greater than or equal to 0"),
                                               ("20000", "less than or equal to 10080"), ("ten", "whole number")])
def test_the_form_refuses_an_interval_it_cannot_use(alice_team, value: str, error: str):
    dataset = make_experiment(alice_team).dataset
    form = bound(alice_team, post_data(dataset, checkpoint_minutes=value))
    assert not form.is_valid()
    assert error in " ".join(form.errors["checkpoint_minutes"])


def test_the_form_carries_the_interval_into_the_draft(alice_team):
    dataset = make_experiment(alice_team).dataset
    form = bound(alice_team, post_data(dataset, checkpoint_minutes="5"))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["draft"].checkpoint_minutes == 5
    form = bound(alice_team, post_data(dataset))  # left empty: the default
    assert form.is_valid(), form.errors
    assert form.cleaned_data["draft"].checkpoint_minutes == 30


def test_pasted_yaml_or_json_may_set_the_interval_beside_the_parameters(alice_team):
    dataset = make_experiment(alice_team).dataset
    for text in ("checkpoint_minutes: 10\nlr: {kind: categorical, values: [0.001]}",
                 '{"checkpoint_minutes": 10, "lr": {"kind": "categorical", "values": [0.001]}}'):
        form = bound(alice_team, post_data(dataset, space_text=text, checkpoint_minutes="45"))
        assert form.is_valid(), form.errors
        assert form.cleaned_data["draft"].checkpoint_minutes == 10  # the pasted text wins over the field
        assert list(form.cleaned_data["draft"].space.to_dict()) == ["lr"]
    for value in ("-5", "2.5", "true", "[1]", "20000"):
        form = bound(alice_team, post_data(dataset, space_text=f"checkpoint_minutes: {value}\nlr: {{values: [0.1]}}"))
        assert not form.is_valid()
        assert "checkpoint_minutes" in " ".join(form.errors["space_text"]), value
