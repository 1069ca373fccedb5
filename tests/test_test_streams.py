"""`make test` runs the tests that start processes and, beside them, the others in a second pytest
(`scripts/devstack.py`): the second stream must never share a Redis database or a PostgreSQL test database with
the first, and a run that chooses its tests by marker or keyword stays one stream."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def devstack_script():
    spec = importlib.util.spec_from_file_location("hydra_devstack_script", ROOT / "scripts" / "devstack.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.parametrize(("redis_url", "second_url"), [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/1"),
    ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379/1"),
    ("redis://:secret@cache.lab:6380/15", "redis://:secret@cache.lab:6380/0"),
])
def test_the_second_stream_uses_the_next_redis_database(devstack_script, redis_url: str, second_url: str) -> None:
    assert devstack_script.second_stream_env({"REDIS_URL": redis_url})["REDIS_URL"] == second_url


def test_the_second_stream_has_its_own_postgresql_database_and_sqlite_stays_as_it_is(devstack_script) -> None:
    env = {"REDIS_URL": "redis://127.0.0.1:6379/0", "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/hydra_ci"}
    assert devstack_script.second_stream_env(env)["DATABASE_URL"] == "postgres://postgres@127.0.0.1:5432/hydra_ci_second"
    sqlite = {"REDIS_URL": "redis://127.0.0.1:6379/0", "DATABASE_URL": "sqlite:///var/hydra.sqlite3"}
    assert devstack_script.second_stream_env(sqlite)["DATABASE_URL"] == sqlite["DATABASE_URL"]
    assert "DATABASE_URL" not in devstack_script.second_stream_env({"REDIS_URL": "redis://127.0.0.1:6379/0"})


@pytest.mark.parametrize(("args", "one_stream"), [
    ([], False),
    (["--durations=30"], False),
    (["tests/engine", "-x"], False),
    (["-m", "not slow"], True),
    (["-k", "partition"], True),
    (["-m=browser"], True),
    (["--lf"], True),
    (["--collect-only"], True),
])
def test_a_run_that_chooses_its_tests_is_one_stream(devstack_script, args: list[str], one_stream: bool) -> None:
    assert devstack_script.selects_tests(args) is one_stream


def test_make_runs_redis_port_is_the_default_or_a_valid_hydra_redis_port(devstack_script, monkeypatch) -> None:
    monkeypatch.delenv("HYDRA_REDIS_PORT", raising=False)
    assert devstack_script.private_redis_port() == devstack_script.PRIVATE_REDIS_PORT
    assert devstack_script.TEST_REDIS_PORT != devstack_script.PRIVATE_REDIS_PORT  # make test never shares it
    monkeypatch.setenv("HYDRA_REDIS_PORT", "7001")
    assert devstack_script.private_redis_port() == 7001
    for bad in ("0", "70000", "six", "-1"):
        monkeypatch.setenv("HYDRA_REDIS_PORT", bad)
        with pytest.raises(SystemExit, match="HYDRA_REDIS_PORT"):
            devstack_script.private_redis_port()
