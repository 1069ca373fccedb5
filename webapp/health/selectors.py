"""What the health page reports: the database, Redis and the device workers, each actually asked."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import redis
from django.conf import settings
from django.db import DatabaseError, connection

WORKER_REPLY_TIMEOUT_S = 1.5


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
    workers: list[WorkerInfo] = field(default_factory=list)

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
    client = redis.Redis.from_url(settings.HYDRA.redis_url, socket_connect_timeout=1.0, socket_timeout=1.0)
    try:
        info = client.info("server")
    except redis.RedisError as error:
        return Check(False, f"{_redacted(settings.HYDRA.redis_url)}: {error}")
    finally:
        client.close()
    return Check(True, f"redis {info.get('redis_version', '?')} at {_redacted(settings.HYDRA.redis_url)}")


def _redacted(url: str) -> str:
    """The URL without its password, for display."""
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url


def workers_online() -> list[WorkerInfo]:
    """Ask every Celery worker which device it is bound to (Celery's broadcast, not a guess)."""
    from worker.celery_app import app

    try:
        replies = app.control.broadcast("hydra_device", reply=True, timeout=WORKER_REPLY_TIMEOUT_S)
    except (OSError, redis.RedisError):
        return []
    workers = []
    for reply in replies or []:
        for name, info in reply.items():
            info = info if isinstance(info, dict) else {}
            workers.append(WorkerInfo(name=name, device=info.get("device"), host=info.get("host"), pid=info.get("pid")))
    return sorted(workers, key=lambda worker: worker.name)


def health_report() -> HealthReport:
    redis_status = redis_check()
    return HealthReport(
        database=database_check(),
        redis=redis_status,
        workers=workers_online() if redis_status.ok else [],
    )
