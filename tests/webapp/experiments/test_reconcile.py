"""Launches and deletes that cannot be left half done, against the real queue (Redis) and PostgreSQL.

A crash between a launch's commit and its submit is a launch whose on-commit callbacks were captured and
never run; Redis down is the configuration pointing at a closed port.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from tests.webapp.experiments.conftest import planned
from tests.webapp.experiments.factories import make_experiment
from tests.worker.conftest import device_workers  # noqa: F401 -- a fixture
from webapp import queue_client
from webapp.experiments import events, services
from webapp.experiments.launching import trial_send
from webapp.experiments.models import Experiment, Trial
from webapp.experiments.reconcile import Reconciled, trials_reconcile
from worker.contract import SyntheticJob

pytestmark = pytest.mark.django_db
CLOSED_PORT_URL = "redis://127.0.0.1:1/0"


def _launched_without_send(alice, team, dataset, capture, **fields) -> Experiment:
    """Launch an experiment whose process dies after the commit, before its trials are submitted."""
    experiment = make_experiment(team, dataset, **fields)
    with capture(execute=False):
        services.experiment_launch(experiment=experiment, actor=alice)
    return experiment


def _redis_at(settings, url: str) -> None:
    settings.HYDRA = dataclasses.replace(
        settings.HYDRA, worker=dataclasses.replace(settings.HYDRA.worker, redis_url=url))


def _events_of(trial_id: str) -> list[str]:
    events_read, _ = queue_client.events_read(after="0-0", count=1000)
    return [event.state for event in events_read if event.trial_id == trial_id]


def test_a_launch_that_died_before_its_submit_is_submitted_by_one_pass_and_runs(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    first, second = experiment.trials.order_by("number")
    assert (first.status, first.submitted) == ("planning", False)
    assert scheduler.trials() == []

    assert trials_reconcile() == Reconciled(submitted=[first.queue_id, second.queue_id], cancelled=[])

    first.refresh_from_db()
    assert first.submitted and first.status == "planning"
    record = scheduler.trial(first.queue_id)
    assert record.state == "planning" and record.job == {"kind": "engine", "trial": first.spec, "budget": "explicit"}
    assert record.export_dir == str(first.export_dir_for(first.queue_id))
    planned(scheduler, first.queue_id)  # a device takes it
    events.trial_events_sync()
    first.refresh_from_db()
    assert first.status == "runnable"


def test_passes_and_late_sends_after_the_first_submit_change_nothing(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=False) as sends:
        services.experiment_launch(experiment=experiment, actor=alice)
    trial = experiment.trials.get(number=1)

    assert trial.queue_id in trials_reconcile().submitted
    submitted_at = scheduler.trial(trial.queue_id).submitted
    assert trials_reconcile() == Reconciled(submitted=[], cancelled=[])
    for send in sends:  # the launch's own sends, arriving after the pass
        send()
    assert not trial_send(queue_id=trial.queue_id)

    assert _events_of(trial.queue_id) == ["planning"]
    assert scheduler.trial(trial.queue_id).submitted == submitted_at
    assert len(scheduler.trials()) == 2


def test_a_submit_that_landed_before_the_crash_is_recorded_not_repeated(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    trial = experiment.trials.get(number=1)
    job = queue_client.EngineJob(trial=queue_client.TrialSpec.from_dict(trial.spec), budget="explicit")
    queue_client.trial_submit(trial_id=trial.queue_id, job=job, export_dir=str(trial.export_dir_for(trial.queue_id)))

    trials_reconcile()

    trial.refresh_from_db()
    assert (trial.status, trial.submitted) == ("planning", True)
    assert _events_of(trial.queue_id) == ["planning"]


def test_an_id_the_queue_holds_for_another_job_fails_the_trial(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    trial = experiment.trials.get(number=1)
    scheduler.submit(trial_id=trial.queue_id, job=SyntheticJob(units=1), export_dir="/elsewhere")

    trials_reconcile()

    trial.refresh_from_db()
    assert trial.status == "failed" and not trial.submitted
    assert trial.message == (f"The scheduler did not accept the trial: trial {trial.queue_id!r} already exists on "
                             f"host {scheduler.host_id!r}.")
    assert scheduler.trial(trial.queue_id).job["kind"] == "synthetic"  # the other job is left alone


def test_a_launch_while_redis_is_down_waits_and_is_sent_once_it_is_back(
        alice, alice_team, alice_dataset, scheduler, settings, django_capture_on_commit_callbacks):
    reachable = settings.HYDRA.worker.redis_url
    _redis_at(settings, CLOSED_PORT_URL)
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    trial = experiment.trials.get(number=1)
    assert (trial.status, trial.submitted) == ("planning", False)
    assert trial.message.startswith("Waiting to be sent to the scheduler. The scheduler could not be reached: ")
    assert "127.0.0.1:1" in trial.message

    _redis_at(settings, reachable)
    assert trials_reconcile().submitted == [trial.queue_id, experiment.trials.get(number=2).queue_id]

    trial.refresh_from_db()
    assert (trial.status, trial.submitted, trial.message) == ("planning", True, "")
    assert scheduler.trial(trial.queue_id).state == "planning"


def test_a_queued_trial_whose_row_is_gone_is_cancelled(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    kept, gone = experiment.trials.order_by("number")
    Trial.objects.filter(pk=gone.pk).delete()  # the row went without the service's cancel
    scheduler.submit(trial_id="ended-elsewhere", job=SyntheticJob(units=1), export_dir="/x")
    scheduler.cancel("ended-elsewhere")

    assert trials_reconcile() == Reconciled(submitted=[], cancelled=[gone.queue_id])

    assert scheduler.trial(gone.queue_id).state == "cancelled"
    assert scheduler.trial(kept.queue_id).state == "planning"
    assert trials_reconcile() == Reconciled(submitted=[], cancelled=[])


def test_deleting_a_trial_while_redis_is_down_is_refused_and_deletes_nothing(
        alice, alice_team, alice_dataset, alice_client, scheduler, settings, data_dir,
        django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    trial, ended = experiment.trials.order_by("number")
    events.trial_event_apply(trial_id=ended.queue_id, status="finished")
    spill = data_dir / "spill" / trial.queue_id
    spill.mkdir(parents=True)
    reachable = settings.HYDRA.worker.redis_url
    _redis_at(settings, CLOSED_PORT_URL)

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(
            ValidationError, match=r"Trial #1 may still run .* could not be reached"):
        services.trial_delete(trial=trial, actor=alice)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(ValidationError, match="Trial #1"):
        services.experiment_delete(experiment=experiment, actor=alice)
    response = alice_client.post(f"/trials/{trial.pk}/delete/", follow=True)
    assert "could not be reached" in response.content.decode()

    assert Experiment.objects.filter(pk=experiment.pk).exists()
    assert set(experiment.trials.values_list("pk", flat=True)) == {trial.pk, ended.pk}
    assert spill.exists()
    _redis_at(settings, reachable)
    assert scheduler.trial(trial.queue_id).state == "planning"
    _redis_at(settings, CLOSED_PORT_URL)
    ended.refresh_from_db()
    services.trial_delete(trial=ended, actor=alice)  # an ended trial has nothing left to stop
    assert not Trial.objects.filter(pk=ended.pk).exists()


def test_the_ingest_command_reconciles_this_hosts_queue(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks, capsys):
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    scheduler.submit(trial_id="orphan", job=SyntheticJob(units=1), export_dir="/x")

    call_command("hydra_ingest", "--once")

    assert all(t.submitted for t in experiment.trials.all())
    assert scheduler.trial("orphan").state == "cancelled"
    assert "submitted 2, cancelled 1" in capsys.readouterr().out


@pytest.mark.slow
def test_a_launch_that_died_before_its_submit_runs_to_its_end_on_a_real_worker_through_the_ingest(
        alice, alice_team, alice_dataset, settings, device_workers,  # noqa: F811
        django_capture_on_commit_callbacks):
    workers = device_workers("cpu0")
    settings.HYDRA = dataclasses.replace(settings.HYDRA,
                                         worker=dataclasses.replace(settings.HYDRA.worker, host_id=workers.host_id))
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks,
                                        space={"lr": {"values": [0.001]}, "batch_size": {"values": [2]}},
                                        budget=4, eval_every=2)
    trial = experiment.trials.get()
    deadline = time.monotonic() + 240
    while trial.status not in Trial.ENDED:
        call_command("hydra_ingest", "--once")
        trial.refresh_from_db()
        assert time.monotonic() < deadline, f"{trial.status}\n{workers.logs()}"
        time.sleep(0.2)
    assert (trial.status, trial.step) == ("finished", 4), trial.message
