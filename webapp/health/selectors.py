"""What the health pages report: the database, Redis, the telemetry ingest and the device workers, each
actually asked (the workers' answer is kept a few seconds, see `workers_online`), what `make run`'s
supervisor did to the services it runs (`webapp.health.service_events`), the stream entries the ingest could
not store or apply and moved past (`skipped_entries`), and the shared LoRA bases this host holds in memory
(`shared_bases`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection
from django.urls import reverse
from django.utils import timezone

from webapp import queue_client
from webapp.accounts.models import Team
from webapp.ground.models import Trial
from webapp.health import service_events
from webapp.health.host_bases import HostBasesError, host_bases
from webapp.health.models import SkippedEntry
from webapp.ids import parse_id

# The ingest passes every second; a heartbeat older than this means it is not running.
INGEST_STALE_S = 30.0
# A broadcast waits for every worker's reply, so reloads within this many seconds reuse the last answer.
WORKERS_CACHE_S = 5.0
WORKERS_CACHE_KEY = "health:workers"
SKIPPED_SHOWN = 20  # the latest skipped stream entries the page lists (all are in the admin)


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
class TrialLink:
    label: str
    url: str


@dataclass(frozen=True)
class Skipped:
    """A stream entry the ingest moved past: where it is, the trial it was about (linked when its row is
    there) and why."""

    at: str
    host: str
    stream: str
    entry_id: str
    trial: TrialLink | None
    trial_queue_id: str
    error: str


@dataclass(frozen=True)
class SkippedEntries:
    total: int
    latest: list[Skipped]


@dataclass(frozen=True)
class SharedBase:
    """One shared base: its key (``short`` for display), its bytes, and the trials using it that the viewer's
    team may see; the others only counted, never named: those of other teams and queue ids no trial row has
    (a trial deleted while its reference stayed)."""

    key: str
    short: str
    bytes: int
    trials: list[TrialLink]
    other_teams: int
    unknown: int


@dataclass(frozen=True)
class SharedBases:
    bases: list[SharedBase]
    total_bytes: int
    spill_dir: str
    error: str | None = None


@dataclass(frozen=True)
class HealthReport:
    database: Check
    redis: Check
    ingest: Check
    workers: list[WorkerInfo] = field(default_factory=list)
    # make run's services: a line for each exit in this run, newest first, and the one-line summary.
    service_events: list[str] = field(default_factory=list)
    services_summary: str | None = None
    shared_bases: SharedBases | None = None
    skipped: SkippedEntries | None = None

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


def workers_online(*, live_only: bool = False) -> list[WorkerInfo]:
    """Every Celery worker with the device it is bound to (Celery's broadcast, not a guess), as answered at
    most `WORKERS_CACHE_S` ago: the broadcast reaches every worker and waits out its reply timeout, too much
    to repeat on each page load. With `live_only`, the workers whose device loops are alive, asked without
    waiting for others (`queue_client.workers_online`): what the pages that size work for the devices read."""
    key = f"{WORKERS_CACHE_KEY}:live" if live_only else WORKERS_CACHE_KEY
    workers = cache.get(key)
    if workers is None:
        workers = sorted(
            (WorkerInfo(name=info["name"], device=info.get("device"), host=info.get("host"), pid=info.get("pid"))
             for info in queue_client.workers_online(live_only=live_only)),
            key=lambda worker: worker.name,
        )
        cache.set(key, workers, WORKERS_CACHE_S)
    return workers


def services_summary() -> str | None:
    """One line on make run's services for anyone (a service down now, else the latest restart), or None."""
    return service_events.summary(service_events.events_read(settings.HYDRA.data_dir),
                                  timezone.get_current_timezone())


def service_up() -> bool:
    """Whether this web server can serve: its database and Redis answer. Asks no worker."""
    return database_check().ok and redis_check().ok


def shared_bases(*, team: Team | None) -> SharedBases:
    """The shared LoRA bases in this host's spill directory, with the trials using each: linked when they
    are `team`'s, counted otherwise (teams see none of each other's names), and the host bytes they take."""
    spill_dir = settings.HYDRA.worker.spill_dir
    try:
        found = host_bases(spill_dir)
    except HostBasesError as error:
        return SharedBases(bases=[], total_bytes=0, spill_dir=str(spill_dir), error=str(error))
    attempts: dict[str, tuple[int, int]] = {}  # queue id -> (trial pk, attempt)
    for base in found:
        for queue_id in base["trials"]:  # type: ignore[attr-defined]
            pk, _, attempt = str(queue_id).partition(".")
            parsed, number = parse_id(pk), parse_id(attempt) if attempt else 1
            if parsed is not None and number is not None:
                attempts[queue_id] = (parsed, number)
    rows = Trial.objects.filter(pk__in={pk for pk, _ in attempts.values()}).select_related("experiment")
    trials = {trial.pk: trial for trial in rows}
    listed = []
    for base in found:
        links, other_teams, unknown = [], 0, 0
        for queue_id in base["trials"]:  # type: ignore[attr-defined]
            pk, attempt = attempts.get(queue_id, (None, 1))
            trial = trials.get(pk) if pk is not None else None
            if trial is None:
                unknown += 1
            elif team is None or trial.experiment.team_id != team.pk:
                other_teams += 1
            else:
                label = str(trial) + (f" (attempt {attempt})" if attempt > 1 else "")
                links.append(TrialLink(label=label, url=reverse("trial_detail", args=[trial.pk])))
        key = str(base["key"])
        listed.append(SharedBase(key=key, short=key[:12], bytes=int(base["bytes"]),  # type: ignore[call-overload]
                                 trials=links, other_teams=other_teams, unknown=unknown))
    return SharedBases(bases=listed, total_bytes=sum(b.bytes for b in listed), spill_dir=str(spill_dir))


def skipped_entries() -> SkippedEntries:
    """How many stream entries the ingest skipped, ever, and the latest `SKIPPED_SHOWN` with their trials."""
    latest = list(SkippedEntry.objects.all()[:SKIPPED_SHOWN])
    rows = Trial.objects.filter(queue_id__in={e.trial for e in latest if e.trial}).select_related("experiment")
    links = {t.queue_id: TrialLink(label=str(t), url=reverse("trial_detail", args=[t.pk])) for t in rows}
    return SkippedEntries(total=SkippedEntry.objects.count(), latest=[
        Skipped(at=entry.created.isoformat(timespec="seconds"), host=entry.host, stream=entry.stream,
                entry_id=entry.entry_id, trial=links.get(entry.trial), trial_queue_id=entry.trial, error=entry.error)
        for entry in latest])


def health_report(*, team: Team | None = None) -> HealthReport:
    """Everything the details pages show; the shared bases' trials as `team` may see them."""
    events = service_events.events_read(settings.HYDRA.data_dir)
    tz = timezone.get_current_timezone()
    redis_status = redis_check()
    database = database_check()
    return HealthReport(
        database=database,
        redis=redis_status,
        ingest=ingest_check() if redis_status.ok else Check(False, "unknown: Redis cannot be reached"),
        workers=workers_online() if redis_status.ok else [],
        service_events=service_events.service_lines(events, tz),
        services_summary=service_events.summary(events, tz),
        shared_bases=shared_bases(team=team),
        skipped=skipped_entries() if database.ok else None,
    )
