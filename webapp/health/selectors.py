"""What the health pages report: the database, Redis, the telemetry ingest and the device workers, each
actually asked (the workers' answer is kept a few seconds, see `workers_online`), and what `make run`'s
supervisor did to the services it runs (`webapp.health.service_events`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection
from django.utils import timezone

from webapp import queue_client
from webapp.health import service_events

# The ingest passes every second; a heartbeat older than this means it is not running.
INGEST_STALE_S = 30.0
# A broadcast waits for every worker's reply, so reloads within this many seconds reuse the last answer.
WORKERS_CACHE_S = 5.0
WORKERS_CACHE_KEY = "health:workers"


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    device: str | None
    host: str | None
    pid: int | None


@dataclass(frozen=True)
class HealthReport:
    database: Check
    redis: Check
    ingest: Check
    workers: list[WorkerInfo] = field(default_factory=list)
    # make run's services: a line for each exit in this run, newest first, and the one-line summary.
    service_events: list[str] = field(default_factory=list)
    services_summary: str | None = None

    @property
    def ok(self) -> bool:
        return self.database.ok and self.redis.ok

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, **asdict(self)}


def database_check() -> Check:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as error:
        return Check(False, f"{connection.vendor}: {error}")
    return Check(True, connection.vendor)


def redis_check() -> Check:
    client = redis.Redis.from_url(settings.HYDRA.worker.redis_url, socket_connect_timeout=1.0, socket_timeout=1.0)
    try:
        info = client.info("server")
    except redis.RedisError as error:
        return Check(False, f"{_redacted(settings.HYDRA.worker.redis_url)}: {error}")
    finally:
        client.close()
    return Check(True, f"redis {info.get('redis_version', '?')} at {_redacted(settings.HYDRA.worker.redis_url)}")


def _redacted(url: str) -> str:
    """The URL without its password, for display."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url


def ingest_check() -> Check:
    """Whether the telemetry ingest (``manage.py hydra_ingest``) passed over this host's streams lately.
    Without it the dashboards' curves stop; trial statuses still come through (pages apply trial events)."""
    try:
        age = queue_client.heartbeat_age(name="ingest")
    except redis.RedisError as error:
        return Check(False, f"unknown: Redis cannot be reached ({error})")
    if age is None:
        return Check(False, "never ran on this host: start `manage.py hydra_ingest` for learning curves")
    if age > INGEST_STALE_S:
        return Check(False, f"last pass {age:.0f} s ago: `manage.py hydra_ingest` is not running")
    return Check(True, f"last pass {age:.1f} s ago")


def workers_online() -> list[WorkerInfo]:
    """Every Celery worker with the device it is bound to (Celery's broadcast, not a guess), as answered at
    most `WORKERS_CACHE_S` ago: the broadcast reaches every worker and waits out its reply timeout, too much
    to repeat on each page load."""
    workers = cache.get(WORKERS_CACHE_KEY)
    if workers is None:
        workers = sorted(
            (WorkerInfo(name=info["name"], device=info.get("device"), host=info.get("host"), pid=info.get("pid"))
             for info in queue_client.workers_online()),
            key=lambda worker: worker.name,
        )
        cache.set(WORKERS_CACHE_KEY, workers, WORKERS_CACHE_S)
    return workers


def services_summary() -> str | None:
    """One line on make run's services for anyone (a service down now, else the latest restart), or None."""
    return service_events.summary(service_events.events_read(settings.HYDRA.data_dir),
                                  timezone.get_current_timezone())


def service_up() -> bool:
    """Whether this web server can serve: its database and Redis answer. Asks no worker."""
    return database_check().ok and redis_check().ok


def health_report() -> HealthReport:
    events = service_events.events_read(settings.HYDRA.data_dir)
    tz = timezone.get_current_timezone()
    redis_status = redis_check()
    return HealthReport(
        database=database_check(),
        redis=redis_status,
        ingest=ingest_check() if redis_status.ok else Check(False, "unknown: Redis cannot be reached"),
        workers=workers_online() if redis_status.ok else [],
        service_events=service_events.service_lines(events, tz),
        services_summary=service_events.summary(events, tz),
    )
