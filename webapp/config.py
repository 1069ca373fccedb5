"""Read the web app's configuration from the environment, once, into typed values.

`load(environ)` is pure: settings.py calls it with ``os.environ`` and tests call it with a dict. The
workers' part (Redis, host id, spill and data directories, devices) is `worker.config.WorkerConfig`, read by
the same code the workers use and kept as ``Config.worker``. Every bad value raises ``ImproperlyConfigured``
naming the variable and what it accepts, so a misconfigured server stops at start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from worker import config as worker_config
from worker.config import BASE_DIR, ConfigError, envbool, envint, envlist, envpath

__all__ = ["BASE_DIR", "Config", "load"]

DEV_SECRET_KEY = "hydra-dev-only-insecure-secret-key"


@dataclass(frozen=True, kw_only=True)
class Config:
    debug: bool
    secret_key: str
    allowed_hosts: list[str]
    database: dict[str, object]
    data_dir: Path
    models_root: Path
    max_upload_bytes: int
    csrf_trusted_origins: list[str]
    worker: worker_config.WorkerConfig


def allowed_hosts(environ: Mapping[str, str], debug: bool) -> list[str]:
    if "ALLOWED_HOSTS" not in environ and not debug:
        raise ConfigError("ALLOWED_HOSTS is not set; list the server's host names (comma-separated).")
    return envlist(environ, "ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])


def database_config(environ: Mapping[str, str], data_dir: Path) -> dict[str, object]:
    raw = environ.get("DATABASE_URL", "").strip()
    if not raw:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(data_dir / "hydra.sqlite3")}
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
    return config


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
    worker = worker_config.load(environ)
    return Config(
        debug=debug,
        secret_key=secret_key,
        allowed_hosts=allowed_hosts(environ, debug),
        database=database_config(environ, worker.data_dir),
        data_dir=worker.data_dir,
        models_root=envpath(environ, "HYDRA_MODELS_ROOT", worker.data_dir / "models"),
        max_upload_bytes=envint(environ, "HYDRA_MAX_UPLOAD_MB", 50, minimum=1) * 1024 * 1024,
        csrf_trusted_origins=envlist(environ, "CSRF_TRUSTED_ORIGINS", []),
        worker=worker,
    )
