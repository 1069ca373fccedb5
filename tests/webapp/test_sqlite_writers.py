"""The default SQLite database (`make run`) takes concurrent writers: the web server, the telemetry ingest
and the web worker each write to it, and a transaction that read before it writes must wait for another
writer instead of failing with "database is locked"."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connections, transaction

from webapp.config import database_config

ALIASES = ("sqlite_a", "sqlite_b")


@pytest.fixture
def sqlite_aliases(tmp_path: Path, django_db_blocker) -> Iterator[None]:
    """Two database aliases (two connections) on one SQLite file configured as `make run` configures it."""
    config = database_config({}, tmp_path)
    configured = connections.configure_settings({"default": {}} | dict.fromkeys(ALIASES, config))
    connections.settings.update({alias: configured[alias] for alias in ALIASES})
    with django_db_blocker.unblock():
        with connections[ALIASES[0]].cursor() as cursor:
            cursor.execute("CREATE TABLE counter (n INTEGER)")
        yield
        for alias in ALIASES:
            connections[alias].close()
    for alias in ALIASES:
        del connections.settings[alias]


def test_a_transaction_that_read_waits_for_another_writer(sqlite_aliases, django_db_blocker):
    first_read = threading.Event()
    other_committed = threading.Event()
    errors: list[BaseException] = []

    def read_then_write() -> None:
        # What the ingest and the pages' event sync do: read a row, then write in the same transaction.
        try:
            with django_db_blocker.unblock():
                with transaction.atomic(using=ALIASES[0]), connections[ALIASES[0]].cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM counter")
                    first_read.set()
                    # The other writer commits now if it can; when it has to wait for us, we go on alone.
                    other_committed.wait(timeout=2.0)
                    cursor.execute("INSERT INTO counter VALUES (1)")
                connections[ALIASES[0]].close()
        except Exception as error:  # reported by the test's own thread below
            errors.append(error)
            first_read.set()

    reader = threading.Thread(target=read_then_write)
    reader.start()
    assert first_read.wait(timeout=30)
    with django_db_blocker.unblock():
        with transaction.atomic(using=ALIASES[1]), connections[ALIASES[1]].cursor() as cursor:
            cursor.execute("INSERT INTO counter VALUES (2)")
        other_committed.set()
        reader.join()
        assert errors == []
        with connections[ALIASES[1]].cursor() as cursor:
            cursor.execute("SELECT n FROM counter ORDER BY n")
            assert cursor.fetchall() == [(1,), (2,)]
