"""Uploads of hostile or odd files through the dataset page: a file nested 100,000 deep, a 200,000-character CSV
header, a 2 MB row, NUL characters and a Parquet file that decodes to far more than it weighs each get a clear
answer under their field or a bad row with its line, never a 500, and never text with a NUL in the database or
the tokenizer's training."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.conf import settings
from django.urls import reverse
from django.utils.html import escape

from tests.webapp.datasets.factories import upload, upload_and_build
from webapp.datasets.models import Dataset
from webapp.datasets.services import dataset_tokenize

pytestmark = pytest.mark.django_db

DEEP = "[" * 100_000 + "]" * 100_000
TOO_DEEP = "the row nests deeper than 100 levels"


def chat(user: str, assistant: str = "Fine.") -> dict[str, object]:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]}


def jsonl(*rows: object) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def refused(response, field: str = "file") -> str:
    assert response.status_code == 400, response.status_code
    errors = response.context["form"].errors
    assert field in errors, errors
    return " ".join(errors[field])


def assert_nothing_stored(data_dir: Path) -> None:
    assert not Dataset.objects.exists()
    assert not (data_dir / "datasets").exists() or not any((data_dir / "datasets").iterdir())


@pytest.mark.parametrize(("name", "content"), [
    ("deep.jsonl", ('{"text": ' + DEEP + "}\n").encode()),
    ("deep.json", ("[" + DEEP + "]").encode()),
    ("deep.ndjson", (DEEP + "\n").encode()),
])
def test_a_file_nested_100000_deep_is_a_400_under_the_file(alice_client, data_dir, name, content):
    message = refused(upload(alice_client, name, content))
    assert message == (f"{name}: no row is a JSON object in the file; line 1: {TOO_DEEP}. JSONL has one object a "
                       "line, a JSON file an array of objects")
    assert_nothing_stored(data_dir)


@pytest.mark.parametrize("name", ["deep.jsonl", "deep.json"])
def test_one_deeply_nested_row_is_one_bad_row_of_a_good_dataset(alice_client, name):
    rows = [json.dumps(chat(f"Question {k}?")) for k in range(8)]
    rows[3] = json.dumps(chat("Deep?")).replace('"Fine."', '"Fine.", "tree": ' + DEEP)
    content = ("\n".join(rows) + "\n" if name.endswith(".jsonl") else "[" + ",\n".join(rows) + "]").encode()

    dataset = upload_and_build(alice_client, name, content)

    assert dataset.status == Dataset.Status.READY, dataset.message
    assert (dataset.n_rows, dataset.n_examples, dataset.n_bad_rows) == (8, 7, 1)
    assert json.loads(dataset.bad_rows_path.read_text()) == [[4, TOO_DEEP]]


def test_a_csv_header_field_of_200000_characters_is_a_short_400(alice_client, data_dir):
    response = upload(alice_client, "wide.csv", b"prompt," + b"x" * 200_000 + b"\na,b\n")
    message = refused(response)
    assert message.startswith(f"wide.csv: no known columns: found 'prompt', '{'x' * 60}… (200,000 characters)'")
    assert len(response.content) < 50_000
    assert_nothing_stored(data_dir)


@pytest.mark.parametrize("line", [1, 6])
def test_a_2_mb_row_is_one_bad_row_wherever_it_stands_and_the_page_stays_small(alice_client, settings, line):
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 0  # the upload is read from its temporary file, as large ones are
    rows = [chat(f"Question {k}?") for k in range(10)]
    rows.insert(line - 1, chat("Long?", "y" * (2 << 20)))
    content = jsonl(*rows)

    dataset = upload_and_build(alice_client, "long.jsonl", content)

    assert dataset.status == Dataset.Status.READY, dataset.message
    size = len(json.dumps(chat("Long?", "y" * (2 << 20)))) + 1
    assert json.loads(dataset.bad_rows_path.read_text()) == [
        [line, f"the row takes {size:,} bytes; a row may take at most 1,048,576 bytes (1 MiB)"]]
    page = alice_client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert len(page) < 100_000


def test_a_long_row_under_the_limit_is_cut_in_the_preview(alice_client):
    rows = [chat("Long?", "z" * 500_000), *[chat(f"Question {k}?") for k in range(9)]]
    dataset = upload_and_build(alice_client, "long.jsonl", jsonl(*rows), val_fraction=0.1)
    assert dataset.status == Dataset.Status.READY and dataset.n_bad_rows == 0
    page = alice_client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert len(page) < 60_000
    assert "more characters not shown</span>" in page


@pytest.mark.parametrize(("name", "content", "line", "reason"), [
    ("chat.jsonl", jsonl(chat("Hi"), chat("Hi\u0000there"), chat("Bye")), 2,
     "a NUL character in content of message 1 (at character 3)"),
    ("chat.json", json.dumps([chat("Hi"), chat("Bye"), chat("x", "\u0000")]).encode(), 3,
     "a NUL character in content of message 2 (at character 1)"),
    ("pairs.csv", b"question,answer\nHi,there\nHi,\x00there\nBye,now\n", 3,
     "a NUL character in 'answer' (at character 1)"),
    ("alpaca.jsonl", jsonl({"instruction": "Do", "output": "ok"}, {"instruction": "Do", "input": "a\u0000",
                                                                    "output": "ok"}, {"instruction": "Do",
                                                                                      "output": "fine"}), 2,
     "a NUL character in 'input' (at character 2)"),
    ("text.jsonl", jsonl({"text": "one"}, {"text": "tw\u0000o"}, {"text": "three"}), 2,
     "a NUL character in 'text' (at character 3)"),
])
def test_a_row_with_a_nul_character_is_a_bad_row_with_its_line(alice_client, name, content, line, reason):
    dataset = upload_and_build(alice_client, name, content, val_fraction=0.34)
    assert dataset.status == Dataset.Status.READY, dataset.message
    assert json.loads(dataset.bad_rows_path.read_text()) == [[line, reason]]
    assert "\\u0000" not in dataset.records_path.read_text() and "\x00" not in dataset.records_path.read_text()


def test_a_parquet_row_with_a_nul_character_is_a_bad_row(alice_client):
    out = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["a", "b\x00", "c"], "completion": ["x", "y", "z"]}), out)
    dataset = upload_and_build(alice_client, "pairs.parquet", out.getvalue(), val_fraction=0.34)
    assert json.loads(dataset.bad_rows_path.read_text()) == [[2, "a NUL character in 'prompt' (at character 2)"]]


def test_a_text_corpus_with_a_nul_character_is_refused_whole_from_an_upload_or_the_import_folder(alice_client,
                                                                                                 data_dir):
    text = b"Plain text.\n" * 20 + b"with a \x00 in it\n"
    assert refused(upload(alice_client, "notes.txt", text)) == (
        "The file looks binary (it contains NUL bytes); upload plain UTF-8 text.")
    folder = Path(settings.HYDRA.import_dir)
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_bytes(text)
    (folder / "chat.jsonl").write_bytes(jsonl(chat("Hi"), chat("Hi\u0000"), chat("Bye")))
    response = alice_client.post(reverse("dataset_list"), {"source": "import", "server_path": "notes.txt",
                                                           "vocab_size": 300, "val_fraction": 0.25})
    assert refused(response, "server_path").startswith("The file looks binary")
    assert_nothing_stored(data_dir)

    response = alice_client.post(reverse("dataset_list"), {"source": "import", "server_path": "chat.jsonl",
                                                           "vocab_size": 300, "val_fraction": 0.34})
    assert response.status_code == 302
    dataset_tokenize(dataset_id=Dataset.objects.get().pk)
    assert json.loads(Dataset.objects.get().bad_rows_path.read_text()) == [
        [2, "a NUL character in content of message 1 (at character 3)"]]


def test_a_parquet_file_that_decodes_past_the_bound_is_a_400_before_anything_is_stored(alice_client, data_dir,
                                                                                      settings):
    settings.HYDRA = dataclasses.replace(settings.HYDRA, max_decoded_bytes=256 << 20)
    out = io.BytesIO()
    schema = pa.schema([("text", pa.string())])
    with pq.ParquetWriter(out, schema, compression="zstd") as writer:
        for _ in range(16):  # 16 row groups of one 24 MiB string each: 384 MiB in under 16 KiB
            writer.write_table(pa.table({"text": ["x" * (24 << 20)]}, schema=schema))
    assert len(out.getvalue()) < 16 << 10

    message = refused(upload(alice_client, "bomb.parquet", out.getvalue()))

    assert message == (f"bomb.parquet: its columns 'text' decode to {16 * ((24 << 20) + 52):,} bytes (the file's "
                       "metadata says), over the limit of 268,435,456 bytes for one file (HYDRA_MAX_DECODED_MB); "
                       "split the file")
    assert_nothing_stored(data_dir)


@pytest.mark.parametrize(("source", "label"), [("sample", "Built-in sample corpus"),
                                               ("sample_chat", "Built-in sample chat data")])
def test_a_file_chosen_under_a_sample_choice_is_an_error_not_ignored(alice_client, data_dir, source, label):
    response = upload(alice_client, "chat.jsonl", jsonl(chat("Hi"), chat("Bye")), source=source)
    assert refused(response, "source") == (
        f"You chose the file 'chat.jsonl', but the Data choice is '{label}'. Choose 'Uploaded file' to use the "
        f"file, or remove it to use the {label.lower()}.")
    assert_nothing_stored(data_dir)
    assert escape("You chose the file 'chat.jsonl'") in response.content.decode()


def test_a_path_given_under_another_choice_is_an_error(alice_client, data_dir):
    response = alice_client.post(reverse("dataset_list"), {"source": "sample", "server_path": "chat.jsonl",
                                                           "vocab_size": 300, "val_fraction": 0.25})
    assert refused(response, "source").startswith("You gave a path in the import folder, but the Data choice is "
                                                  "'Built-in sample corpus'.")
    assert_nothing_stored(data_dir)
