"""Real Redis with a fresh host namespace per test (removed after), and a data directory per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.webapp.datasets.factories import use_data_dir


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    use_data_dir(settings, tmp_path)
    return tmp_path


@pytest.fixture
def host_id(redis_client: redis.Redis) -> Iterator[str]:
    host = f"test-telemetry-{uuid.uuid4().hex[:10]}"
    yield host
    keys = list(redis_client.scan_iter(match=f"hydra:{host}:*", count=1000))
    if keys:
        redis_client.delete(*keys)
