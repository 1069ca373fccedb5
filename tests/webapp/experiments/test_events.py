"""The one service that applies what the workers report: every status and messages, called directly and from
the queue's real events stream, and TPE continuation end to end with real device workers and the ingest
(called directly, it is tested with the other services in test_services.py)."""

from __future__ import annotations

import dataclasses
import time

import pytest
from django.test import Client

from tests.webapp.experiments.conftest import planned
from tests.webapp.experiments.factories import make_experiment
from tests.worker.conftest import device_workers  # noqa: F401 -- a fixture
from webapp.experiments import events, services
from webapp.experiments.ingest import telemetry_ingest
from webapp.experiments.reconcile import trials_reconcile
from webapp.ground.models import Trial
from webapp.health.models import SkippedEntry
from worker.contract import TrialState
from worker.scheduling.telemetry import stream_key

TPE_SPACE = {"lr": {"kind": "logfloat", "low": 1e-4, "high": 1e-2}}


def _launched(alice_team, alice_dataset, capture, **fields) -> Trial:
    experiment = make_experiment(alice_team, alice_dataset, **fields)
    with capture(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice_team.memberships.get().user)
    return experiment.trials.order_by("number").first()


def test_it_moves_a_trial_through_every_status(alice_team, alice_dataset, scheduler,
                                               django_capture_on_commit_callbacks) -> None:
    trial = _launched(alice_team, alice_dataset, django_capture_on_commit_callbacks)
    assert trial.status == "planning"
    for state in (TrialState.RUNNABLE, TrialState.RUNNING, TrialState.PAUSED, TrialState.RUNNABLE,
                  TrialState.RUNNING):
        assert events.trial_event_apply(trial_id=trial.queue_id, status=state)
        trial.refresh_from_db()
        assert trial.status == state
    assert trial.started is not None and trial.finished is None
    assert events.trial_event_apply(trial_id=trial.queue_id, status="failed", message="unit 3 failed on cpu0")
    trial.refresh_from_db()
    assert (trial.status, trial.message) == ("failed", "unit 3 failed on cpu0") and trial.finished is not None
    assert not events.trial_event_apply(trial_id=trial.queue_id, status="running")  # ended stays ended
    for ended in ("finished", "cancelled"):
        other = _launched(alice_team, alice_dataset, django_capture_on_commit_callbacks)
        assert events.trial_event_apply(trial_id=other.queue_id, status=ended)
        other.refresh_from_db()
        assert other.status == ended
    with pytest.raises(ValueError, match="Unknown trial status 'exploded'"):
        events.trial_event_apply(trial_id=trial.queue_id, status="exploded")


def test_it_applies_the_queues_own_events_with_the_measured_plan(alice_team, alice_dataset, scheduler,
                                                                 django_capture_on_commit_callbacks) -> None:
    trial = _launched(alice_team, alice_dataset, django_capture_on_commit_callbacks)
    planned(scheduler, trial.queue_id)  # the queue publishes "runnable", with the plan a device measured
    scheduler.device_start("cpu0", "e")
    lease = scheduler.claim(trial.queue_id, "cpu0")
    assert lease is not None
    scheduler.complete(lease, remaining_units=0, unit_s=0.1, message="done early", steps_done=7)
    # Both trials of the experiment were queued (planning); this one went on: runnable, running, finished.
    assert events.trial_events_sync() == 5
    trial.refresh_from_db()
    assert (trial.status, trial.message) == ("finished", "done early")
    assert trial.step == 7  # from the finished event: no step metric was ingested
    assert trial.plan["source"] == "measured"
    assert events.trial_events_sync() == 0  # the cursor moved past them


def test_a_page_shows_the_status_without_the_ingest(alice_team, alice_dataset, alice_client, scheduler,
                                                    django_capture_on_commit_callbacks) -> None:
    trial = _launched(alice_team, alice_dataset, django_capture_on_commit_callbacks)
    planned(scheduler, trial.queue_id)
    response = alice_client.get(f"/trials/{trial.pk}/")
    assert response.status_code == 200
    trial.refresh_from_db()
    assert trial.status == "runnable"


@pytest.mark.processes
def test_a_tpe_experiment_runs_to_its_end_on_real_workers_through_the_ingest(
    alice_team, alice_dataset, settings, device_workers, django_capture_on_commit_callbacks  # noqa: F811
) -> None:
    workers = device_workers("cpu0", "cpu1")
    settings.HYDRA = dataclasses.replace(settings.HYDRA,
                                         worker=dataclasses.replace(settings.HYDRA.worker, host_id=workers.host_id))
    first = _launched(alice_team, alice_dataset, django_capture_on_commit_callbacks, strategy="tpe", n_trials=6,
                      space=TPE_SPACE, budget=4, eval_every=2)
    experiment = first.experiment
    deadline = time.monotonic() + 240
    while True:
        with django_capture_on_commit_callbacks(execute=True):  # TPE's next trials are queued on commit
            telemetry_ingest(host_id=workers.host_id)
        trials = list(experiment.trials.order_by("number"))
        if len(trials) == 6 and all(t.status in Trial.ENDED for t in trials):
            break
        assert time.monotonic() < deadline, f"{[t.status for t in trials]}\n{workers.logs()}"
        time.sleep(0.2)
    assert [t.status for t in trials] == ["finished"] * 6
    assert all(t.step == t.total_steps == 4 and t.best_val_loss is not None for t in trials)
    assert all(t.plan["source"] == "measured" for t in trials)


ONE_TRIAL = {"lr": {"values": [0.001]}, "batch_size": {"values": [2]}}


def _running(team, dataset, scheduler, capture) -> tuple[Trial, object]:
    """A one-trial experiment of `team` launched, planned and claimed by a device: its trial and the lease."""
    trial = _launched(team, dataset, capture, space=ONE_TRIAL)
    planned(scheduler, trial.queue_id)
    scheduler.device_start("cpu0", "e")
    lease = scheduler.claim(trial.queue_id, "cpu0")
    assert lease is not None
    return trial, lease


def test_a_report_that_cannot_be_recorded_fails_its_trial_alone_and_the_ingest_goes_on(
        alice_team, alice_dataset, bob_team, bob_dataset, scheduler, redis_client, django_user_model,
        django_capture_on_commit_callbacks) -> None:
    """One team's poisoned event (a step count no column holds) is recorded against its trial; the other
    team's trial, reported after it, still finishes, and the health page lists what was skipped."""
    alices, _ = _running(alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks)
    bobs, bobs_lease = _running(bob_team, bob_dataset, scheduler, django_capture_on_commit_callbacks)
    poisoned = redis_client.xadd(stream_key(scheduler.host_id, "events"), {
        "trial": alices.queue_id, "state": "finished", "message": "", "steps_done": str(2**64)})
    scheduler.complete(bobs_lease, remaining_units=0, unit_s=0.1, steps_done=5)

    with django_capture_on_commit_callbacks(execute=True):
        telemetry_ingest(host_id=scheduler.host_id)

    alices.refresh_from_db()
    bobs.refresh_from_db()
    assert (bobs.status, bobs.step) == ("finished", 5)
    assert alices.status == "failed" and alices.finished is not None
    assert f"events entry {poisoned}" in alices.message and "could not be recorded" in alices.message
    skipped = SkippedEntry.objects.get()
    assert (skipped.stream, skipped.entry_id, skipped.trial) == ("events", poisoned, alices.queue_id)
    assert events.trial_events_sync(host_id=scheduler.host_id) == 0  # the cursor moved past it
    assert alices.queue_id in trials_reconcile(host_id=scheduler.host_id).cancelled  # the queue stops running it
    staff = Client()
    staff.force_login(django_user_model.objects.create(username="oscar", is_staff=True))
    page = staff.get("/health/").content.decode()
    assert 'id="health-skipped"' in page and poisoned in page and f"/trials/{alices.pk}/" in page


def test_a_workers_message_with_a_nul_is_kept_with_a_replacement_character(
        alice_team, alice_dataset, bob_team, bob_dataset, scheduler, django_capture_on_commit_callbacks) -> None:
    """A trial that fails on a data row holding U+0000 reports it in its message: PostgreSQL's text cannot hold
    it, so it is kept as U+FFFD, and the events after it are applied."""
    alices, alices_lease = _running(alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks)
    bobs, bobs_lease = _running(bob_team, bob_dataset, scheduler, django_capture_on_commit_callbacks)
    scheduler.fail(alices.queue_id, alices_lease.token, "row 3 cannot be read: 'a\x00b'")
    scheduler.complete(bobs_lease, remaining_units=0, unit_s=0.1, steps_done=5)

    with django_capture_on_commit_callbacks(execute=True):
        telemetry_ingest(host_id=scheduler.host_id)

    alices.refresh_from_db()
    bobs.refresh_from_db()
    assert (alices.status, alices.message) == ("failed", "row 3 cannot be read: 'a\ufffdb'")
    assert bobs.status == "finished"
    assert not SkippedEntry.objects.exists()
