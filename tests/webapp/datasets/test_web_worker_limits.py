"""A dataset whose build outgrows the memory a web task may take fails alone, with a message naming the limit, and
the same web worker goes on to build the next team's dataset; a task whose process dies on its last try fails its
work instead of leaving it pending."""

from __future__ import annotations

import dataclasses
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from billiard.exceptions import WorkerLostError
from celery.signals import task_failure
from django.test import Client

import webapp.datasets.tasks  # noqa: F401 -- registers the dataset tasks
from tests.webapp.datasets.factories import upload
from webapp.background.celery_app import app
from webapp.datasets.models import Dataset

MEMORY_MB = 700


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def roomy_parquet() -> bytes:
    """1,400 rows of 1,000,000 characters each: under the limit of a row and of the file's decoding (as the
    test sets it), 1.4 GB once read, in a few hundred kilobytes of zstd."""
    schema = pa.schema([("prompt", pa.string()), ("completion", pa.string())])
    out = io.BytesIO()
    with pq.ParquetWriter(out, schema, compression="zstd", use_dictionary=False) as writer:
        for group in range(14):
            writer.write_table(pa.table({"prompt": [f"Row {group}.{k}?" for k in range(100)],
                                         "completion": [chr(97 + group) * 1_000_000] * 100}, schema=schema))
    return out.getvalue()


@pytest.mark.processes
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_build_past_the_memory_limit_fails_alone_and_the_worker_builds_the_next(
        request, monkeypatch, settings, alice, bob):
    monkeypatch.setenv("HYDRA_WEB_TASK_MEMORY_MB", str(MEMORY_MB))
    monkeypatch.setenv("HYDRA_MAX_DECODED_MB", "4096")
    worker = request.getfixturevalue("web_worker")
    settings.HYDRA = dataclasses.replace(settings.HYDRA, web_task_memory_bytes=MEMORY_MB << 20,
                                         max_decoded_bytes=4096 << 20)

    response = upload(client_of(alice), "huge.parquet", roomy_parquet(), val_fraction=0.1)
    assert response.status_code == 302, response.content.decode()[:2000]
    huge = Dataset.objects.get(name="huge.parquet")
    worker.wait(lambda: Dataset.objects.get(pk=huge.pk).status != Dataset.Status.TOKENIZING, 240,
                "the large dataset's build")
    huge.refresh_from_db()
    assert huge.status == Dataset.Status.FAILED
    assert huge.message.startswith("Reading and tokenizing this file took more memory than a task of the web worker "
                                   f"may take ({MEMORY_MB} MB, HYDRA_WEB_TASK_MEMORY_MB)."), huge.message

    rows = "".join(json.dumps({"question": f"What is {k} + {k}?", "answer": str(2 * k)}) + "\n" for k in range(20))
    assert upload(client_of(bob), "sums.jsonl", rows.encode()).status_code == 302
    sums = Dataset.objects.get(name="sums.jsonl")
    worker.wait(lambda: Dataset.objects.get(pk=sums.pk).status != Dataset.Status.TOKENIZING, 120,
                "the next dataset's build")
    sums.refresh_from_db()
    assert sums.status == Dataset.Status.READY, sums.message
    assert sums.columns == {"prompt": "question", "completion": "answer"}
    assert worker.process is not None and worker.process.poll() is None  # the same worker, still running


@pytest.mark.django_db
def test_a_task_whose_process_dies_on_its_last_try_fails_its_work(alice_team, settings):
    settings.HYDRA = dataclasses.replace(settings.HYDRA, web_task_memory_bytes=2048 << 20)
    dataset = Dataset.objects.create(team=alice_team, name="lost", source="upload", kind="messages",
                                     vocab_size=300, val_fraction=0.1, n_bytes=1, fingerprint="f", storage_key="k")
    task = app.tasks[Dataset.TASK]
    assert (task.retry_on_worker_lost, task.max_retries) == (True, 1)

    task_failure.send(sender=task, task_id="t", exception=WorkerLostError("signal 6 (SIGABRT)"), args=(dataset.pk,))

    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.FAILED
    assert dataset.message.startswith("The web worker's process ended while doing this, 2 times: it may have needed "
                                      "more memory than a task may take (2,048 MB, HYDRA_WEB_TASK_MEMORY_MB).")
