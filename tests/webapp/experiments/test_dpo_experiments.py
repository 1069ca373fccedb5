"""DPO experiments: the objective in the form and pasted YAML/JSON, refused with a clear message where it cannot
train (a dataset of another kind, a model from scratch, odd micro-batches, a bad beta, DPO settings on an sft
experiment), and the specs, held-out rows and memory plans of the trials of a DPO sweep on a catalog checkpoint."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.experiments.instruction import chat_checkpoint, chat_dataset
from tests.webapp.experiments.preference import N_PAIRS, N_TRAIN, held_out_rows, preference_dataset
from tests.webapp.experiments.test_forms import bound, planned_errors, post_data, text
from webapp.datasets.models import DatasetTokens
from webapp.experiments import services
from webapp.experiments.launching import trial_job
from webapp.experiments.search_space import SearchSpaceError, parse_search_space
from webapp.experiments.selectors import experiment_spec
from webapp.experiments.space_rows import experiment_initial
from webapp.experiments.space_text import load_spec_text, objective_of_text
from webapp.experiments.trial_settings import trial_settings
from webapp.ground.models import Experiment
from worker.engine.config import TrialSpec
from worker.engine.pairs import PairRows

pytestmark = pytest.mark.django_db

SWEEP = [{"name": "dpo_beta", "kind": "categorical", "values": "0.1, 0.5"},
         {"name": "dpo_loss_type", "kind": "categorical", "values": "sigmoid"},
         {"name": "lora_r", "kind": "categorical", "values": "0, 4"},
         {"name": "batch_size", "kind": "categorical", "values": "4"},
         {"name": "max_seq_len", "kind": "categorical", "values": "78"}]


@pytest.fixture
def checkpoint(alice):
    return chat_checkpoint(alice)


@pytest.fixture
def prefs(alice_team, checkpoint):
    return preference_dataset(alice_team, checkpoint)


def dpo_data(dataset, checkpoint, rows=None, **fields):
    return post_data(dataset, rows=SWEEP if rows is None else rows,
                     **{"model_kind": "checkpoint", "checkpoint": checkpoint.pk, "objective": "dpo"} | fields)


def test_dpo_beta_is_a_log_scale_parameter_and_a_bad_beta_or_loss_type_is_refused():
    space = parse_search_space({"dpo_beta": {"kind": "logfloat", "low": 0.03, "high": 0.3},
                                "dpo_loss_type": ["sigmoid", "ipo"]})
    assert space.to_dict() == {"dpo_beta": {"kind": "logfloat", "low": 0.03, "high": 0.3},
                               "dpo_loss_type": {"kind": "categorical", "values": ["sigmoid", "ipo"]}}
    for bad, says in [({"dpo_beta": 0}, "outside"), ({"dpo_beta": -0.1}, "outside"),
                      ({"dpo_beta": "strong"}, "not a number"),
                      ({"dpo_beta": {"kind": "logfloat", "low": 0, "high": 1}}, "outside"),
                      ({"dpo_loss_type": "hinge"}, "not one of sigmoid, ipo"),
                      ({"beta": 0.1}, "did you mean dpo_beta")]:
        with pytest.raises(SearchSpaceError, match=says):
            parse_search_space(bad)


def test_pasted_text_names_the_objective_beside_the_parameters():
    pasted = "objective: dpo\ndpo_beta: [0.1, 0.2]\nlora_r: 4\n"
    assert objective_of_text(pasted) == "dpo"
    model, space = load_spec_text(pasted)
    assert model is None and [d.name for d in space] == ["dpo_beta", "lora_r"]
    assert objective_of_text("lr: 0.001\n") is None


def test_the_form_makes_a_dpo_draft_and_a_clone_keeps_its_objective(alice_team, prefs, checkpoint):
    form = bound(alice_team, dpo_data(prefs, checkpoint))
    assert form.is_valid(), form.errors
    draft = form.cleaned_data["draft"]
    assert draft.objective == "dpo" and draft.to_dict()["objective"] == "dpo"
    experiment = services.experiment_create(team=alice_team, user=None, draft=draft)
    assert experiment.objective == Experiment.Objective.DPO
    initial, rows = experiment_initial(experiment)
    assert initial["objective"] == "dpo" and rows[0]["name"] == "dpo_beta"
    assert experiment_spec(experiment)["objective"] == "dpo"
    form = bound(alice_team, post_data(prefs, rows=[], space_text="objective: dpo\ndpo_beta: [0.2]\nbatch_size: 4\n",
                                       model_kind="checkpoint", checkpoint=checkpoint.pk))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["draft"].objective == "dpo"


@pytest.mark.parametrize("fields, where, says", [
    ({"objective": "sft"}, "objective", "holds preference pairs, which train with DPO: choose objective dpo"),
    ({"model_kind": "preset", "preset": "llama-micro"}, "model_kind", "a model from scratch would be compared "
                                                                       "with random weights"),
    ({"space-3-values": "3"}, "batch_size", "batch_size: 3 is odd"),
    ({"micro_batches_row": "2"}, "batch_size", "in 2 micro-batches gives 1 rows each"),
    ({"space-0-values": "0"}, "dpo_beta", "outside"),
    ({"space-0-values": "much"}, "dpo_beta", "not a number"),
])
def test_what_dpo_cannot_train_is_refused_saying_what_to_change(alice_team, prefs, checkpoint, fields, where, says):
    rows = [dict(row) for row in SWEEP]
    if fields.pop("micro_batches_row", None):
        rows[3]["values"] = "2"
        rows.append({"name": "micro_batches", "kind": "categorical", "values": "2"})
    form = planned_errors(bound(alice_team, dpo_data(prefs, checkpoint, rows=rows, **fields)))
    errors = form.errors.get(where) or (form.row_for(where).errors if form.row_for(where) else {})
    assert says in text(errors), form.errors


def test_dpo_on_a_chat_dataset_and_dpo_settings_on_an_sft_experiment_are_refused(alice_team, checkpoint):
    chat = chat_dataset(alice_team)
    form = planned_errors(bound(alice_team, dpo_data(chat, checkpoint)))
    assert "objective dpo trains on preference pairs, and chat is chat messages" in text(form.errors["dataset"])
    form = planned_errors(bound(alice_team, dpo_data(chat, checkpoint, objective="sft")))
    assert "dpo_beta: applies to objective dpo" in text(form.row_for("dpo_beta").errors)
    form = bound(alice_team, post_data(chat, model_kind="checkpoint", checkpoint=checkpoint.pk, pruner="asha",
                                       pruner_metric="reward_accuracy"))
    assert not form.is_valid()
    assert "a DPO trial's figure" in text(form.errors["pruner_metric"])
    form = bound(alice_team, post_data(chat, space_text="objective: ppo\nlr: 0.001\n"))
    assert not form.is_valid() and "'ppo' is not one of sft, dpo" in text(form.errors["space_text"])


def test_a_dpo_sweep_s_trials_train_on_pairs_with_beta_and_declare_their_held_out_rows(
        alice, alice_team, prefs, checkpoint, scheduler, django_capture_on_commit_callbacks):
    form = bound(alice_team, dpo_data(prefs, checkpoint, pruner="median", pruner_metric="reward_accuracy"))
    assert form.is_valid(), form.errors
    experiment = services.experiment_create(team=alice_team, user=None, draft=form.cleaned_data["draft"])
    assert experiment.pruner["metric"] == "reward_accuracy"
    token_set = DatasetTokens.objects.get(dataset=prefs)
    holdout = held_out_rows(token_set.examples_dir, seq_len=78)
    assert holdout == 2 * (N_PAIRS - N_TRAIN - 1)  # the last held-out pair is longer than 78 tokens
    trials = list(experiment.trials.order_by("number"))
    assert [(t.params["dpo_beta"], t.params["lora_r"]) for t in trials] == [(0.1, 0), (0.1, 4), (0.5, 0), (0.5, 4)]
    for trial in trials:
        job = trial_job(trial=trial)
        spec = job.trial
        assert spec.dpo is not None and (spec.dpo.beta, spec.dpo.loss_type) == (trial.params["dpo_beta"], "sigmoid")
        assert (spec.data.pairs, spec.data.loss_on, spec.data.examples_dir) == (True, "assistant",
                                                                                str(token_set.examples_dir))
        assert (spec.data.train_examples, spec.data.holdout_rows, spec.batch_size) == (N_TRAIN, holdout, 4)
        assert (spec.lora is None) == (trial.params["lora_r"] == 0)
        assert TrialSpec.from_dict(spec.to_dict()) == spec
        assert job.pruning.pruner.metric == "reward_accuracy" and job.pruning.pruner.direction == "maximize"
        rows = PairRows.of(spec.data, vocab_size=spec.model.vocab_size)  # the engine checks the declared rows
        assert 2 * len(rows.val_examples) == holdout
        plan = trial.plan
        if spec.lora is None:  # the reference's log-probabilities, two fp32 a pair, from a first pass
            assert plan["dpo_reference"] == "first pass, log-probs kept"
            assert plan["spilled_bytes"]["reference_log_probs"] == 8 * N_PAIRS
        else:  # the shared base with its adapters off
            assert plan["dpo_reference"] == "shared base, adapters off"
            assert "reference_log_probs" not in plan["spilled_bytes"]
        shown = {s.name: s.value for s in trial_settings(trial)}
        assert (shown["dpo_beta"], shown["dpo_loss_type"]) == (trial.params["dpo_beta"], "sigmoid")
        assert "loss_on" not in shown


def test_an_epoch_of_a_dpo_trial_is_two_rows_a_training_pair(alice_team, prefs, checkpoint):
    form = bound(alice_team, dpo_data(prefs, checkpoint, budget_unit="epochs", budget=1))
    assert form.is_valid(), form.errors
    experiment = services.experiment_create(team=alice_team, user=None, draft=form.cleaned_data["draft"])
    assert {t.total_steps for t in experiment.trials.all()} == {2 * N_TRAIN // 4}  # batches of 4 rows: 2 pairs


def test_the_pages_offer_the_objective_and_show_a_dpo_experiment_s_setup(alice_client, alice_team, prefs, checkpoint):
    form = alice_client.get(reverse("experiment_create")).content.decode()
    assert '<option value="dpo">Preference tuning (DPO)</option>' in form
    assert '<option value="reward_accuracy">preference accuracy (DPO; higher is better)</option>' in form
    experiment = services.experiment_create(team=alice_team, user=None, draft=_draft(alice_team, prefs, checkpoint))
    page = alice_client.get(reverse("experiment_detail", args=[experiment.pk])).content.decode()
    assert '<dd id="objective">Preference tuning (DPO)</dd>' in page
    assert '<span class="param">dpo_beta=searched</span> <span class="param">dpo_loss_type=sigmoid</span>' in page
    assert "every held-out pair that fits max_seq_len" in page
    assert "(trained as pairs)" in page and "(trained as examples)" not in page
    assert "A pair whose chosen or rejected sequence is longer than max_seq_len" in page
    assert "<th>Best val loss</th>" not in page and ">Best val DPO loss</th>" in page
    assert ">Chosen answers' ppl</th>" in page
    trial_page = alice_client.get(reverse("trial_detail", args=[experiment.trials.first().pk])).content.decode()
    assert ">Best val DPO loss</dt>" in trial_page and ">Chosen answers' ppl</dt>" in trial_page
    assert "trials compared by reward margin (DPO; higher is better)" in page


def _draft(team, dataset, checkpoint):
    form = bound(team, dpo_data(dataset, checkpoint, pruner="asha", pruner_metric="reward_margin"))
    assert form.is_valid(), form.errors
    return form.cleaned_data["draft"]
