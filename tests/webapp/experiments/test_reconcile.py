"""Launches and deletes that cannot be left half done, against the real queue (Redis) and PostgreSQL.

A crash between a launch's commit and its submit is a launch whose on-commit callbacks were captured and
never run; Redis down is the configuration pointing at a closed port.
"""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from django.core.management import call_command

from tests.webapp.experiments.conftest import planned
from tests.webapp.experiments.factories import make_experiment
from tests.worker.conftest import device_workers  # noqa: F401 -- a fixture
from webapp import queue_client
from webapp.experiments import events, services
from webapp.experiments.launching import trial_send, trial_sent_job
from webapp.experiments.reconcile import Reconciled, trials_reconcile
from webapp.experiments.trial_data import heldout_data, token_set_at
from webapp.ground.models import Experiment, Trial
from webapp.worker_door import EngineJob, TrialSpec
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
    assert record.state == "planning" and record.job == json.loads(json.dumps(trial_sent_job(trial=first).to_dict()))
    assert record.job["trial"] == first.spec and "resume" not in record.job
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
    # The job the launch's send made: the trial's spec with the held-out set the send declares in it.
    data = trial.spec["data"]
    held_out = heldout_data(dataset=alice_dataset, holdout_bytes=None,
                            token_set=token_set_at(dataset=alice_dataset, tokens_path=data["tokens_path"]))
    spec = {**trial.spec, "data": {**data, **held_out}}
    job = EngineJob(trial=TrialSpec.from_dict(spec), budget="explicit")
    queue_client.trial_submit(trial_id=trial.queue_id, job=job, export_dir=str(trial.export_dir_for(trial.queue_id)))

    trials_reconcile()

    trial.refresh_from_db()
    assert (trial.status, trial.submitted) == ("planning", True), trial.message
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


def test_a_trial_deleted_while_redis_is_down_is_cancelled_by_the_first_pass_once_it_is_back(
        alice, alice_team, alice_dataset, alice_client, scheduler, settings, data_dir,
        django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    trial, other = experiment.trials.order_by("number")
    planned(scheduler, trial.queue_id)
    spill = data_dir / "spill" / trial.queue_id
    spill.mkdir(parents=True)
    reachable = settings.HYDRA.worker.redis_url
    _redis_at(settings, CLOSED_PORT_URL)

    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(f"/trials/{trial.pk}/delete/", follow=True)
    assert response.status_code == 200
    assert not Trial.objects.filter(pk=trial.pk).exists() and not spill.exists()
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_delete(experiment=experiment, actor=alice)
    assert not Experiment.objects.filter(pk=experiment.pk).exists()

    _redis_at(settings, reachable)
    assert scheduler.trial(trial.queue_id).state == "runnable"  # the queue still holds them
    assert trials_reconcile() == Reconciled(submitted=[], cancelled=[trial.queue_id, other.queue_id])
    assert {scheduler.trial(t).state for t in (trial.queue_id, other.queue_id)} == {"cancelled"}
    # A device's next survey frees each one's spill store on its host (tests/worker: cancelled stores freed).
    assert sorted(scheduler.client.lrange(scheduler.key("reap"), 0, -1)) == sorted([trial.queue_id, other.queue_id])
    assert trials_reconcile() == Reconciled(submitted=[], cancelled=[])


def test_the_ingest_command_reconciles_this_hosts_queue(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks, capsys):
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    scheduler.submit(trial_id="orphan", job=SyntheticJob(units=1), export_dir="/x")

    call_command("hydra_ingest", "--once")

    assert all(t.submitted for t in experiment.trials.all())
    assert scheduler.trial("orphan").state == "cancelled"
    assert "submitted 2, cancelled 1" in capsys.readouterr().out


@pytest.mark.processes
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


def _launched(alice, team, dataset, capture, **fields) -> Experiment:
    experiment = make_experiment(team, dataset, **fields)
    with capture(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    return experiment


def _queue_emptied(scheduler) -> None:
    """Redis lost the host's queue (what FLUSHALL does to it)."""
    scheduler.client.delete(*scheduler.client.scan_iter(match=scheduler.key("*"), count=1000))


def test_trials_the_queue_lost_are_sent_again_to_resume_and_show_so_from_that_pass_on(
        alice, alice_team, alice_dataset, alice_client, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks,
                           space={"lr": {"values": [0.001, 0.002, 0.003]}, "batch_size": {"values": [2]}})
    running, paused, waiting = experiment.trials.order_by("number")
    for trial in (running, paused):
        planned(scheduler, trial.queue_id)
    events.trial_event_apply(trial_id=running.queue_id, status="running", step=4)
    events.trial_event_apply(trial_id=paused.queue_id, status="paused", step=2)
    _queue_emptied(scheduler)

    assert trials_reconcile() == Reconciled(submitted=[], cancelled=[], ended=[], resubmitted=[
        running.queue_id, paused.queue_id, waiting.queue_id])

    for trial in (running, paused, waiting):
        trial.refresh_from_db()
        record = scheduler.trial(trial.queue_id)
        assert (trial.status, record.state) == ("planning", "planning")
        assert record.job["trial"] == trial.spec
        assert record.job.get("resume", False) is (trial != waiting)  # a trial never planned starts afresh
    assert running.step == 4 and running.message.startswith("The scheduler lost this trial")
    assert scheduler.trial(paused.queue_id).control == "pause"  # paused again once a device plans it
    page = alice_client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "Running" not in page
    assert trials_reconcile() == Reconciled(submitted=[], cancelled=[])


@pytest.mark.parametrize("event_lost", [True, False], ids=["event-lost-with-redis", "event-not-read-yet"])
def test_a_trial_whose_end_the_database_missed_takes_it_from_its_event_or_else_from_the_queue(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks, event_lost):
    experiment = _launched(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    trial, _ = experiment.trials.order_by("number")
    planned(scheduler, trial.queue_id)
    events.trial_events_sync()
    lease = scheduler.claim(trial.queue_id, "cpu0")
    scheduler.fail(trial.queue_id, lease.token, "unit 0 failed on cpu0: boom")
    if event_lost:
        scheduler.client.delete(scheduler.key("events"))  # its events were lost with Redis
    # else the trial ended after the ingest's last read: its event is in the stream, not read yet

    # Taken from the queue's record only when the event is gone.
    assert trials_reconcile().ended == ([trial.queue_id] if event_lost else [])
    trial.refresh_from_db()
    assert (trial.status, trial.message) == ("failed", "unit 0 failed on cpu0: boom")
    assert events.trial_events_sync() == 0


def test_cancelling_a_trial_the_queue_does_not_hold_cancels_it_and_pausing_says_why_not(
        alice, alice_team, alice_dataset, alice_client, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    trial, other = experiment.trials.order_by("number")
    for each in (trial, other):
        events.trial_event_apply(trial_id=each.queue_id, status="running")
    _queue_emptied(scheduler)

    response = alice_client.post(f"/trials/{other.pk}/pause/", follow=True)
    assert "does not hold trial #2 right now" in response.content.decode()
    response = alice_client.post(f"/trials/{trial.pk}/cancel/", follow=True)
    assert "refused" not in response.content.decode()

    trial.refresh_from_db()
    assert (trial.status, trial.message) == ("cancelled", "Cancelled. The scheduler no longer held this trial.")
    assert trials_reconcile().resubmitted == [other.queue_id]  # the cancelled one is not sent again


def test_a_trial_cancelled_while_its_resubmission_landed_is_cancelled_in_the_queue_too(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    trial, _ = experiment.trials.order_by("number")
    events.trial_event_apply(trial_id=trial.queue_id, status="cancelled")  # the row stopped; the queue runs it

    assert trials_reconcile().cancelled == [trial.queue_id]
    assert scheduler.trial(trial.queue_id).state == "cancelled"


def test_pages_showing_statuses_say_when_the_scheduler_cannot_be_reached(
        alice, alice_team, alice_dataset, alice_client, scheduler, settings, django_capture_on_commit_callbacks):
    experiment = _launched(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    trial = experiment.trials.get(number=1)
    events.trial_event_apply(trial_id=trial.queue_id, status="running")
    pages = ["/experiments/", f"/experiments/{experiment.pk}/", f"/trials/{trial.pk}/"]
    assert not any(events.SCHEDULER_DOWN in alice_client.get(page).content.decode() for page in pages)

    _redis_at(settings, CLOSED_PORT_URL)
    for page in pages:
        response = alice_client.get(page)
        assert response.status_code == 200 and events.SCHEDULER_DOWN in response.content.decode(), page


def test_one_ingest_at_a_time_reconciles_and_another_takes_over_once_it_stops(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    assert queue_client.role_take(role="reconciler", owner="ingest@elsewhere:1", ttl_s=60)

    call_command("hydra_ingest", "--once")
    assert not any(t.submitted for t in experiment.trials.all())  # the other ingest's to do
    assert queue_client.role_holder(role="reconciler") == "ingest@elsewhere:1"

    scheduler.client.delete(scheduler.key("role:reconciler"))  # it stopped renewing, and its role lapsed
    call_command("hydra_ingest", "--once")
    assert all(t.submitted for t in experiment.trials.all())
    assert not queue_client.role_take(role="reconciler", owner="ingest@elsewhere:1", ttl_s=60)


def test_trials_are_queued_as_their_team_s_and_each_pass_gives_the_scheduler_the_teams_weights(
        alice, alice_team, bob_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    bob_team.share_weight = 3.0
    bob_team.save()
    trials_reconcile()
    first = experiment.trials.order_by("number").first()
    assert scheduler.client.hget(scheduler.key(f"trial:{first.queue_id}"), "team") == str(alice_team.pk)
    assert scheduler.client.hgetall(scheduler.key("weights")) == {str(alice_team.pk): "1.0",
                                                                  str(bob_team.pk): "3.0"}


def test_a_trial_is_queued_with_the_host_memory_its_plan_says_its_store_takes(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    trials_reconcile()
    first = experiment.trials.order_by("number").first()
    spilled = first.plan["spilled_bytes"]
    expected = (sum(spilled.values()) + spilled["parameters"]
                + max(s["state_bytes"] for s in first.plan["shards"]))
    assert expected > 0 and first.host_bytes() == expected
    assert scheduler.client.hget(scheduler.key(f"trial:{first.queue_id}"), "host_bytes") == str(expected)


def test_an_experiment_s_priority_goes_with_its_trials_to_the_queue(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    experiment = _launched_without_send(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks,
                                        priority="high")
    trials_reconcile()
    record = scheduler.trial(experiment.trials.order_by("number").first().queue_id)
    assert (record.team, record.priority) == (str(alice_team.pk), 2)


def test_the_host_memory_a_trial_takes_per_device_beyond_the_first_follows_its_shards() -> None:
    """Several shards: a micro-batch in flight keeps its boundaries. One shard: every micro-batch of a step but the
    first may park a gradient until those ahead of them are summed (a DPO trial's as any other)."""
    one = {"shards": [{"index": 0}], "spilled_bytes": {"parameters": 1000, "optimizer": 2000,
                                                       "boundary_activations": 0}}
    several = {"shards": [{"index": 0}, {"index": 1}], "spilled_bytes": {"parameters": 1000, "optimizer": 2000,
                                                                         "boundary_activations": 512}}
    assert Trial(plan=one, spec={"micro_batches": 6, "dpo": None}).lane_bytes() == 5 * 1000
    assert Trial(plan=one, spec={"micro_batches": 2, "dpo": None}).lane_bytes() == 1000
    assert Trial(plan=one, spec={"micro_batches": 1, "dpo": None}).lane_bytes() == 0
    assert Trial(plan=one, spec={"micro_batches": 6, "dpo": {"beta": 0.1}}).lane_bytes() == 5 * 1000
    assert Trial(plan=several, spec={"micro_batches": 6, "dpo": None}).lane_bytes() == 512
    assert Trial(plan=None, spec={"micro_batches": 6}).lane_bytes() == 0
