"""The import folder: a path is opened once, a folder at a time, never through a link, and what was checked is
what is copied; no message says where the folder is on the server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse

from webapp.datasets.forms import DatasetForm
from webapp.datasets.models import Dataset
from webapp.datasets.services import dataset_create

pytestmark = pytest.mark.django_db
CHAT = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}


def jsonl(*rows: object) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def imports() -> Path:
    folder = Path(settings.HYDRA.import_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def form_errors(response) -> str:
    assert response.status_code == 400
    return response.content.decode()


def assert_nothing_stored(data_dir: Path) -> None:
    assert not Dataset.objects.exists()
    assert not (data_dir / "datasets").exists() or not any((data_dir / "datasets").iterdir())


def post_import(client, server_path: str):
    return client.post(reverse("dataset_list"), {"source": "import", "server_path": server_path, "vocab_size": 300,
                                                 "val_fraction": 0.25, "kind": ""})


def test_the_file_checked_is_the_file_copied_even_if_a_link_is_swapped_in_between(alice, alice_team, data_dir):
    """Between the form's check and the copy, someone with access to the folder puts a link where the file was:
    the copy still reads the file that was opened and checked, never what the link leads to."""
    content = jsonl(CHAT, CHAT, CHAT)
    (imports() / "chats.jsonl").write_bytes(content)
    secret = data_dir / "secret.jsonl"
    secret.write_bytes(jsonl({"messages": [{"role": "user", "content": "the server's secret"},
                                           {"role": "assistant", "content": "s3cr3t"}]}))
    form = DatasetForm({"source": "import", "server_path": "chats.jsonl", "vocab_size": 300, "val_fraction": 0.25,
                        "kind": ""})
    assert form.is_valid(), form.errors

    os.replace(imports() / "chats.jsonl", data_dir / "moved.jsonl")
    os.symlink(secret, imports() / "chats.jsonl")
    data = form.cleaned_data
    dataset = dataset_create(team=alice_team, user=alice, name=data["name"], corpus=data["corpus"],
                             source=data["source"], vocab_size=data["vocab_size"], val_fraction=data["val_fraction"],
                             filename=data["filename"], kind=data["kind"])

    assert dataset.source_path.read_bytes() == content
    assert data["corpus"].closed  # the copy closed the one file it read


def test_a_link_is_refused_even_when_it_stays_inside_the_folder(alice_client, data_dir):
    (imports() / "real.jsonl").write_bytes(jsonl(CHAT, CHAT))
    os.symlink(imports() / "real.jsonl", imports() / "alias.jsonl")
    (imports() / "team").mkdir()
    os.symlink(imports() / "team", imports() / "shortcut")
    (imports() / "team" / "chats.jsonl").write_bytes(jsonl(CHAT, CHAT))
    for path in ("alias.jsonl", "shortcut/chats.jsonl"):
        assert "is or passes through a symbolic link" in form_errors(post_import(alice_client, path))
    assert_nothing_stored(data_dir)
    assert post_import(alice_client, "./team/chats.jsonl").status_code == 302
    assert Dataset.objects.get().filename == "team/chats.jsonl"


@pytest.mark.parametrize("server_path", ["", "/etc/passwd.jsonl", "../outside.jsonl", "link.jsonl", "missing.jsonl",
                                         "folder.jsonl", "fifo.jsonl", "data.xlsx", "file.jsonl/inner.jsonl"])
def test_no_refusal_says_where_the_folder_is_on_the_server(alice_client, data_dir, server_path):
    (data_dir / "outside.jsonl").write_bytes(jsonl(CHAT, CHAT))
    os.symlink(data_dir / "outside.jsonl", imports() / "link.jsonl")
    (imports() / "folder.jsonl").mkdir()
    os.mkfifo(imports() / "fifo.jsonl")  # opening it to read would wait for a writer for ever
    (imports() / "file.jsonl").write_bytes(jsonl(CHAT))
    (imports() / "data.xlsx").write_bytes(b"PK")

    page = form_errors(post_import(alice_client, server_path))

    assert "the import folder" in page or "is not a" in page
    for where in {str(Path(settings.HYDRA.import_dir)), str(Path(settings.HYDRA.import_dir).resolve()),
                  str(data_dir)}:
        assert where not in page
    assert_nothing_stored(data_dir)
