"""A real Hydra server for the client's tests (`live_server`, on this test's data folder and its own host's
queue), tokens for its users, and the ``hydra`` command line run against it with a config of the test's own.

The client runs in the test's process (click's CliRunner) and reaches the server over HTTP; with SQLite in
memory, `db_lock` keeps the server's requests from reading while the test writes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from hydra_client.cli import cli
from tests.browser.conftest import db_lock, devstack  # noqa: F401 -- fixtures
from tests.webapp.datasets.factories import use_data_dir
from webapp.api.tokens import token_create

CLIENT_ENV = ("HYDRA_URL", "HYDRA_TOKEN", "HYDRA_TEAM", "HYDRA_CONFIG")


@pytest.fixture
def server(transactional_db, live_server, db_lock, settings, tmp_path: Path, redis_client: redis.Redis,  # noqa: F811
           ) -> Iterator[str]:
    """The URL of a real server whose files go to this test's folder and whose work goes to a throw-away host's
    queues (deleted afterwards), so that no other test's worker takes it."""
    use_data_dir(settings, tmp_path / "data")
    host = f"test-client-{uuid.uuid4().hex[:10]}"
    settings.HYDRA = dataclasses.replace(settings.HYDRA,
                                         worker=dataclasses.replace(settings.HYDRA.worker, host_id=host))
    yield live_server.url
    _request_threads_join()
    keys = list(redis_client.scan_iter(match=f"*{host}*", count=1000))
    if keys:
        redis_client.delete(*keys)


def _request_threads_join(timeout_s: float = 5.0) -> None:
    """Wait for the live server's request threads to end: each closes its database connection as it ends
    (once its client hung up), and a connection left open keeps the test database from being dropped."""
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        if "process_request_thread" in thread.name:
            thread.join(max(0.0, deadline - time.monotonic()))


def make_token(user, scope: str = "write") -> str:
    _, secret = token_create(user=user, name=f"{scope} token", scope=scope, days=30)
    return secret


@pytest.fixture
def alice_token(alice) -> str:
    return make_token(alice)


@dataclass
class Shell:
    """``hydra`` as a user runs it, with its config in `config` and no HYDRA_* variables of the caller's."""

    config: Path

    def __call__(self, *args: str, input: str | None = None, **env: str) -> Result:
        environment: dict[str, str | None] = dict.fromkeys(CLIENT_ENV)
        environment["HYDRA_CONFIG"] = str(self.config)
        environment.update(env)
        return CliRunner().invoke(cli, list(args), input=input, env=environment, catch_exceptions=False)


@pytest.fixture
def hydra(tmp_path: Path) -> Shell:
    return Shell(config=tmp_path / "home" / "hydra" / "config.json")


@pytest.fixture
def alice_hydra(hydra: Shell, server: str, alice_token: str) -> Shell:
    """``hydra`` logged in to `server` as alice."""
    result = hydra("login", server, "--token", alice_token)
    assert result.exit_code == 0, result.output
    return hydra
