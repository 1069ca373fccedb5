"""The dataset form in real Chromium: the file a user chooses is the data used, whatever the Data choice said
before, and columns of other names are mapped to roles on the form and shown on the dataset's page, whose
preview of a long row is cut and fits the window."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from tests.conftest import PASSWORD
from tests.webapp.datasets.factories import upload_and_build
from webapp.datasets.models import Dataset
from webapp.datasets.services import dataset_tokenize

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _log_in(page, live_server) -> None:
    page.goto(f"{live_server.url}/login/?next=/datasets/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/datasets/")


def test_a_chosen_file_is_the_data_used_and_its_columns_are_mapped(page, live_server, alice, tmp_path):
    pairs = tmp_path / "support.csv"
    pairs.write_text("title,body\n" + "".join(f"Question {k}?,Answer {k}.\n" for k in range(12)))
    _log_in(page, live_server)
    assert page.is_checked("input[name=source][value=sample]")  # the page opens on the sample

    page.set_input_files("input[name=file]", str(pairs))
    assert page.is_checked("input[name=source][value=upload]")
    page.fill("input[name=columns]", "prompt=title, completion=body")
    page.click("#dataset-form button[type=submit]")
    page.wait_for_url(re.compile(r"/datasets/\d+/$"))

    dataset = Dataset.objects.get()
    assert (dataset.source, dataset.name, dataset.filename, dataset.kind) == (
        "upload", "support.csv", "support.csv", "prompt_completion")
    assert page.inner_text("#dataset-columns") == "prompt ← title, completion ← body"
    assert page.errors == []


def test_a_file_left_under_a_sample_choice_is_refused_with_why(page, live_server, alice, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("Plain text.\n" * 50)
    _log_in(page, live_server)
    page.set_input_files("input[name=file]", str(notes))
    page.check("input[name=source][value=sample]")  # changed back after choosing the file
    page.click("#dataset-form button[type=submit]")
    page.wait_for_selector("ul.errorlist")
    assert "You chose the file 'notes.txt', but the Data choice is 'Built-in sample corpus'." in page.inner_text(
        "#dataset-form")
    assert not Dataset.objects.exists()


def test_a_long_row_is_cut_and_wrapped_in_the_preview(page, live_server, alice):
    client = Client()
    client.force_login(alice)
    rows = [{"title": "Long?", "body": "z" * 300_000}] + [{"title": f"Q{k}?", "body": f"A{k}."} for k in range(9)]
    content = "".join(json.dumps(row) + "\n" for row in rows).encode()
    dataset = upload_and_build(client, "long.jsonl", content, columns="prompt=title, completion=body",
                               val_fraction=0.1)
    _log_in(page, live_server)
    page.goto(f"{live_server.url}/datasets/{dataset.pk}/")
    first = page.locator("#examples-preview pre.example").first
    assert "more characters not shown" in first.inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    assert page.errors == []


def test_preference_pairs_uploaded_through_the_form_show_as_pairs(page, live_server, alice, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"What is {k} + 1?", "chosen": f"{k + 1}.",
                                         "rejected": "Work it out yourself."}) + "\n" for k in range(8)))
    _log_in(page, live_server)
    page.set_input_files("input[name=file]", str(pairs))
    page.click("#dataset-form button[type=submit]")
    page.wait_for_url(re.compile(r"/datasets/\d+/$"))
    dataset = Dataset.objects.get()
    assert dataset.kind == "preference"
    dataset_tokenize(dataset_id=dataset.pk)  # as the web worker would
    page.reload()
    assert page.inner_text("#dataset-kind") == "Preference pairs"
    first = page.locator("#pairs-preview .pair").first
    assert re.match(r"What is \d \+ 1\?", first.locator("pre.pair-prompt").inner_text().removeprefix("user: "))
    assert first.locator("pre.pair-rejected").inner_text().strip() == "assistant: Work it out yourself."
    assert page.locator("#too-long tbody tr").count() == 6
    assert page.errors == []
