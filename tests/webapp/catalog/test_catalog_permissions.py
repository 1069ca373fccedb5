"""Who changes the catalog: staff and catalog managers add to it (each addition runs a check, an import or a
``pip install`` in the web worker) and remove what they added; every other member reads it, and is answered
403 with who may and how an administrator grants it, before anything is stored or sent."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from tests.webapp.catalog.checkpoints import catalog_manager
from webapp.catalog.models import Checkpoint

ADD_FORMS = ('id="register-form"', 'id="gguf-form"', 'id="smollm2-form"')


@pytest.fixture
def addable(models_root: Path) -> Path:
    """A directory and a ``.gguf`` file under the models root: what a manager's requests would queue."""
    (models_root / "tiny").mkdir()
    (models_root / "fake.gguf").write_bytes(b"not a model at all\n")
    return models_root


@pytest.mark.django_db
@pytest.mark.parametrize("url, data", [
    ("catalog_register", {"name": "Tiny", "path": "tiny"}),
    ("catalog_import_gguf", {"gguf_file": "fake.gguf"}),
    ("catalog_add_smollm2", {}),
])
def test_it_refuses_a_plain_member_and_stores_and_sends_nothing(bob_client: Client, addable, url, data,
                                                                django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as sends:
        response = bob_client.post(reverse(url), data)
    assert response.status_code == 403
    page = response.content.decode()
    assert "Only staff and catalog managers may add to the model catalog" in page
    assert "Can add to and remove from the model catalog" in page and "/admin/" in page
    assert not Checkpoint.objects.exists() and sends == []
    assert sorted(p.name for p in addable.iterdir()) == ["fake.gguf", "tiny"]


@pytest.mark.django_db
def test_a_plain_member_browses_the_catalog_without_its_forms(alice, bob_client: Client, models_root):
    checkpoint = Checkpoint.objects.create(name="Tiny", path="tiny", status=Checkpoint.Status.FAILED,
                                           created_by=alice)
    page = bob_client.get(reverse("catalog_list")).content.decode()
    assert "Tiny" in page and 'id="catalog-managers-only"' in page
    assert not [form for form in ADD_FORMS if form in page]
    detail = bob_client.get(reverse("checkpoint_detail", args=[checkpoint.pk]))
    assert detail.status_code == 200 and "Tiny" in detail.content.decode()
    # Alice added it before she lost the permission: she reads it like anyone, and no longer removes it.
    alice_client = Client()
    alice_client.force_login(alice)
    detail = alice_client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).content.decode()
    assert reverse("checkpoint_remove", args=[checkpoint.pk]) not in detail
    assert alice_client.get(reverse("checkpoint_remove", args=[checkpoint.pk])).status_code == 403
    refused = alice_client.post(reverse("checkpoint_remove", args=[checkpoint.pk]))
    assert refused.status_code == 403 and "the catalog manager who added it" in refused.content.decode()
    assert Checkpoint.objects.filter(pk=checkpoint.pk).exists()
    catalog_manager(alice)  # granted again: what she added is hers to remove once more
    assert alice_client.post(reverse("checkpoint_remove", args=[checkpoint.pk])).status_code == 302
    assert not Checkpoint.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["catalog manager", "staff", "superuser"])
def test_a_member_made_catalog_manager_or_staff_gets_the_forms_and_registers(bob, bob_client: Client, models_root,
                                                                             role):
    (models_root / "tiny").mkdir()
    assert bob_client.post(reverse("catalog_register"), {"name": "Tiny", "path": "tiny"}).status_code == 403
    if role == "catalog manager":
        catalog_manager(bob)
    else:
        bob.is_staff, bob.is_superuser = role == "staff", role == "superuser"
        bob.save(update_fields=["is_staff", "is_superuser"])
    page = bob_client.get(reverse("catalog_list")).content.decode()
    assert all(form in page for form in ADD_FORMS) and 'id="catalog-managers-only"' not in page
    response = bob_client.post(reverse("catalog_register"), {"name": "Tiny", "path": "tiny"})
    assert response.status_code == 302
    checkpoint = Checkpoint.objects.get()
    assert (checkpoint.name, checkpoint.status, checkpoint.created_by) == ("Tiny", Checkpoint.Status.IMPORTING, bob)


def test_the_demo_user_that_make_run_creates_manages_the_catalog(db, settings, tmp_path: Path) -> None:
    settings.HYDRA = dataclasses.replace(settings.HYDRA, data_dir=tmp_path)
    call_command("hydra_demo", stdout=io.StringIO())
    demo = get_user_model().objects.get(username="demo")
    assert demo.has_perm("catalog.manage_catalog")
    client = Client()
    client.force_login(demo)
    assert b'name="path"' in client.get(reverse("catalog_list")).content
