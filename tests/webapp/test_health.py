"""The health page asks the real database, the real Redis and real Celery workers."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.urls import reverse

from webapp.health.selectors import health_report

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


@pytest.fixture
def cpu_worker(redis_url, tmp_path):
    """One real device worker (cpu:0) started the way a process manager would, against the real broker."""
    env = {**os.environ, "REDIS_URL": redis_url, "DEBUG": "1", "HYDRA_HOST_ID": "healthcheck",
           "HYDRA_DEVICES": "cpu:1", "HYDRA_DATA_DIR": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "worker.launch", "--device", "cpu:0", "--loglevel", "WARNING"],
        env=env, cwd=ROOT, start_new_session=True,
    )
    yield process
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_it_reports_database_redis_and_a_worker_with_its_device(cpu_worker, client):
    deadline = time.monotonic() + 90
    workers = []
    while time.monotonic() < deadline:
        workers = [w for w in health_report().workers if w.name == "cpu0@healthcheck"]
        if workers:
            break
        assert cpu_worker.poll() is None, "the worker exited"
        time.sleep(1)
    assert workers, "the worker never answered the broadcast"
    assert workers[0].device == "cpu:0" and workers[0].pid == cpu_worker.pid

    response = client.get(reverse("health_json"))
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] and body["database"]["ok"] and body["redis"]["ok"]
    assert {"name": "cpu0@healthcheck", "device": "cpu:0", "host": "healthcheck", "pid": cpu_worker.pid} in body[
        "workers"
    ]
    page = client.get(reverse("health")).content.decode()
    assert "cpu0@healthcheck" in page and "cpu:0" in page


def test_it_reports_redis_down_with_status_503(settings, client):
    settings.HYDRA = dataclasses.replace(
        settings.HYDRA, worker=dataclasses.replace(settings.HYDRA.worker, redis_url="redis://:secret@127.0.0.1:1/0"))
    response = client.get(reverse("health_json"))
    assert response.status_code == 503
    body = response.json()
    assert body["database"]["ok"] and not body["redis"]["ok"]
    assert "secret" not in body["redis"]["detail"]
    assert body["workers"] == []
    assert client.get(reverse("health")).status_code == 503
