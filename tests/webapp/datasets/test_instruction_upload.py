"""Instruction and chat data through the dataset page's form: the kind detected or confirmed from a file's first
rows, files of no known kind refused before anything is stored, and files in the server's import folder taken
only from inside it."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.conf import settings
from django.urls import reverse
from django.utils.html import escape

from tests.webapp.datasets.factories import upload, upload_and_build
from webapp.datasets.models import Dataset

pytestmark = pytest.mark.django_db

CHAT = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}


def jsonl(*rows: object) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def form_errors(response) -> str:
    assert response.status_code == 400
    return response.content.decode()


def assert_nothing_stored(data_dir: Path) -> None:
    assert not Dataset.objects.exists()
    assert not (data_dir / "datasets").exists() or not any((data_dir / "datasets").iterdir())


@pytest.mark.parametrize(("name", "content", "kind"), [
    ("chat.jsonl", jsonl(CHAT, CHAT), "messages"),
    ("chat.ndjson", jsonl({"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}),
     "messages"),
    ("alpaca.json", json.dumps([{"instruction": "a", "input": "", "output": "b"}]).encode(), "alpaca"),
    ("lines.json", b'"a stray string first"\n' + jsonl({"prompt": "a", "completion": "b"}), "prompt_completion"),
    ("prompts.csv", b"\xef\xbb\xbfprompt, completion\na,b\n", "prompt_completion"),
    ("stories.jsonl", jsonl({"text": "Once."}), "text"),
])
def test_it_detects_the_kind_from_the_first_rows(alice_client, name, content, kind):
    response = upload(alice_client, name, content)
    assert response.status_code == 302, response.content.decode()
    dataset = Dataset.objects.get()
    assert (dataset.kind, dataset.name, dataset.filename, dataset.status) == (kind, name, name, "tokenizing")
    assert dataset.source_path.read_bytes() == content  # the file as uploaded, byte-order mark and all


def test_it_detects_the_kind_of_a_parquet_file_from_its_schema(alice_client):
    out = io.BytesIO()
    pq.write_table(pa.table({"instruction": ["a"], "output": ["b"], "extra": [1]}), out)
    response = upload(alice_client, "alpaca.parquet", out.getvalue())
    assert response.status_code == 302
    assert Dataset.objects.get().kind == "alpaca"


def test_a_confirmed_kind_is_kept_when_the_columns_allow_both(alice_client):
    both = jsonl({"text": "plain", **CHAT})
    upload(alice_client, "both.jsonl", both, name="detected")
    upload(alice_client, "both.jsonl", both, name="confirmed", kind="text")
    assert dict(Dataset.objects.values_list("name", "kind")) == {"detected": "messages", "confirmed": "text"}
    fingerprints = set(Dataset.objects.values_list("fingerprint", flat=True))
    assert len(fingerprints) == 2  # the same file read as two kinds gives results that do not compare


@pytest.mark.parametrize(("name", "content", "fields", "message"), [
    ("odd.jsonl", jsonl({"title": "a", "body": "b"}),
     {}, "odd.jsonl: no known columns: found 'title', 'body'; accepted: preference: chosen/chosen_response"),
    ("chat.jsonl", jsonl(CHAT), {"kind": "alpaca"},
     "chat.jsonl: kind 'alpaca' needs instruction + output/response/answer (optional: input/context); found "
     "'messages'"),
    ("odd.csv", b"title,body\na,b\n", {}, "odd.csv: no known columns: found 'title', 'body'"),
    ("empty.jsonl", b"\n \n", {}, "empty.jsonl: the file is empty"),
    ("broken.jsonl", b"{not json\n[1]\n", {}, "broken.jsonl: no row is a JSON object in the file; line 1: not valid "
     "JSON"),
    ("numbers.jsonl", b"1\n" * 5_000 + jsonl(CHAT), {}, "numbers.jsonl: no row is a JSON object among the first 1,000 "
     "rows; line 1: row is an int, not an object"),
    ("broken.parquet", b"PAR1 not really", {}, "broken.parquet: not a readable Parquet file"),
    ("notes.txt", b"Plain text.\n", {"kind": "messages"}, "notes.txt is a text corpus: a kind applies to"),
    ("notes.txt", b"Plain text.\n", {"columns": "text=body"}, "notes.txt is a text corpus: columns apply to"),
])
def test_it_refuses_a_file_of_no_usable_kind_in_the_form_and_stores_nothing(alice_client, data_dir, name, content,
                                                                             fields, message):
    page = form_errors(upload(alice_client, name, content, **fields))
    assert escape(message) in page
    assert_nothing_stored(data_dir)


def test_a_text_file_is_a_corpus_as_before(alice_client):
    response = upload(alice_client, "notes.txt", b"Plain text.\n" * 50)
    assert response.status_code == 302
    dataset = Dataset.objects.get()
    assert (dataset.kind, dataset.is_instruction) == ("corpus", False) and dataset.corpus_path.exists()


def imports() -> Path:
    folder = Path(settings.HYDRA.import_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def post_import(client, server_path: str, **fields: object):
    return client.post(reverse("dataset_list"), {"source": "import", "server_path": server_path, "vocab_size": 300,
                                                 "val_fraction": 0.25, "kind": "", **fields})


def test_it_copies_a_file_from_the_import_folder_and_builds_it(alice_client):
    content = jsonl(*[CHAT] * 8)
    (imports() / "team" / "chats").mkdir(parents=True)
    (imports() / "team" / "chats" / "big.jsonl").write_bytes(content)

    response = post_import(alice_client, "team/chats/big.jsonl")

    assert response.status_code == 302, response.content.decode()
    dataset = Dataset.objects.get()
    assert (dataset.source, dataset.filename, dataset.name, dataset.kind) == (
        "import", "team/chats/big.jsonl", "big.jsonl", "messages")
    assert dataset.source_path.read_bytes() == content and dataset.n_bytes == len(content)
    assert (imports() / "team" / "chats" / "big.jsonl").exists()  # copied, not moved
    page = alice_client.get(response["Location"]).content.decode()
    assert "File in the server&#x27;s import folder (team/chats/big.jsonl)" in page


def test_it_takes_a_text_corpus_from_the_import_folder(alice_client):
    (imports() / "corpus.txt").write_text("Plain text.\n" * 50)
    assert post_import(alice_client, "corpus.txt").status_code == 302
    dataset = Dataset.objects.get()
    assert dataset.kind == "corpus" and dataset.corpus_path.read_text() == "Plain text.\n" * 50


@pytest.mark.parametrize(("server_path", "message"), [
    ("", "Give the file&#x27;s path relative to the import folder."),
    ("/etc/passwd.jsonl", "is an absolute path; give a path relative to the import folder"),
    ("../outside.jsonl", "contains &#x27;..&#x27;; give a path inside the import folder"),
    ("sub/../../outside.jsonl", "contains &#x27;..&#x27;"),
    ("link.jsonl", "is or passes through a symbolic link, which could lead outside the import folder"),
    ("linked/outside.jsonl", "is or passes through a symbolic link, which could lead outside the import folder"),
    ("missing.jsonl", "There is no file &#x27;missing.jsonl&#x27; in the import folder"),
    ("data.xlsx", "&#x27;data.xlsx&#x27; is not a .jsonl, .ndjson, .json, .csv, .parquet, .txt file."),
])
def test_it_refuses_a_server_path_outside_the_import_folder(alice_client, data_dir, server_path, message):
    outside = data_dir / "outside.jsonl"
    outside.write_bytes(jsonl(CHAT, CHAT))
    (imports() / "data.xlsx").write_bytes(b"PK")
    os.symlink(outside, imports() / "link.jsonl")
    os.symlink(data_dir, imports() / "linked")

    page = form_errors(post_import(alice_client, server_path))

    assert message in page
    assert_nothing_stored(data_dir)


def test_an_instruction_file_from_the_import_folder_is_checked_like_an_upload(alice_client, data_dir):
    (imports() / "odd.jsonl").write_bytes(jsonl({"title": "a"}))
    page = form_errors(post_import(alice_client, "odd.jsonl"))
    assert "odd.jsonl: no known columns: found &#x27;title&#x27;" in page
    assert_nothing_stored(data_dir)


def test_the_sample_chat_choice_needs_no_file(alice_client):
    response = alice_client.post(reverse("dataset_list"), {"source": "sample_chat", "vocab_size": 300,
                                                           "val_fraction": 0.1, "kind": ""})
    assert response.status_code == 302
    dataset = Dataset.objects.get()
    assert (dataset.source, dataset.kind, dataset.source_path.name) == ("sample_chat", "messages", "source.jsonl")
    assert dataset.name == "Chat arithmetic and facts (built-in sample)"


def test_the_form_offers_the_kinds_and_the_import_folder(alice_client):
    page = alice_client.get(reverse("dataset_list")).content.decode()
    for text in ('value="sample_chat"', 'value="import"', 'name="server_path"', '<option value="" selected>Detect '
                 "from the columns</option>", '<option value="prompt_completion">'):
        assert text in page


def test_an_uploaded_instruction_dataset_lists_its_examples(alice_client):
    dataset = upload_and_build(alice_client, "chat.jsonl", jsonl(*[CHAT] * 4))
    page = alice_client.get(reverse("dataset_list")).content.decode()
    assert f"{dataset.n_tokens} <span class=\"muted\">(4 examples)</span>" in page
