"""Fixtures for the scheduler's tests: a real Redis, with a fresh host namespace per test that is removed after."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from django.conf import settings

from tests.worker.device_workers import DeviceWorkers
from worker.scheduling.keys import HOSTS_KEY
from worker.scheduling.queue import ShardQueue


@pytest.fixture
def host_id(redis_client: redis.Redis) -> Iterator[str]:
    """A host name no other test uses; every key and Celery queue named after it is deleted afterwards, and the
    host leaves the lab's registry, where its workers put it."""
    host = f"test-{uuid.uuid4().hex[:10]}"
    yield host
    keys = list(redis_client.scan_iter(match=f"*{host}*", count=1000))
    if keys:
        redis_client.delete(*keys)
    redis_client.zrem(HOSTS_KEY, host)


@pytest.fixture
def shard_queue(redis_client: redis.Redis, host_id: str) -> ShardQueue:
    return ShardQueue(redis_client, host_id)


@pytest.fixture
def device_workers(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., DeviceWorkers]]:
    """Start real Celery device workers: ``device_workers("cpu0", "cpu1", lease_s=2.0)``; stopped after.
    ``env`` adds variables to the workers' environment."""
    started: list[DeviceWorkers] = []

    def start(*names: str, lease_s: float = 10.0, env: dict[str, str] | None = None) -> DeviceWorkers:
        workers = DeviceWorkers(redis_url=redis_url, root=tmp_path / f"workers{len(started)}", lease_s=lease_s,
                                env=env or {})
        (workers.root).mkdir()
        started.append(workers)
        workers.start(*names)
        return workers

    yield start
    for workers in started:
        workers.stop()


@pytest.fixture(scope="module")
def shared_device_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeviceWorkers]:
    """Device workers ``cpu0`` and ``cpu1`` (default lease, no fault) started once for a whole module, for
    tests that neither kill, freeze nor reconfigure them and that read only their own trials' records and
    telemetry: each test names trials no other test of the module uses. A pool costs about 8 s to start and
    stop."""
    root = tmp_path_factory.mktemp("shared-workers")
    workers = DeviceWorkers(redis_url=settings.HYDRA.worker.redis_url, root=root, lease_s=10.0)
    try:
        workers.start("cpu0", "cpu1")
        yield workers
    finally:
        workers.stop()


@pytest.fixture
def tokens(tmp_path: Path) -> str:
    """A token file of 16,384 random ids below 64, for tiny engine trials."""
    path = tmp_path / "tokens.npy"
    np.save(path, np.random.default_rng(0).integers(0, 64, 16384).astype(np.int32))
    return str(path)
