"""An experiment's pruner: set in the form or pasted YAML/JSON, checked, stored, shown, and carried by every
trial's job; a pruned trial's end and rung reach its record and its curves."""

from __future__ import annotations

import pytest

from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_forms import bound, post_data, text
from webapp.dashboards.figures import learning_curves
from webapp.dashboards.selectors import Cursor, Curves, EvalSeries, TrainSeries, trial_infos
from webapp.experiments.events import trial_event_apply
from webapp.experiments.launching import trial_job, trial_sent_job
from webapp.experiments.pruning import describe
from webapp.experiments.space_rows import experiment_initial
from webapp.ground.models import Trial

pytestmark = pytest.mark.django_db


def test_the_form_sets_asha_with_its_rungs_and_an_empty_first_rung_means_the_evaluation_interval(
        alice_team, alice_dataset):
    form = bound(alice_team, post_data(alice_dataset, pruner="asha", pruner_reduction_factor=4,
                                       pruner_min_early_stopping_rate=1))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["draft"].pruner == {
        "kind": "asha", "min_resource": 5, "reduction_factor": 4, "min_early_stopping_rate": 1,
        "n_startup_trials": 5, "n_warmup_steps": 0}
    form = bound(alice_team, post_data(alice_dataset, pruner="none", pruner_min_resource=3))
    assert form.is_valid() and form.cleaned_data["draft"].pruner is None


def test_pasted_yaml_sets_the_pruner_and_bad_settings_are_refused_saying_which(alice_team, alice_dataset):
    pasted = "lr: {kind: categorical, values: [0.001, 0.01]}\npruner: {kind: hyperband, min_resource: 2}\n"
    form = bound(alice_team, post_data(alice_dataset, space_text=pasted))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["draft"].pruner["kind"] == "hyperband"
    assert form.cleaned_data["draft"].space.to_dict() == {"lr": {"kind": "categorical", "values": [0.001, 0.01]}}
    for bad, says in [("pruner: {kind: sha}", "unknown"), ("pruner: {kind: asha, reduction_factor: 1}", "at least 2"),
                      ("pruner: {kind: asha, rungs: 3}", "unknown setting rungs"),
                      ("pruner: [asha]", "give a mapping"),
                      ("pruner: {kind: asha, min_resource: -1}", "whole number")]:
        form = bound(alice_team, post_data(alice_dataset, space_text=f"lr: {{values: [0.001]}}\n{bad}\n"))
        assert not form.is_valid()
        assert says in text(form.errors["space_text"]), (bad, form.errors)
    form = bound(alice_team, post_data(alice_dataset, pruner="asha", pruner_reduction_factor=1))
    assert not form.is_valid() and "pruner_reduction_factor" in form.errors


def test_every_trial_job_carries_the_experiment_s_study_and_its_number(alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset, pruner={
        "kind": "hyperband", "min_resource": 2, "reduction_factor": 3, "min_early_stopping_rate": 0,
        "n_startup_trials": 5, "n_warmup_steps": 0})
    assert "Hyperband" in describe(experiment.pruner)
    for trial in experiment.trials.all():
        job = trial_job(trial=trial)
        assert (job.pruning.study, job.pruning.trial_number) == (f"experiment-{experiment.pk}", trial.number)
        assert job.pruning.pruner.max_resource == trial.total_steps == 10  # the longest trial
        trial.spec = job.trial.to_dict()
        assert trial_sent_job(trial=trial).pruning == job.pruning  # sent again: the same study
    assert experiment_initial(experiment)[0]["pruner"] == "hyperband"  # a clone keeps it
    plain = make_experiment(alice_team, alice_dataset)
    assert trial_job(trial=plain.trials.first()).pruning is None


def test_a_pruned_trial_records_its_rung_and_its_curve_marks_where_it_stopped(alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    trial = experiment.trials.first()
    Trial.objects.filter(pk=trial.pk).update(queue_id="q1", status=Trial.Status.RUNNING)
    assert trial_event_apply(trial_id="q1", status="pruned", message="pruned at rung 1 (step 6): ...", rung=1, step=6)
    trial.refresh_from_db()
    assert (trial.status, trial.rung, trial.step) == ("pruned", 1, 6) and trial.finished is not None
    assert not trial_event_apply(trial_id="q1", status="running")  # an ended trial stays ended

    infos = trial_infos([trial])
    curves = Curves(trials=infos, cursor=Cursor(),
                    train={trial.pk: TrainSeries(step=[0, 5], tokens=[8, 48], loss=[4.0, 3.0], time=[1.0, 2.0])},
                    evals={trial.pk: EvalSeries(step=[1, 5], loss=[3.9, 3.1], time=[1.5, 2.5],
                                                perplexity=[49.4, 22.2])})
    marks = [t for t in learning_curves(curves)["data"] if t["meta"]["role"] == "pruned"]
    assert len(marks) == 1 and marks[0]["text"] == ["pruned at rung 1"] and marks[0]["y"] == [3.1]


def test_the_final_evaluation_s_held_out_bytes_come_from_the_form_or_pasted_yaml_and_reach_each_trial(
        alice_team, alice_dataset, alice_client):
    form = bound(alice_team, post_data(alice_dataset, holdout_bytes=4096))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["draft"].holdout_bytes == 4096
    pasted = "lr: {kind: categorical, values: [0.001]}\nholdout_bytes: 2048\n"
    form = bound(alice_team, post_data(alice_dataset, space_text=pasted))
    assert form.is_valid() and form.cleaned_data["draft"].holdout_bytes == 2048
    for bad in ("holdout_bytes: 0", "holdout_bytes: 1.5", "holdout_bytes: lots"):
        form = bound(alice_team, post_data(alice_dataset, space_text=f"lr: {{values: [0.001]}}\n{bad}\n"))
        assert not form.is_valid() and "holdout_bytes" in text(form.errors["space_text"]), bad
    assert bound(alice_team, post_data(alice_dataset)).is_valid()  # empty: the whole validation text

    experiment = make_experiment(alice_team, alice_dataset, holdout_bytes=4096)
    assert experiment_initial(experiment)[0]["holdout_bytes"] == 4096
    page = alice_client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "the first 4096 bytes of the validation text" in page
    download = alice_client.get(f"/experiments/{experiment.pk}/search-space.yaml").content.decode()
    assert "holdout_bytes: 4096" in download
