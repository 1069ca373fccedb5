"""A pretrained model's trials are launched at once but sent to the scheduler only when the dataset's ids of its
tokenizer are ready; the experiment's page says it is tokenizing, and ids that cannot be made fail the trials."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.webapp.experiments.checkpoints import ready_checkpoint
from tests.webapp.experiments.factories import make_experiment
from webapp.catalog.selectors import checkpoint_dir
from webapp.catalog.services import checkpoint_remove
from webapp.datasets.models import DatasetTokens
from webapp.datasets.services import dataset_tokens_build
from webapp.experiments import services
from webapp.experiments.model_shapes import checkpoint_shape
from webapp.experiments.reconcile import trials_reconcile

pytestmark = pytest.mark.django_db


def _launched(alice, alice_team, alice_dataset, capture, **fields):
    checkpoint = ready_checkpoint(alice)
    model = {"kind": "checkpoint", "checkpoint": checkpoint.pk, "checkpoint_name": checkpoint.name}
    experiment = make_experiment(alice_team, alice_dataset, model=model, shape=checkpoint_shape(checkpoint.pk),
                                 **fields)
    with capture(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    return checkpoint, experiment


def test_the_trials_wait_for_the_models_tokens_and_are_sent_once_they_are_ready(
        alice, alice_team, alice_dataset, alice_client, scheduler, django_capture_on_commit_callbacks):
    checkpoint, experiment = _launched(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    trials = list(experiment.trials.order_by("number"))
    assert [(t.status, t.submitted) for t in trials] == [("planning", False)] * 2
    assert trials[0].message == "Waiting for alice corpus to be tokenized with tiny llama's tokenizer."
    assert scheduler.trials() == []
    page = alice_client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert 'data-status="tokenizing"' in page and "Tokenizing with tiny llama's tokenizer" in page
    assert trials_reconcile().submitted == []  # the reconciler's passes skip them meanwhile

    tokens = DatasetTokens.objects.get()
    dataset_tokens_build(tokens_id=tokens.pk)  # as the web worker does
    tokens.refresh_from_db()
    assert trials_reconcile().submitted == [t.queue_id for t in trials]
    directory = checkpoint_dir(checkpoint)
    for trial in trials:
        trial.refresh_from_db()
        assert trial.submitted and trial.message == ""
        data = trial.spec["data"]
        assert {k: data[k] for k in ("tokens_path", "seq_len", "val_fraction", "tokenizer_dir")} == {
            "tokens_path": str(tokens.path), "seq_len": 64, "val_fraction": 0.1, "tokenizer_dir": str(directory)}
        # The model's tokens split where the dataset's held-out text starts, and the final evaluation covers it.
        assert data["val_start"] == tokens.val_start
        assert data["holdout_tokens"] == len(np.load(tokens.path)) - tokens.val_start
        assert data["token_bytes_path"].endswith(".bytes.npy")
        assert trial.spec["model"]["pretrained_dir"] == str(directory)
        assert scheduler.trial(trial.queue_id).job["trial"] == trial.spec
    ids = np.load(tokens.path)
    assert Tokenizer.from_file(str(directory / "tokenizer.json")).decode(ids[:20].tolist()).startswith("The quick")
    page = alice_client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert 'data-status="ready"' in page and f"{len(ids)} tokens from tiny llama" in page


def test_an_epoch_budget_counts_the_models_own_tokens_when_they_are_sent(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    _, experiment = _launched(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks,
                              budget_unit="epochs", budget=1)
    tokens = DatasetTokens.objects.get()
    dataset_tokens_build(tokens_id=tokens.pk)
    trials_reconcile()
    tokens.refresh_from_db()
    trial = experiment.trials.order_by("number").first()
    expected = -(-tokens.train_tokens // (2 * 64))  # one epoch of the model's tokens, batch 2 x 64
    assert trial.total_steps == trial.spec["steps"] == expected
    assert tokens.train_tokens != alice_dataset.train_tokens  # another tokenizer, another count


def test_tokens_that_cannot_be_made_fail_the_trials_with_why(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    checkpoint, experiment = _launched(alice, alice_team, alice_dataset, django_capture_on_commit_callbacks)
    (checkpoint_dir(checkpoint) / "tokenizer.json").write_text("not a tokenizer")
    dataset_tokens_build(tokens_id=DatasetTokens.objects.get().pk)
    assert trials_reconcile().submitted == []
    for trial in experiment.trials.all():
        assert trial.status == "failed"
        assert trial.message.startswith("Tokenizing alice corpus with tiny llama's tokenizer failed: tiny llama's "
                                        "tokenizer could not be read")
    assert scheduler.trials() == []


def test_a_checkpoint_removed_from_the_catalog_fails_the_launch_with_why(
        alice, alice_team, alice_dataset, scheduler, django_capture_on_commit_callbacks):
    checkpoint = ready_checkpoint(alice)
    model = {"kind": "checkpoint", "checkpoint": checkpoint.pk, "checkpoint_name": checkpoint.name}
    experiment = make_experiment(alice_team, alice_dataset, model=model, shape=checkpoint_shape(checkpoint.pk))
    checkpoint_remove(actor=alice, checkpoint=checkpoint)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    for trial in experiment.trials.all():
        assert trial.status == "failed"
        assert trial.message == ("The trial's model cannot be used: Choose a ready checkpoint of the catalog; this "
                                 "one is not (or no longer) there.")
    assert scheduler.trials() == []
