"""A checkpoint registered and checked, then swapped for a symbolic link out of the models root (the directory,
or one file of it), is refused at every later use, through the real pages: the catalog sizes it nowhere and
says why, the experiment form refuses it, and launching an experiment made from it fails its trials with the
reason, never reading what the link leads to.

The swapped-in link leads to an identical copy, so that only the check, not a broken file, can refuse it.
"""

from __future__ import annotations

import dataclasses
import html
import shutil
import uuid
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.catalog.checkpoints import tiny_llama
from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.test_forms import post_data
from webapp.catalog.models import Checkpoint
from webapp.catalog.work import checkpoint_import
from webapp.ground.models import Experiment

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def lonely_host(settings) -> None:
    """A host id no device worker serves, so that the page's device list is this test's alone."""
    settings.HYDRA = dataclasses.replace(settings.HYDRA, worker=dataclasses.replace(
        settings.HYDRA.worker, host_id=f"test-catalog-{uuid.uuid4().hex[:8]}"))


@pytest.fixture
def checkpoint(models_root: Path) -> Checkpoint:
    """A ready checkpoint, checked by the web worker's task as registering it would have it checked."""
    tiny_llama(models_root / "tiny")
    row = Checkpoint.objects.create(name="Tiny", path="tiny", status=Checkpoint.Status.IMPORTING)
    checkpoint_import(checkpoint_id=row.pk)
    row.refresh_from_db()
    assert row.status == Checkpoint.Status.READY, row.message
    return row


def swap_directory(models_root: Path, outside: Path) -> None:
    """Move the checkpoint's directory out of the root and put a link to it in its place."""
    shutil.move(models_root / "tiny", outside / "tiny")
    (models_root / "tiny").symlink_to(outside / "tiny")


def swap_file(models_root: Path, outside: Path, name: str) -> None:
    """Move one file of the checkpoint out of the root and put a link to it in its place."""
    outside.mkdir(exist_ok=True)
    shutil.move(models_root / "tiny" / name, outside / name)
    (models_root / "tiny" / name).symlink_to(outside / name)


def test_the_catalog_sizes_a_swapped_directory_nowhere_and_says_why(alice_client: Client, checkpoint, models_root,
                                                                     tmp_path):
    listed = alice_client.get(reverse("catalog_list")).content.decode()
    assert 'data-verdict="unavailable"' not in listed
    outside = tmp_path / "outside"
    outside.mkdir()
    swap_directory(models_root, outside)
    listed = alice_client.get(reverse("catalog_list")).content.decode()
    assert listed.count('data-verdict="unavailable"') == 2  # AdamW's and SGD's
    detail = alice_client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).content.decode()
    assert html.escape("'tiny' leads outside the models root") in detail


def test_the_catalog_sizes_a_checkpoint_with_a_swapped_file_nowhere(alice_client: Client, checkpoint, models_root,
                                                                   tmp_path):
    swap_file(models_root, tmp_path / "outside", "config.json")
    detail = alice_client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).content.decode()
    assert detail.count('data-verdict="unavailable"') == 2
    assert "config.json leads out of the checkpoint directory" in detail


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_the_experiment_form_refuses_a_checkpoint_with_a_swapped_file(alice_client: Client, alice_team, checkpoint,
                                                                     models_root, tmp_path, name):
    dataset = make_dataset(alice_team, name="corpus")
    data = post_data(dataset, action="preview", model_kind="checkpoint", checkpoint=checkpoint.pk)
    assert alice_client.post(reverse("experiment_create"), data).status_code == 200
    swap_file(models_root, tmp_path / "outside", name)
    response = alice_client.post(reverse("experiment_create"), data)
    assert response.status_code == 400
    assert html.escape(f"tiny/{name} leads out of the model's directory (a symbolic link)") in (
        response.content.decode())


def test_launching_an_experiment_whose_checkpoint_was_swapped_fails_its_trials(alice_client: Client, alice_team,
                                                                             checkpoint, models_root, tmp_path):
    dataset = make_dataset(alice_team, name="corpus")
    data = post_data(dataset, action="create", model_kind="checkpoint", checkpoint=checkpoint.pk)
    assert alice_client.post(reverse("experiment_create"), data).status_code == 302
    experiment = Experiment.objects.get()
    swap_file(models_root, tmp_path / "outside", "config.json")
    alice_client.post(reverse("experiment_action", args=[experiment.pk, "launch"]))
    trials = list(experiment.trials.all())
    assert trials and {t.status for t in trials} == {"failed"}
    assert all(t.spec is None and "tiny/config.json leads out of the model's directory" in t.message
               for t in trials)
