"""A dataset used with a pretrained model is tokenized with that model's tokenizer by the web worker, once per
dataset and tokenizer however many experiments use it, and deleted with the dataset."""

from __future__ import annotations

import numpy as np
from django.conf import settings
from django.test import Client
from tokenizers import Tokenizer

from tests.webapp.datasets.factories import TINY_CORPUS, make_dataset
from tests.webapp.experiments.checkpoints import ready_checkpoint
from tests.webapp.experiments.factories import make_experiment
from webapp.catalog.selectors import checkpoint_dir
from webapp.datasets.models import DatasetTokens
from webapp.datasets.services import dataset_delete
from webapp.experiments.model_shapes import checkpoint_shape
from webapp.experiments.services import experiment_delete


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _checkpoint_experiment(team, dataset, checkpoint, capture, name):
    model = {"kind": "checkpoint", "checkpoint": checkpoint.pk, "checkpoint_name": checkpoint.name}
    with capture(execute=True):  # the tokens' task is sent once the experiment is committed
        return make_experiment(team, dataset, name=name, model=model, shape=checkpoint_shape(checkpoint.pk))


def test_two_experiments_share_one_tokenization_by_the_web_worker(
        alice, alice_team, web_worker, django_capture_on_commit_callbacks):
    dataset = make_dataset(alice_team)
    checkpoint = ready_checkpoint(alice)
    first = _checkpoint_experiment(alice_team, dataset, checkpoint, django_capture_on_commit_callbacks, "first")
    tokens = DatasetTokens.objects.get()
    assert (tokens.dataset, tokens.tokenizer_sha256, tokens.model_name) == (dataset, checkpoint.tokenizer_sha256,
                                                                           "tiny llama")
    web_worker.wait(lambda: DatasetTokens.objects.get().status != DatasetTokens.Status.TOKENIZING, 60,
                    "the tokens of the checkpoint's tokenizer")
    tokens.refresh_from_db()
    assert tokens.status == DatasetTokens.Status.READY, tokens.message
    ids = np.load(tokens.path)
    tokenizer = Tokenizer.from_file(str(checkpoint_dir(checkpoint) / "tokenizer.json"))
    assert tokens.n_tokens == len(ids) and tokens.max_id == ids.max() < checkpoint.vocab_size
    assert tokenizer.decode(ids.tolist()) == TINY_CORPUS  # the checkpoint's ids, no special tokens added
    written = tokens.path.stat().st_mtime_ns

    second = _checkpoint_experiment(alice_team, dataset, checkpoint, django_capture_on_commit_callbacks, "second")
    assert list(DatasetTokens.objects.values_list("pk", "status")) == [(tokens.pk, DatasetTokens.Status.READY)]
    assert tokens.path.stat().st_mtime_ns == written
    assert first.model == second.model
    page = client_of(alice).get(f"/datasets/{dataset.pk}/").content.decode()
    assert f"With tiny llama's tokenizer</dt><dd class=\"token-set\" data-status=\"ready\">{len(ids)} tokens" in page

    for experiment in (first, second):
        experiment_delete(experiment=experiment, actor=alice)
    with django_capture_on_commit_callbacks(execute=True):
        dataset_delete(dataset=dataset, actor=alice)
    assert not DatasetTokens.objects.exists() and not tokens.path.exists()
    assert settings.HYDRA.models_root.joinpath(checkpoint.path).is_dir()  # the model itself is not the dataset's
