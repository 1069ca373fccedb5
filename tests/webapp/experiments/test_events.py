"""The one service that applies what the workers report: every status and messages, called directly and from
the queue's real events stream, and TPE continuation end to end with real device workers and the ingest
(called directly, it is tested with the other services in test_services.py)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tests.webapp.experiments.conftest import planned
from tests.webapp.experiments.factories import make_experiment
from tests.worker.conftest import device_workers  # noqa: F401 -- a fixture
from webapp.experiments import events, services
from webapp.experiments.ingest import telemetry_ingest
from webapp.ground.models import Trial
from worker.contract import TrialState

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
