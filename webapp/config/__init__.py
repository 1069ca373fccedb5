"""Read the web app's configuration from the environment, once, into typed values.

`load(environ)` is pure: settings.py calls it with ``os.environ`` and tests call it with a dict. The
workers' part (Redis, host id, spill and data directories, devices) is `worker.config.WorkerConfig`, read by
the same code the workers use (through `webapp.worker_door`) and kept as ``Config.worker``; the
notifications' part is `notify`. Every bad value raises ``ImproperlyConfigured`` naming the variable and
what it accepts, so a misconfigured server stops at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from webapp.config.notify import NotifyConfig, notify_config
from webapp.worker_door import (
    BASE_DIR,
    ConfigError,
    WorkerConfig,
    envbool,
    envint,
    envlist,
    envpath,
    load_worker_config,
)

__all__ = ["BASE_DIR", "Config", "load"]

DEV_SECRET_KEY = "hydra-dev-only-insecure-secret-key"
# Trial.step and Trial.total_steps are PostgreSQL integer columns: no trial may be longer.
STEPS_CEILING = 2**31 - 1
MAX_TRIALS = 256  # the most trials a search expands to (random search and TPE may ask for no more)
HSTS_SECONDS_DEFAULT = 365 * 24 * 3600
TELEMETRY_KEEP_DAYS_DEFAULT = 14
# The lab queue page shares out the last week's device time from the stored unit spans: telemetry younger than
# that is never compacted.
TELEMETRY_KEEP_DAYS_MINIMUM = 7
LOGIN_FAILURES_PER_USER_DEFAULT = 5
LOGIN_FAILURES_PER_ADDRESS_DEFAULT = 50
MAX_DECODED_MB_DEFAULT = 1024
# A web task process with Django, torch and transformers loaded maps about 300 MB before it does anything.
WEB_TASK_MEMORY_MINIMUM_MB = 512


@dataclass(frozen=True, kw_only=True)
class Caps:
    """The most work one experiment may ask for; the experiment form and services refuse more, so that a
    typo in a budget cannot queue a trial that never ends."""

    steps_per_trial: int
    tokens_per_trial: int
    trials_per_experiment: int


@dataclass(frozen=True, kw_only=True)
class LoginThrottle:
    """How many wrong passwords within the cool-off lock a login (`webapp.accounts.login_throttle`)."""

    failures_per_user: int  # for one username from one client address: locks that pair
    failures_per_address: int  # for any usernames from one client address: locks that address
    trusted_proxy_count: int  # proxies in front of the server that append to X-Forwarded-For; 0: none


@dataclass(frozen=True, kw_only=True)
class Config:
    debug: bool
    secret_key: str
    allowed_hosts: list[str]
    database: dict[str, object]
    data_dir: Path
    models_root: Path
    import_dir: Path  # the server-side folder datasets may be imported from, for files too large to upload
    max_upload_bytes: int
    max_decoded_bytes: int  # the most a dataset file's columns may decode to (Parquet is compressed)
    web_task_memory_bytes: int | None  # each web worker task's memory; None: a quarter of the host's
    caps: Caps
    csrf_trusted_origins: list[str]
    https: bool
    hsts_seconds: int
    telemetry_keep_days: int | None  # None: telemetry is kept at full detail forever
    login_throttle: LoginThrottle
    api_rate_per_minute: int  # requests one API token may make in any 60 s (`webapp.api.auth`)
    api_auth_failures_per_address: int  # wrong tokens one client address may send in 15 min (`webapp.api.auth`)
    notify: NotifyConfig  # webhook allowlist, retries, e-mail (`webapp.config.notify`)
    worker: WorkerConfig


def allowed_hosts(environ: Mapping[str, str], debug: bool) -> list[str]:
    if "ALLOWED_HOSTS" not in environ and not debug:
        raise ConfigError("ALLOWED_HOSTS is not set; list the server's host names (comma-separated).")
    return envlist(environ, "ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])


# The web server, the telemetry ingest and the web tasks write to one SQLite file at once. A transaction takes
# the write lock when it begins (and waits for it up to `timeout` s) instead of failing with "database is
# locked" when it upgrades from reading; WAL lets pages read while another process writes.
SQLITE_OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}


def database_config(environ: Mapping[str, str], data_dir: Path) -> dict[str, object]:
    raw = environ.get("DATABASE_URL", "").strip()
    if not raw:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(data_dir / "hydra.sqlite3"),
                "OPTIONS": dict(SQLITE_OPTIONS)}
    scheme = urlparse(raw).scheme
    if scheme not in {"postgres", "postgresql", "sqlite"}:
        raise ConfigError(
            f"DATABASE_URL has scheme {scheme!r}; use postgres://user@host:port/name or sqlite:////abs/path.db."
        )
    try:
        config = dict(dj_database_url.parse(raw, conn_max_age=60, conn_health_checks=True))
    except ValueError as error:
        raise ConfigError(f"DATABASE_URL={raw!r} cannot be parsed: {error}") from None
    if not config.get("NAME"):
        raise ConfigError(f"DATABASE_URL={raw!r} names no database.")
    if scheme == "sqlite":
        config["OPTIONS"] = dict(SQLITE_OPTIONS)
    return config


def https_config(environ: Mapping[str, str], debug: bool) -> tuple[bool, int]:
    """`HYDRA_HTTPS` (on unless DEBUG): the site is served over HTTPS by a TLS proxy that sets
    ``X-Forwarded-Proto``. `HYDRA_HSTS_SECONDS`: how long browsers must use HTTPS only (a year by default
    when HTTPS is on; 0 sends no HSTS header)."""
    https = envbool(environ, "HYDRA_HTTPS", default=not debug)
    hsts_seconds = envint(environ, "HYDRA_HSTS_SECONDS", HSTS_SECONDS_DEFAULT if https else 0, minimum=0)
    if hsts_seconds and not https:
        raise ConfigError(
            f"HYDRA_HSTS_SECONDS={hsts_seconds} needs HYDRA_HTTPS=1: browsers only honour HSTS over HTTPS."
        )
    return https, hsts_seconds


def caps_config(environ: Mapping[str, str]) -> Caps:
    """`HYDRA_MAX_STEPS_PER_TRIAL`, `HYDRA_MAX_TOKENS_PER_TRIAL` (steps x batch x sequence length) and
    `HYDRA_MAX_TRIALS_PER_EXPERIMENT`, each at most what the database and the search space can hold."""
    steps = envint(environ, "HYDRA_MAX_STEPS_PER_TRIAL", 1_000_000, minimum=1)
    if steps > STEPS_CEILING:
        raise ConfigError(f"HYDRA_MAX_STEPS_PER_TRIAL={steps} is too large; the database holds at most "
                          f"{STEPS_CEILING} steps per trial.")
    trials = envint(environ, "HYDRA_MAX_TRIALS_PER_EXPERIMENT", MAX_TRIALS, minimum=1)
    if trials > MAX_TRIALS:
        raise ConfigError(f"HYDRA_MAX_TRIALS_PER_EXPERIMENT={trials} is too large; a search expands to at most "
                          f"{MAX_TRIALS} trials.")
    return Caps(
        steps_per_trial=steps,
        tokens_per_trial=envint(environ, "HYDRA_MAX_TOKENS_PER_TRIAL", 10_000_000_000, minimum=1),
        trials_per_experiment=trials,
    )


def telemetry_keep_days(environ: Mapping[str, str]) -> int | None:
    """`HYDRA_TELEMETRY_KEEP_DAYS`: after how many days an ended trial's telemetry is compacted to what the
    dashboards draw of it (`webapp.dashboards.compaction`); 0 or ``off`` keeps every row forever."""
    name = "HYDRA_TELEMETRY_KEEP_DAYS"
    raw = environ.get(name, "").strip()
    if raw.lower() in {"0", "off"}:
        return None
    days = envint(environ, name, TELEMETRY_KEEP_DAYS_DEFAULT, minimum=0)
    if days < TELEMETRY_KEEP_DAYS_MINIMUM:
        raise ConfigError(
            f"{name}={days} is too short; keep telemetry at least {TELEMETRY_KEEP_DAYS_MINIMUM} days (the lab "
            "queue page shares out the last week's device time from it), or 0/off to keep it all.")
    return days


def login_throttle(environ: Mapping[str, str]) -> LoginThrottle:
    """`HYDRA_LOGIN_FAILURES_PER_USER` (5) and `HYDRA_LOGIN_FAILURES_PER_ADDRESS` (50): wrong passwords within
    the cool-off that lock one username from one client address, and every username from that address.
    `HYDRA_TRUSTED_PROXY_COUNT` (0): how many proxies stand in front of the server, each appending the address
    it saw to X-Forwarded-For; with 0 the client's address is the connection's (REMOTE_ADDR)."""
    per_user = envint(environ, "HYDRA_LOGIN_FAILURES_PER_USER", LOGIN_FAILURES_PER_USER_DEFAULT, minimum=1)
    per_address = envint(environ, "HYDRA_LOGIN_FAILURES_PER_ADDRESS", LOGIN_FAILURES_PER_ADDRESS_DEFAULT,
                         minimum=1)
    if per_address < per_user:
        raise ConfigError(
            f"HYDRA_LOGIN_FAILURES_PER_ADDRESS={per_address} is below HYDRA_LOGIN_FAILURES_PER_USER={per_user}; "
            "an address must be allowed at least one username's failures.")
    return LoginThrottle(
        failures_per_user=per_user,
        failures_per_address=per_address,
        trusted_proxy_count=envint(environ, "HYDRA_TRUSTED_PROXY_COUNT", 0, minimum=0),
    )


def web_task_memory_bytes(environ: Mapping[str, str]) -> int | None:
    """`HYDRA_WEB_TASK_MEMORY_MB`: the memory each of the web worker's task processes may take, so that a task
    that goes wrong fails alone (`webapp.background.task_limits`); unset, a quarter of the host's memory,
    which the web worker finds when it starts."""
    name = "HYDRA_WEB_TASK_MEMORY_MB"
    if not environ.get(name, "").strip():
        return None
    return envint(environ, name, WEB_TASK_MEMORY_MINIMUM_MB, minimum=WEB_TASK_MEMORY_MINIMUM_MB) << 20


def load(environ: Mapping[str, str]) -> Config:
    """Turn an environment mapping into a `Config`; raise ImproperlyConfigured on any bad value."""
    try:
        return _load(environ)
    except ConfigError as error:
        raise ImproperlyConfigured(str(error)) from None


def _load(environ: Mapping[str, str]) -> Config:
    debug = envbool(environ, "DEBUG", default=False)
    secret_key = environ.get("SECRET_KEY", "").strip()
    if not secret_key:
        if not debug:
            raise ConfigError("SECRET_KEY is not set; it is required unless DEBUG=1 (development only).")
        secret_key = DEV_SECRET_KEY
    elif len(secret_key) < 32 and not debug:
        raise ConfigError("SECRET_KEY is shorter than 32 characters; use a long random value.")
    worker = load_worker_config(environ)
    https, hsts_seconds = https_config(environ, debug)
    hosts, origins = allowed_hosts(environ, debug), envlist(environ, "CSRF_TRUSTED_ORIGINS", [])
    return Config(
        debug=debug,
        secret_key=secret_key,
        allowed_hosts=hosts,
        database=database_config(environ, worker.data_dir),
        data_dir=worker.data_dir,
        models_root=envpath(environ, "HYDRA_MODELS_ROOT", worker.data_dir / "models"),
        import_dir=envpath(environ, "HYDRA_IMPORT_DIR", worker.data_dir / "imports"),
        max_upload_bytes=envint(environ, "HYDRA_MAX_UPLOAD_MB", 50, minimum=1) * 1024 * 1024,
        max_decoded_bytes=envint(environ, "HYDRA_MAX_DECODED_MB", MAX_DECODED_MB_DEFAULT, minimum=1) << 20,
        web_task_memory_bytes=web_task_memory_bytes(environ),
        caps=caps_config(environ),
        csrf_trusted_origins=origins,
        https=https,
        hsts_seconds=hsts_seconds,
        telemetry_keep_days=telemetry_keep_days(environ),
        login_throttle=login_throttle(environ),
        api_rate_per_minute=envint(environ, "HYDRA_API_RATE_PER_MINUTE", 600, minimum=1),
        api_auth_failures_per_address=envint(environ, "HYDRA_API_AUTH_FAILURES_PER_ADDRESS", 50, minimum=1),
        notify=notify_config(environ, debug=debug, allowed_hosts=hosts, csrf_trusted_origins=origins),
        worker=worker,
    )
