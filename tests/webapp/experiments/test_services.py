"""Experiment services: creation with plans, launch after commit, control, status records, TPE, deletion."""

from __future__ import annotations

import dataclasses

import pytest
from django.core.exceptions import ValidationError

from tests.webapp.experiments.conftest import planned
from tests.webapp.experiments.factories import make_experiment
from webapp.experiments import events, services
from webapp.experiments.planning import CapError
from webapp.ground.models import Experiment, Trial
from worker.engine.config import TrialSpec

pytestmark = pytest.mark.django_db


def test_it_creates_the_grid_trials_with_estimated_plans(alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    trials = list(experiment.trials.order_by("number"))
    assert [t.params for t in trials] == [{"lr": 0.001, "batch_size": 2}, {"lr": 0.003, "batch_size": 2}]
    assert all(t.status == Trial.Status.NEW and t.total_steps == 10 for t in trials)
    plan = trials[0].plan
    assert plan["source"] == "estimate" and plan["budget_bytes"] == 256 << 20
    assert sum(len(s["layers"]) for s in plan["shards"]) == 4  # embedding, 2 blocks, head


def test_it_counts_epochs_in_steps(alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset, budget_unit="epochs", budget=2,
                                 space={"seq_len": {"values": [16]}, "batch_size": {"values": [2]}})
    expected = -(-2 * alice_dataset.train_tokens // (2 * 16))
    assert experiment.trials.get().total_steps == expected


def test_it_refuses_an_experiment_over_the_caps_and_stores_nothing(alice_team, alice_dataset, settings):
    with pytest.raises(CapError, match="HYDRA_MAX_STEPS_PER_TRIAL"):
        make_experiment(alice_team, alice_dataset, budget_unit="epochs", budget=10_000_000)
    settings.HYDRA = dataclasses.replace(settings.HYDRA, caps=dataclasses.replace(
        settings.HYDRA.caps, tokens_per_trial=10 * 2 * 64 - 1))  # steps x batch x the default sequence length
    with pytest.raises(CapError, match="HYDRA_MAX_TOKENS_PER_TRIAL"):
        make_experiment(alice_team, alice_dataset)
    assert not Experiment.objects.exists() and not Trial.objects.exists()


def test_it_submits_launched_trials_only_after_commit(alice, alice_team, alice_dataset, scheduler,
                                                      django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert services.experiment_launch(experiment=experiment, actor=alice) == 2
        assert scheduler.trials() == []
    assert len(callbacks) == 2
    trial = experiment.trials.get(number=1)
    assert trial.status == Trial.Status.PLANNING and trial.queue_id == str(trial.pk)
    assert [r.trial_id for r in scheduler.trials()] == [str(t.pk) for t in experiment.trials.order_by("number")]
    record = scheduler.trial(str(trial.pk))
    assert record.state == "planning"
    assert record.export_dir == str(trial.export_dir_for(trial.queue_id))
    assert record.job["kind"] == "engine"
    engine = record.job["trial"]
    assert engine["optimizer"]["lr"] == 0.001 and engine["batch_size"] == 2
    assert engine["data"]["tokens_path"] == str(alice_dataset.tokens_path)
    assert engine["model"]["vocab_size"] == alice_dataset.vocab_size
    assert TrialSpec.from_dict(engine).to_dict()["steps"] == 10
    assert engine["early_stop_patience"] is None
    assert record.job["budget"] == "explicit"  # the form gave 256 MiB: the trial's own budget, no device decides
    assert engine["budget_bytes"] == 256 << 20


def test_an_auto_budget_is_left_to_the_device_that_plans_the_trial(alice, alice_team, alice_dataset, scheduler,
                                                                   django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset, memory_budget_bytes=None)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    assert {r.job["budget"] for r in scheduler.trials()} == {"auto"}


def test_it_sends_the_early_stopping_patience_to_the_engine(alice, alice_team, alice_dataset, scheduler,
                                                            django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset, early_stop_patience=3)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    assert {TrialSpec.from_dict(r.job["trial"]).early_stop_patience for r in scheduler.trials()} == {3}


def test_it_records_progress_and_keeps_the_best_loss(alice, alice_team, alice_dataset, scheduler,
                                                     django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    trial = experiment.trials.get(number=1)
    assert events.trial_event_apply(trial_id=trial.queue_id, status="running", step=3, remaining_s=12.0,
                                        best_val_loss=2.0)
    events.trial_event_apply(trial_id=trial.queue_id, status="running", step=5, best_val_loss=2.5)
    trial.refresh_from_db()
    assert (trial.status, trial.step, trial.remaining_s, trial.best_val_loss) == ("running", 5, 12.0, 2.0)
    assert trial.best_val_ppl == pytest.approx(7.389, rel=1e-3)
    assert trial.started is not None
    events.trial_event_apply(trial_id=trial.queue_id, status="finished", export_path="/x")
    assert not events.trial_event_apply(trial_id=trial.queue_id, status="running")  # ended stays ended
    assert not events.trial_event_apply(trial_id="999999", status="running")
    trial.refresh_from_db()
    assert trial.status == "finished" and trial.finished is not None
    with pytest.raises(ValueError, match="Unknown trial status"):
        events.trial_event_apply(trial_id=trial.queue_id, status="exploded")


def test_it_records_the_exported_model_of_a_finished_trial(alice, alice_team, alice_dataset, scheduler,
                                                          django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    exported, missing = experiment.trials.order_by("number")
    exported.export_dir_for(exported.queue_id).mkdir(parents=True)  # where the scheduler was told to export

    events.trial_event_apply(trial_id=exported.queue_id, status="finished")
    events.trial_event_apply(trial_id=missing.queue_id, status="finished")

    exported.refresh_from_db()
    missing.refresh_from_db()
    assert exported.export_path == str(exported.export_dir_for(exported.queue_id))
    assert missing.export_path == ""


def test_it_pauses_resumes_and_cancels_through_the_scheduler(alice, alice_team, alice_dataset, scheduler,
                                                             django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    trial = experiment.trials.get(number=1)
    services.trial_control(trial=trial, action="pause", actor=alice)  # while it waits to be planned: once it is
    trial.refresh_from_db()
    assert (trial.status, scheduler.trial(trial.queue_id).control) == ("planning", "pause")
    planned(scheduler, trial.queue_id)
    assert scheduler.trial(trial.queue_id).state == "paused"
    events.trial_event_apply(trial_id=trial.queue_id, status="paused")  # as the event stream reports it
    trial.refresh_from_db()
    with pytest.raises(ValidationError, match="cannot pause"):
        services.trial_control(trial=trial, action="pause", actor=alice)
    services.trial_control(trial=trial, action="resume", actor=alice)
    trial.refresh_from_db()
    assert trial.status == scheduler.trial(trial.queue_id).state == "runnable"
    services.trial_control(trial=trial, action="pause", actor=alice)
    trial.refresh_from_db()
    assert trial.status == scheduler.trial(trial.queue_id).state == "paused"
    services.trial_control(trial=trial, action="cancel", actor=alice)
    trial.refresh_from_db()
    assert trial.status == scheduler.trial(trial.queue_id).state == "cancelled"


def test_it_retries_a_failed_trial_as_a_new_attempt(alice, alice_team, alice_dataset, scheduler,
                                                    django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    trial = experiment.trials.get(number=1)
    events.trial_event_apply(trial_id=trial.queue_id, status="failed", message="boom")
    with django_capture_on_commit_callbacks(execute=True):
        assert services.experiment_retry_failed(experiment=experiment, actor=alice) == 1
    trial.refresh_from_db()
    assert (trial.status, trial.attempt, trial.queue_id, trial.message) == ("planning", 2, f"{trial.pk}.2", "")
    assert scheduler.trial(f"{trial.pk}.2").state == "planning"
    assert not events.trial_event_apply(trial_id=str(trial.pk), status="failed")  # the old attempt


def test_it_deletes_a_trial_with_its_spill_files(alice, alice_team, alice_dataset, scheduler, data_dir,
                                                 django_capture_on_commit_callbacks):
    experiment = make_experiment(alice_team, alice_dataset)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    trial = experiment.trials.get(number=1)
    spill = data_dir / "spill" / trial.queue_id
    spill.mkdir(parents=True)
    (spill / "manifest.json").write_text("{}")
    with django_capture_on_commit_callbacks(execute=True):
        services.trial_delete(trial=trial, actor=alice)
    assert not spill.exists()
    assert not Trial.objects.filter(pk=trial.pk).exists()
    assert scheduler.trial(trial.queue_id).state == "cancelled"  # it was waiting to be planned: at once


def test_it_asks_tpe_for_the_next_trial_when_one_ends(alice, alice_team, alice_dataset, scheduler,
                                                      django_capture_on_commit_callbacks):
    space = {"lr": {"kind": "logfloat", "low": 1e-4, "high": 1e-2}}
    experiment = make_experiment(alice_team, alice_dataset, strategy="tpe", n_trials=6, space=space)
    assert experiment.trials.count() == 4
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    first = experiment.trials.get(number=1)
    with django_capture_on_commit_callbacks(execute=True):
        events.trial_event_apply(trial_id=first.queue_id, status="finished", best_val_loss=3.0)
    fifth = experiment.trials.get(number=5)
    assert fifth.status == "planning"
    assert scheduler.trials()[-1].trial_id == str(fifth.pk)
    for trial in experiment.trials.exclude(pk=first.pk):
        events.trial_event_apply(trial_id=trial.queue_id, status="finished", best_val_loss=2.0)
    assert experiment.trials.count() == 6
