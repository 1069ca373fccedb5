"""The web worker for tests of the pages' background work (`tests.webapp.web_worker`)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.webapp.web_worker import WebWorker, database_url


@pytest.fixture
def web_worker(transactional_db, settings, tmp_path: Path) -> Iterator[WebWorker]:
    """A real web worker on the test database, this test's data folder and its own host's queue.

    The test's settings switch to that host, so that what its pages enqueue goes to this worker alone.
    """
    url = database_url()
    if url is None:
        pytest.skip("the web worker needs a database another process can open: set DATABASE_URL to PostgreSQL")
    host = f"test-web-{uuid.uuid4().hex[:10]}"
    settings.HYDRA = dataclasses.replace(settings.HYDRA, worker=dataclasses.replace(settings.HYDRA.worker,
                                                                                   host_id=host))
    worker = WebWorker(host_id=host, data_dir=settings.HYDRA.data_dir, database_url=url,
                       redis_url=settings.HYDRA.worker.redis_url, log_path=tmp_path / "web-worker.log")
    try:
        worker.start()
        yield worker
    finally:
        worker.stop()
