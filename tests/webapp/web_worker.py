"""The web worker (`manage.py hydra_web_worker`) as a real subprocess, for tests of the pages' background work.

It runs on the test database (so the test must commit what the worker reads: ``transaction=True``), the
test's data folder and a throw-away host id, whose queue only it consumes; stopping it deletes that host's keys.
`redis_at` points the web app at another Redis: a closed port (`CLOSED_PORT_URL`, Redis down) or `silent_redis`
(a Redis that accepts connections and never answers).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from django.conf import LazySettings
from django.db import connection

from webapp.background.celery_app import app
from worker.processes import stop_processes

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0
CLOSED_PORT_URL = "redis://127.0.0.1:1/0"


def database_url() -> str | None:
    """A URL another process can open the test database with, or None for SQLite in memory."""
    db = connection.settings_dict
    if db["ENGINE"] == "django.db.backends.postgresql":
        password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
        return f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    return None


@contextmanager
def redis_at(settings: LazySettings, url: str) -> Iterator[None]:
    """Within the block, the web app (its sends to the web worker, its queue client) uses the Redis at `url`."""
    reachable = settings.HYDRA.worker.redis_url
    _use_redis(settings, url)
    try:
        yield
    finally:
        _use_redis(settings, reachable)


def _use_redis(settings: LazySettings, url: str) -> None:
    settings.HYDRA = dataclasses.replace(settings.HYDRA, worker=dataclasses.replace(settings.HYDRA.worker,
                                                                                   redis_url=url))


@contextmanager
def silent_redis() -> Iterator[str]:
    """The URL of a server that accepts connections and never answers, like a Redis hung or cut off."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)  # the kernel completes the connections that nobody accepts
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"


class WebWorker:
    def __init__(self, *, host_id: str, data_dir: Path, database_url: str, redis_url: str, log_path: Path) -> None:
        self.host_id = host_id
        self.env = {
            **os.environ, "DEBUG": "1", "DATABASE_URL": database_url, "REDIS_URL": redis_url,
            "HYDRA_HOST_ID": host_id, "HYDRA_DATA_DIR": str(data_dir), "HYDRA_SPILL_DIR": str(data_dir / "spill"),
        }
        self.redis_url = redis_url
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the worker and wait until it answers a ping."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "hydra_web_worker", "--concurrency", "1"], cwd=ROOT, env=self.env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.wait(lambda: bool(app.control.ping([f"web@{self.host_id}"], timeout=0.5)), START_TIMEOUT_S,
                  "the web worker to answer a ping")

    def wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}\n{self.log()}")
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            stop_processes([self.process], grace_s=15.0)
        client = redis.Redis.from_url(self.redis_url)
        try:
            keys = list(client.scan_iter(match=f"*{self.host_id}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
