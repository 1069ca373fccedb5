"""Dataset uploads through the API: columns mapped to roles, as a JSON object or role=column pairs, kept with
the dataset; hostile files answered with a 400 under their field, never a 500."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

pytestmark = pytest.mark.django_db

PAIRS = "title,body,notes\n" + "".join(f"Q{k},A{k},n\n" for k in range(8))


def post(api, name: str, content: bytes, **fields: str):
    return api.upload("/datasets", {"source": "upload", "vocab_size": 300, "val_fraction": 0.25,
                                    "file": SimpleUploadedFile(name, content), **fields})


@pytest.mark.parametrize("columns", ['{"prompt": "title", "completion": "body"}', "prompt=title, completion=body"])
def test_columns_map_a_files_columns_to_roles_and_are_kept(alice_api, data_dir, columns):
    made = post(alice_api, "pairs.csv", PAIRS.encode(), columns=columns)
    assert made.status_code == 201, made.content
    assert (made.json()["kind"], made.json()["columns"]) == ("prompt_completion", {"prompt": "title",
                                                                                  "completion": "body"})
    assert alice_api.get(f"/datasets/{made.json()['id']}").json()["columns"] == made.json()["columns"]


def test_common_column_names_are_found_without_a_mapping(alice_api, data_dir):
    rows = "".join(json.dumps({"instruction": f"Do {k}", "context": "", "response": "Done"}) + "\n" for k in range(4))
    made = post(alice_api, "dolly.jsonl", rows.encode())
    assert made.status_code == 201, made.content
    assert (made.json()["kind"], made.json()["columns"]) == (
        "alpaca", {"instruction": "instruction", "input": "context", "output": "response"})


@pytest.mark.parametrize(("columns", "message"), [
    ("prompt=heading", "pairs.csv: no column 'heading' in the file; found 'title', 'body', 'notes'"),
    ("promt=title", "pairs.csv: no role 'promt'; the roles are prompt, chosen, rejected, messages, instruction, "
                    "input, output, completion, text"),
    ("prompt", "Columns: 'prompt' is not role=column, e.g. prompt=question."),
])
def test_columns_that_do_not_fit_are_a_400_under_columns(alice_api, data_dir, columns, message):
    refused = post(alice_api, "pairs.csv", PAIRS.encode(), columns=columns)
    assert refused.status_code == 400
    assert refused.json()["errors"]["columns"] == [message]


def test_a_file_nested_100000_deep_is_a_400_under_the_file(alice_api, data_dir):
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    refused = post(alice_api, "deep.json", b"[" + deep + b"]")
    assert refused.status_code == 400
    assert refused.json()["errors"]["file"] == [
        "deep.json: no row is a JSON object in the file; line 1: the row nests deeper than 100 levels. JSONL has "
        "one object a line, a JSON file an array of objects"]


def test_preference_pairs_are_uploaded_as_their_kind_and_previewed_as_pairs(alice_api, data_dir):
    from webapp.datasets.services import dataset_tokenize

    rows = "".join(json.dumps({"question": f"What is {k} + 1?", "chosen": f"{k + 1}.", "rejected": "No idea."}) + "\n"
                   for k in range(8))
    made = post(alice_api, "pairs.jsonl", rows.encode(), kind="preference")
    assert made.status_code == 201, made.content
    assert (made.json()["kind"], made.json()["columns"]) == (
        "preference", {"prompt": "question", "chosen": "chosen", "rejected": "rejected"})
    dataset_tokenize(dataset_id=made.json()["id"])
    ready = alice_api.get(f"/datasets/{made.json()['id']}").json()
    assert (ready["status"], ready["kind"], ready["n_examples"]) == ("ready", "preference", 8)  # pairs
    assert (ready["n_rows"], ready["n_bad_rows"]) == (8, 0) and 0 < ready["train_examples"] < 8
    preview = alice_api.get(f"/datasets/{made.json()['id']}/preview").json()
    assert preview["kind"] == "preference" and preview["bad_rows"] == []
    first = preview["pairs"][0]
    assert first["prompt"][0]["role"] == "user" and first["prompt"][0]["text"].startswith("What is ")
    assert first["rejected"] == [{"text": "No idea.", "role": "assistant"}]
    assert [row["max_seq_len"] for row in preview["too_long"]] == [128, 256, 512, 1024, 2048, 4096]


def test_a_file_without_rejected_answers_is_not_preference_data(alice_api, data_dir):
    made = post(alice_api, "half.jsonl", json.dumps({"prompt": "Q", "chosen": "A"}).encode() + b"\n",
                kind="preference")
    assert made.status_code == 400
    assert made.json()["errors"]["file"] == [
        "half.jsonl: kind 'preference' needs chosen/chosen_response + rejected/rejected_response (optional: "
        "prompt/question/query); found 'prompt', 'chosen'. Name the columns for chosen, rejected under Columns, "
        "e.g. chosen=your_column"]


def test_the_sample_pairs_are_a_preference_dataset(alice_api, data_dir):
    sample = alice_api.upload("/datasets", {"source": "sample_pairs", "vocab_size": 512})
    assert sample.status_code == 201, sample.content
    assert (sample.json()["source"], sample.json()["kind"], sample.json()["status"]) == (
        "sample_pairs", "preference", "tokenizing")
