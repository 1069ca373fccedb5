"""Checkpoints are checked and imported by a real web worker, off the request: the page shows the work's
progress, then the checkpoint ready with its figures or failed with why, and a failed import leaves nothing
under the models root."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.catalog.checkpoints import catalog_manager
from webapp.catalog.models import Checkpoint


def _settled(name: str) -> bool:
    return Checkpoint.objects.get(name=name).status != Checkpoint.Status.IMPORTING


def test_the_web_worker_fails_a_directory_without_a_checkpoint_and_the_page_says_why(alice, models_root,
                                                                                   web_worker):
    (models_root / "notes").mkdir()
    (models_root / "notes" / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    client = Client()
    client.force_login(catalog_manager(alice))
    response = client.post(reverse("catalog_register"), {"name": "Notes", "path": "notes"})
    assert response.status_code == 302
    web_worker.wait(lambda: _settled("Notes"), 60, "the checkpoint's checks")
    page = client.get(response["Location"]).content.decode()
    assert 'data-status="failed"' in page and "bert" in page.lower()
    assert sorted(p.name for p in (models_root / "notes").iterdir()) == ["config.json"]


def test_a_file_that_is_not_gguf_fails_its_import_and_leaves_nothing(alice, models_root, web_worker):
    (models_root / "fake.gguf").write_bytes(b"not a model at all\n" * 10)
    client = Client()
    client.force_login(catalog_manager(alice))
    response = client.post(reverse("catalog_import_gguf"), {"gguf_file": "fake.gguf"})
    assert response.status_code == 302
    checkpoint = Checkpoint.objects.get()
    assert (checkpoint.name, checkpoint.path, checkpoint.source) == ("fake", "fake", Checkpoint.Source.GGUF)
    web_worker.wait(lambda: _settled("fake"), 120, "the GGUF import")
    page = client.get(response["Location"]).content.decode()
    assert 'data-status="failed"' in page and "not a GGUF file" in page
    assert [p.name for p in models_root.iterdir()] == ["fake.gguf"]


@pytest.mark.processes
def test_smollm2_is_imported_by_the_web_worker_and_listed_with_its_figures(alice, models_root, web_worker):
    client = Client()
    client.force_login(catalog_manager(alice))
    response = client.post(reverse("catalog_add_smollm2"))
    assert response.status_code == 302
    seen = set()

    def settled() -> bool:
        checkpoint = Checkpoint.objects.get()
        seen.add(checkpoint.progress)
        return checkpoint.status != Checkpoint.Status.IMPORTING

    web_worker.wait(settled, 300, "the SmolLM2 import")
    checkpoint = Checkpoint.objects.get()
    assert checkpoint.status == Checkpoint.Status.READY, checkpoint.message
    assert (checkpoint.family, checkpoint.n_params, checkpoint.vocab_size, checkpoint.context_length) == (
        "llama", 134_515_008, 49152, 8192)
    assert any("SmolLM2-135M-Instruct" in text for text in seen), seen  # the page showed what it was doing
    page = client.get(reverse("catalog_list")).content.decode()
    assert "134.5M" in page and "49152" in page and "8192" in page
    assert (models_root / "smollm2-135m-instruct" / "config.json").is_file()
    again = client.post(reverse("catalog_add_smollm2"))
    assert again.status_code == 400 and "is in the catalog" in again.content.decode()
