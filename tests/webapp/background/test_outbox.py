"""The web worker's pending work is sent again when its send never happened or its message may be lost, and
given up with a message after `MAX_SENDS` sends; against real Redis (a queue no web worker consumes)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.core.files.base import ContentFile
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.webapp.datasets.factories import TINY_CORPUS, use_data_dir
from tests.webapp.web_worker import CLOSED_PORT_URL, redis_at
from webapp.background.celery_app import web_queue
from webapp.background.outbox import MAX_SENDS, RESEND_AFTER, SEND_GRACE
from webapp.background.reconcile import WebWorkReconciled, web_work_reconcile
from webapp.datasets.models import Dataset
from webapp.datasets.services import dataset_create

pytestmark = pytest.mark.django_db
SECOND = timedelta(seconds=1)


@pytest.fixture
def queued(settings, tmp_path, redis_client) -> Iterator[Callable[[], int]]:
    """How many messages wait in the web queue of a throw-away host that no web worker consumes."""
    use_data_dir(settings, tmp_path)
    host = f"test-web-{uuid.uuid4().hex[:10]}"
    settings.HYDRA = dataclasses.replace(settings.HYDRA, worker=dataclasses.replace(settings.HYDRA.worker,
                                                                                   host_id=host))
    yield lambda: redis_client.llen(web_queue(host))
    keys = list(redis_client.scan_iter(match=f"*{host}*", count=1000))
    if keys:
        redis_client.delete(*keys)


def _upload(team, capture, *, send: bool) -> Dataset:
    with capture(execute=send):
        dataset = dataset_create(team=team, user=None, name="fox", corpus=ContentFile(TINY_CORPUS.encode()),
                                 source=Dataset.Source.UPLOAD, vocab_size=300, val_fraction=0.1)
    dataset.refresh_from_db()
    return dataset


def test_a_request_that_died_before_its_send_is_sent_by_the_first_pass_after_the_grace(
        alice_team, queued, django_capture_on_commit_callbacks):
    dataset = _upload(alice_team, django_capture_on_commit_callbacks, send=False)
    assert (dataset.send_attempts, queued()) == (0, 0)

    assert web_work_reconcile() == WebWorkReconciled(sent=0, failed=0)  # its own send may still come
    assert web_work_reconcile(now=timezone.now() + SEND_GRACE) == WebWorkReconciled(sent=1, failed=0)

    dataset.refresh_from_db()
    assert (dataset.send_attempts, dataset.send_error, queued()) == (1, "", 1)


def test_a_message_that_reached_redis_is_sent_again_only_once_it_may_be_lost(
        alice_team, queued, django_capture_on_commit_callbacks):
    dataset = _upload(alice_team, django_capture_on_commit_callbacks, send=True)
    assert (dataset.send_attempts, queued()) == (1, 1)
    later = dataset.resend_at

    assert web_work_reconcile(now=later - SECOND) == WebWorkReconciled(sent=0, failed=0)
    assert web_work_reconcile(now=later) == WebWorkReconciled(sent=1, failed=0)
    assert queued() == 2
    dataset.refresh_from_db()
    assert dataset.send_attempts == 2 and dataset.resend_at >= later + RESEND_AFTER


def test_a_send_that_found_redis_down_is_sent_by_the_first_pass_once_it_is_back(
        alice_team, queued, django_capture_on_commit_callbacks, settings):
    with redis_at(settings, CLOSED_PORT_URL):
        dataset = _upload(alice_team, django_capture_on_commit_callbacks, send=True)
    assert dataset.status == Dataset.Status.TOKENIZING and dataset.corpus_path.exists()
    assert dataset.send_attempts == 1 and "127.0.0.1:1" in dataset.send_error and queued() == 0

    assert web_work_reconcile() == WebWorkReconciled(sent=1, failed=0)

    dataset.refresh_from_db()
    assert (dataset.send_attempts, dataset.send_error, queued()) == (2, "", 1)


def test_work_sent_max_sends_times_fails_with_a_message_its_page_shows(
        alice, alice_team, queued, django_capture_on_commit_callbacks):
    dataset = _upload(alice_team, django_capture_on_commit_callbacks, send=False)
    now = timezone.now() + SEND_GRACE
    for _ in range(MAX_SENDS):
        assert web_work_reconcile(now=now) == WebWorkReconciled(sent=1, failed=0)
        now += RESEND_AFTER

    assert web_work_reconcile(now=now) == WebWorkReconciled(sent=0, failed=1)

    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.FAILED and queued() == MAX_SENDS
    assert dataset.message == (
        f"The web worker did not do this after {MAX_SENDS} sends; it may be stopped: ask an administrator to "
        "check it. The corpus is kept; delete the dataset and upload it again once the web worker runs.")
    client = Client()
    client.force_login(alice)
    page = client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert 'data-status="failed"' in page and f"did not do this after {MAX_SENDS} sends" in page
    assert web_work_reconcile(now=now) == WebWorkReconciled(sent=0, failed=0)
