"""The catalog page: anyone signed in sees every checkpoint with its figures; paths stay in the models root.

A registered directory is checked by the web worker's task (run here in-process, or by a real web worker),
and its parameters, context, vocabulary and training-state sizes show on the page; a path that leaves the
models root is refused before anything is stored; a directory that fails its checks is shown failed with the
reason and can be removed.
"""

from __future__ import annotations

import dataclasses
import html
import uuid
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.catalog.checkpoints import catalog_manager, tiny_llama
from tests.webapp.web_worker import CLOSED_PORT_URL, redis_at
from webapp.catalog.models import Checkpoint
from webapp.catalog.selectors import ready_checkpoints
from webapp.catalog.work import checkpoint_import


@pytest.fixture(autouse=True)
def lonely_host(settings) -> None:
    """A host id no device worker serves, so that the page's device list is this test's alone."""
    settings.HYDRA = dataclasses.replace(settings.HYDRA, worker=dataclasses.replace(
        settings.HYDRA.worker, host_id=f"test-catalog-{uuid.uuid4().hex[:8]}"))


@pytest.fixture(autouse=True)
def alice_manages_the_catalog(alice) -> None:
    """Alice adds to the catalog in these tests; Bob is a plain member."""
    catalog_manager(alice)


@pytest.mark.django_db
def test_anonymous_users_get_the_login_page(client: Client, models_root: Path) -> None:
    checkpoint = Checkpoint.objects.create(name="x", path="x", status=Checkpoint.Status.FAILED)
    for url in (reverse("catalog_list"), reverse("checkpoint_detail", args=[checkpoint.pk]),
                reverse("checkpoint_remove", args=[checkpoint.pk])):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login")), url
    response = client.post(reverse("catalog_register"), {"name": "y", "path": "y"})
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    response = client.post(reverse("catalog_add_smollm2"))
    assert response.status_code == 302 and Checkpoint.objects.count() == 1


@pytest.mark.django_db
def test_the_page_lists_a_registered_checkpoint_with_its_figures(alice_client, bob_client, models_root):
    tiny_llama(models_root / "team-a" / "tiny")
    response = alice_client.post(reverse("catalog_register"), {"name": "Tiny Llama", "path": "team-a/tiny/"})
    assert response.status_code == 302
    checkpoint = Checkpoint.objects.get()
    assert (checkpoint.status, checkpoint.path) == (Checkpoint.Status.IMPORTING, "team-a/tiny")
    checkpoint_import(checkpoint_id=checkpoint.pk)  # what the web worker runs
    checkpoint.refresh_from_db()
    assert checkpoint.status == Checkpoint.Status.READY, checkpoint.message
    from transformers import AutoModelForCausalLM

    n_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(models_root / "team-a/tiny").parameters())
    assert (checkpoint.family, checkpoint.n_params, checkpoint.context_length, checkpoint.vocab_size) == (
        "llama", n_params, 64, 320)
    assert len(checkpoint.tokenizer_sha256) == 64
    assert checkpoint.largest_layer_params == 16 + 320 * 16  # the head: its norm and the tied embedding it uses
    # The catalog is lab-wide: another team's user sees it, with AdamW's 16 and SGD's 12 bytes per parameter.
    page = bob_client.get(reverse("catalog_list")).content.decode()
    assert "Tiny Llama" in page and f"{n_params / 1000:.1f}K" in page
    assert f"{16 * n_params / 1024:.1f}\xa0KB" in page and f"{12 * n_params / 1024:.1f}\xa0KB" in page
    assert "No device worker of this host answered" in page
    detail = bob_client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).content.decode()
    assert 'id="checkpoint-context">64<' in detail and 'id="checkpoint-vocab">320<' in detail


@pytest.mark.django_db
@pytest.mark.parametrize("path, reason", [
    ("../outside", "contains '..'"),
    ("/etc", "is an absolute path"),
    ("link-out", "leads outside the models root"),
    ("missing", "There is no directory 'missing'"),
])
def test_paths_out_of_the_models_root_are_refused(alice_client, models_root, tmp_path, path, reason):
    outside = tmp_path / "outside"
    tiny_llama(outside)
    (models_root / "link-out").symlink_to(outside)
    response = alice_client.post(reverse("catalog_register"), {"name": "escape", "path": path})
    assert response.status_code == 400
    assert html.escape(reason) in response.content.decode()
    response = alice_client.post(reverse("catalog_import_gguf"), {"gguf_file": f"{path}/model.gguf"})
    assert response.status_code == 400
    assert not Checkpoint.objects.exists()


@pytest.mark.django_db
def test_a_directory_that_fails_its_checks_shows_why_and_can_be_removed(alice_client, bob_client, models_root):
    (models_root / "empty").mkdir()
    alice_client.post(reverse("catalog_register"), {"name": "Empty", "path": "empty"})
    checkpoint = Checkpoint.objects.get()
    checkpoint_import(checkpoint_id=checkpoint.pk)
    page = alice_client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).content.decode()
    assert 'data-status="failed"' in page and "config.json" in page
    assert not ready_checkpoints().exists()
    # Only the catalog manager who added it (or staff) removes it; the directory stays.
    assert bob_client.post(reverse("checkpoint_remove", args=[checkpoint.pk])).status_code == 403
    response = alice_client.post(reverse("checkpoint_remove", args=[checkpoint.pk]))
    assert response.status_code == 302 and not Checkpoint.objects.exists()
    assert (models_root / "empty").is_dir()


@pytest.mark.django_db
def test_a_name_or_directory_already_in_the_catalog_is_refused(alice_client, models_root):
    (models_root / "a").mkdir()
    (models_root / "b").mkdir()
    alice_client.post(reverse("catalog_register"), {"name": "A", "path": "a"})
    again = alice_client.post(reverse("catalog_register"), {"name": "A2", "path": "./a"})
    assert again.status_code == 400 and "is in the catalog already, as &#x27;A&#x27;" in again.content.decode()
    same_name = alice_client.post(reverse("catalog_register"), {"name": "A", "path": "b"})
    assert same_name.status_code == 400 and "already has a checkpoint named" in same_name.content.decode()
    assert Checkpoint.objects.count() == 1


@pytest.mark.django_db
def test_a_registration_while_redis_is_down_is_kept_and_says_so(alice_client, models_root, settings,
                                                                django_capture_on_commit_callbacks):
    (models_root / "a").mkdir()
    with redis_at(settings, CLOSED_PORT_URL):
        with django_capture_on_commit_callbacks(execute=True):  # the send, once the request's work commits
            response = alice_client.post(reverse("catalog_register"), {"name": "A", "path": "a"})
        assert response.status_code == 302
        page = alice_client.get(response["Location"]).content.decode()
    checkpoint = Checkpoint.objects.get()
    assert checkpoint.status == Checkpoint.Status.IMPORTING and checkpoint.send_error
    assert 'id="unsent"' in page and 'http-equiv="refresh"' in page
