"""Read Hydra's configuration from the environment, once, into typed values.

`load(environ)` is pure: settings.py calls it with ``os.environ`` and tests call it with a dict. Every bad
value raises ``ImproperlyConfigured`` naming the variable and what it accepts, so a misconfigured server
stops at start-up instead of failing later in a worker.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

DEV_SECRET_KEY = "hydra-dev-only-insecure-secret-key"
TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}
DEVICES_PATTERN = re.compile(r"^(auto|cpu:[1-9][0-9]*|cuda(:[0-9]+(,[0-9]+)*)?)$")
WORKER_DEVICE_PATTERN = re.compile(r"^(cpu:[0-9]+|cuda:[0-9]+)$")
HOST_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


@dataclass(frozen=True, kw_only=True)
class Config:
    debug: bool
    secret_key: str
    allowed_hosts: list[str]
    database: dict[str, object]
    redis_url: str
    data_dir: Path
    spill_dir: Path
    models_root: Path
    devices: str
    worker_device: str | None
    host_id: str
    max_upload_bytes: int
    csrf_trusted_origins: list[str]
    fault_oom_above_bytes: int | None = None


def envbool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off.")


def envint(environ: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is too small; it must be at least {minimum}.")
    return value


def envpath(environ: Mapping[str, str], name: str, default: Path) -> Path:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise ImproperlyConfigured(f"{name}={raw!r} must be an absolute path.")
    if path.exists() and not path.is_dir():
        raise ImproperlyConfigured(f"{name}={raw!r} exists and is not a directory.")
    return path


def envlist(environ: Mapping[str, str], name: str, default: list[str]) -> list[str]:
    raw = environ.get(name)
    if raw is None:
        return default
    items = [item.strip() for item in raw.split(",") if item.strip()]
    if not items:
        raise ImproperlyConfigured(f"{name}={raw!r} is empty; give a comma-separated list.")
    return items


def allowed_hosts(environ: Mapping[str, str], debug: bool) -> list[str]:
    if "ALLOWED_HOSTS" not in environ and not debug:
        raise ImproperlyConfigured("ALLOWED_HOSTS is not set; list the server's host names (comma-separated).")
    return envlist(environ, "ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])


def database_config(environ: Mapping[str, str], data_dir: Path) -> dict[str, object]:
    raw = environ.get("DATABASE_URL", "").strip()
    if not raw:
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": str(data_dir / "hydra.sqlite3")}
    scheme = urlparse(raw).scheme
    if scheme not in {"postgres", "postgresql", "sqlite"}:
        raise ImproperlyConfigured(
            f"DATABASE_URL has scheme {scheme!r}; use postgres://user@host:port/name or sqlite:////abs/path.db."
        )
    try:
        config = dict(dj_database_url.parse(raw, conn_max_age=60, conn_health_checks=True))
    except ValueError as error:
        raise ImproperlyConfigured(f"DATABASE_URL={raw!r} cannot be parsed: {error}") from None
    if not config.get("NAME"):
        raise ImproperlyConfigured(f"DATABASE_URL={raw!r} names no database.")
    return config


def redis_url(environ: Mapping[str, str]) -> str:
    raw = environ.get("REDIS_URL", "").strip() or "redis://127.0.0.1:6379/0"
    parsed = urlparse(raw)
    if parsed.scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured(f"REDIS_URL={raw!r} must start with redis://, rediss:// or unix://.")
    if parsed.scheme != "unix":
        try:
            parsed.port  # noqa: B018 -- raises ValueError on a bad port
        except ValueError:
            raise ImproperlyConfigured(f"REDIS_URL={raw!r} has a bad port.") from None
        if not parsed.hostname:
            raise ImproperlyConfigured(f"REDIS_URL={raw!r} names no host.")
    return raw


def default_spill_dir(data_dir: Path) -> Path:
    shm = Path("/dev/shm")
    return shm / "hydra" if shm.is_dir() else data_dir / "spill"


def load(environ: Mapping[str, str]) -> Config:
    """Turn an environment mapping into a `Config`; raise ImproperlyConfigured on any bad value."""
    debug = envbool(environ, "DEBUG", default=False)
    secret_key = environ.get("SECRET_KEY", "").strip()
    if not secret_key:
        if not debug:
            raise ImproperlyConfigured("SECRET_KEY is not set; it is required unless DEBUG=1 (development only).")
        secret_key = DEV_SECRET_KEY
    elif len(secret_key) < 32 and not debug:
        raise ImproperlyConfigured("SECRET_KEY is shorter than 32 characters; use a long random value.")

    data_dir = envpath(environ, "HYDRA_DATA_DIR", BASE_DIR / "var")
    devices = environ.get("HYDRA_DEVICES", "auto").strip() or "auto"
    if not DEVICES_PATTERN.match(devices):
        raise ImproperlyConfigured(
            f"HYDRA_DEVICES={devices!r} is not understood; use auto, cpu:N (N CPU devices), cuda (every GPU) "
            "or cuda:0,1 (those GPUs)."
        )
    worker_device = environ.get("HYDRA_WORKER_DEVICE", "").strip() or None
    if worker_device is not None and not WORKER_DEVICE_PATTERN.match(worker_device):
        raise ImproperlyConfigured(
            f"HYDRA_WORKER_DEVICE={worker_device!r} is not a device; use cpu:N or cuda:N."
        )
    host_id = environ.get("HYDRA_HOST_ID", "").strip() or socket.gethostname().split(".")[0] or "localhost"
    if not HOST_ID_PATTERN.match(host_id):
        raise ImproperlyConfigured(
            f"HYDRA_HOST_ID={host_id!r} must be 1-63 letters, digits, '.', '_' or '-'."
        )
    return Config(
        debug=debug,
        secret_key=secret_key,
        allowed_hosts=allowed_hosts(environ, debug),
        database=database_config(environ, data_dir),
        redis_url=redis_url(environ),
        data_dir=data_dir,
        spill_dir=envpath(environ, "HYDRA_SPILL_DIR", default_spill_dir(data_dir)),
        models_root=envpath(environ, "HYDRA_MODELS_ROOT", data_dir / "models"),
        devices=devices,
        worker_device=worker_device,
        host_id=host_id,
        max_upload_bytes=envint(environ, "HYDRA_MAX_UPLOAD_MB", 50, minimum=1) * 1024 * 1024,
        csrf_trusted_origins=envlist(environ, "CSRF_TRUSTED_ORIGINS", []),
        # Fault injection for testing out-of-memory recovery without a GPU (see TrialSession); unset in use.
        fault_oom_above_bytes=(envint(environ, "HYDRA_FAULT_OOM_ABOVE_BYTES", 0, minimum=1)
                               if environ.get("HYDRA_FAULT_OOM_ABOVE_BYTES", "").strip() else None),
    )
