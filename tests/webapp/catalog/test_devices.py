"""The catalog says where a checkpoint fits on the devices of this host's workers that answer, as the
health page asks them, and the experiment form refuses bf16 when they have no GPU: a real CPU device worker on
a host of the test's own."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.core.cache import cache
from django.urls import reverse

from tests.webapp.catalog.checkpoints import catalog_manager, tiny_llama
from tests.webapp.experiments.conftest import alice_dataset  # noqa: F401 -- a fixture
from tests.webapp.experiments.test_forms import bound, post_data, text
from webapp import queue_client, worker_door
from webapp.catalog.models import Checkpoint
from webapp.catalog.sizing import CPU_DEVICE_BUDGET, host_devices
from webapp.catalog.work import checkpoint_import

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def cpu_worker(settings, redis_url, tmp_path):
    """One real device worker (cpu:0) of a host that only this test uses, which the web app's settings name."""
    host = f"test-catalog-{uuid.uuid4().hex[:8]}"
    settings.HYDRA = dataclasses.replace(settings.HYDRA, worker=dataclasses.replace(settings.HYDRA.worker,
                                                                                   host_id=host))
    env = {**os.environ, "REDIS_URL": redis_url, "DEBUG": "1", "HYDRA_HOST_ID": host, "HYDRA_DEVICES": "cpu:1",
           "HYDRA_DATA_DIR": str(tmp_path / "worker")}
    process = subprocess.Popen([sys.executable, "-m", "worker.launch", "--device", "cpu:0", "--loglevel", "WARNING"],
                               env=env, cwd=ROOT, start_new_session=True)
    cache.clear()
    yield process
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _answered(cpu_worker) -> None:
    deadline = time.monotonic() + 90
    while not host_devices():
        assert cpu_worker.poll() is None, "the worker exited"
        assert time.monotonic() < deadline, "the worker never answered the broadcast"
        cache.clear()
        time.sleep(1)


@pytest.mark.django_db
def test_the_page_says_a_checkpoint_is_resident_on_the_cpu_device_that_answered(cpu_worker, alice, alice_client,
                                                                                  models_root):
    catalog_manager(alice)
    tiny_llama(models_root / "tiny")
    alice_client.post(reverse("catalog_register"), {"name": "Tiny", "path": "tiny"})
    checkpoint_import(checkpoint_id=Checkpoint.objects.get().pk)
    _answered(cpu_worker)
    assert [(d.device, d.budget_bytes) for d in host_devices()] == [("cpu:0", CPU_DEVICE_BUDGET)]
    page = alice_client.get(reverse("catalog_list")).content.decode()
    assert "<code>cpu:0</code>: budget 4.0\xa0GB" in page
    assert page.count('data-verdict="resident"') == 2  # AdamW and SGD
    detail = alice_client.get(reverse("checkpoint_detail", args=[Checkpoint.objects.get().pk])).content.decode()
    assert "whole on cpu:0" in detail


@pytest.mark.django_db
def test_the_devices_come_once_the_live_loops_answered_not_after_the_reply_timeout(cpu_worker, monkeypatch):
    _answered(cpu_worker)
    monkeypatch.setattr(queue_client, "WORKER_REPLY_TIMEOUT_S", 120.0)
    cache.clear()
    started = time.monotonic()
    assert [d.device for d in host_devices()] == ["cpu:0"]
    assert time.monotonic() - started < 60  # the broadcast ended with the live loop's answer


def test_no_device_is_asked_when_no_device_loop_is_alive(settings, redis_url, monkeypatch):
    settings.HYDRA = dataclasses.replace(settings.HYDRA, worker=dataclasses.replace(
        settings.HYDRA.worker, host_id=f"test-catalog-{uuid.uuid4().hex[:8]}", redis_url=redis_url))
    monkeypatch.setattr(worker_door.api, "workers_online", lambda **kwargs: pytest.fail("broadcast without a loop"))
    assert queue_client.workers_online(live_only=True) == []


@pytest.mark.django_db
def test_bf16_is_refused_when_this_hosts_workers_have_only_cpu_devices(cpu_worker, alice_team, alice_dataset):  # noqa: F811
    _answered(cpu_worker)
    form = bound(alice_team, post_data(alice_dataset, [{"name": "precision", "kind": "categorical",
                                                        "values": "fp32, bf16"}]))
    assert not form.is_valid()
    assert ("precision: bf16 needs a GPU device, and this host's workers have only cpu:0; use fp32."
            in text(form.rows.forms[0].errors))
    form = bound(alice_team, post_data(alice_dataset, [{"name": "precision", "kind": "categorical",
                                                        "values": "fp32"}]))
    assert form.is_valid(), form.errors
