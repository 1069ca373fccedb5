"""The workers' configuration, read from the environment once into a typed object.

`load(environ)` is pure: tests call it with a dict; `current()` reads ``os.environ`` the first time it is
asked. A GPU server runs workers from this alone, without the web app or its settings; the web app composes
the same object into its own settings (`webapp.config`). Every bad value raises `ConfigError` naming the
variable and what it accepts, so a misconfigured worker stops at start-up instead of failing in a unit.

The ``env*`` readers are the one way this project parses an environment variable; the web app uses them
for its own variables too.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from worker.engine.faults import Fault

BASE_DIR = Path(__file__).resolve().parent.parent
TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}
DEVICES_PATTERN = re.compile(r"^(auto|cpu:[1-9][0-9]*|cuda(:[0-9]+(,[0-9]+)*)?)$")
WORKER_DEVICE_PATTERN = re.compile(r"^(cpu:[0-9]+|cuda:[0-9]+)$")
HOST_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ConfigError(ValueError):
    """An environment variable has a value Hydra cannot use; the message names it."""


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """What a device worker (and the web app, to reach the workers) needs to know.

    `redis_url`: broker, shard queue and telemetry. `host_id` namespaces this host's queue keys in a shared
    Redis. `data_dir` holds exported models (``exports/<trial>``) and the trials' durable checkpoints
    (``checkpoints/<trial>``). `spill_dir` is the spill store.
    `devices` is ``HYDRA_DEVICES`` as given; `worker_device` the one device this process is bound to
    (``cpu:N``/``cuda:N``, set by the launcher), or None. `fault_oom_above_bytes` is fault injection for
    testing out-of-memory recovery (units of shards planned above it fail as if the device were that small).
    `fault` is fault injection at a named point of a unit (``HYDRA_FAULT``, see `worker.engine.faults`).
    `spill_capacity_bytes` (``HYDRA_SPILL_CAPACITY_BYTES``) is what the trials' spill stores may take of the
    spill directory's file system (0: no limit); None: 90% of that file system's size, read when a device
    worker starts (`spill_capacity`).
    """

    redis_url: str
    host_id: str
    data_dir: Path
    spill_dir: Path
    devices: str
    worker_device: str | None
    fault_oom_above_bytes: int | None = None
    fault: Fault | None = None
    spill_capacity_bytes: int | None = None


def envbool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off.")


def envint(environ: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer.") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} is too small; it must be at least {minimum}.")
    return value


def envpath(environ: Mapping[str, str], name: str, default: Path) -> Path:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise ConfigError(f"{name}={raw!r} must be an absolute path.")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{name}={raw!r} exists and is not a directory.")
    return path


def envlist(environ: Mapping[str, str], name: str, default: list[str]) -> list[str]:
    raw = environ.get(name)
    if raw is None:
        return default
    items = [item.strip() for item in raw.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"{name}={raw!r} is empty; give a comma-separated list.")
    return items


def redis_url(environ: Mapping[str, str]) -> str:
    raw = environ.get("REDIS_URL", "").strip() or "redis://127.0.0.1:6379/0"
    parsed = urlparse(raw)
    if parsed.scheme not in {"redis", "rediss", "unix"}:
        raise ConfigError(f"REDIS_URL={raw!r} must start with redis://, rediss:// or unix://.")
    if parsed.scheme != "unix":
        try:
            parsed.port  # noqa: B018 -- raises ValueError on a bad port
        except ValueError:
            raise ConfigError(f"REDIS_URL={raw!r} has a bad port.") from None
        if not parsed.hostname:
            raise ConfigError(f"REDIS_URL={raw!r} names no host.")
    return raw


def data_dir(environ: Mapping[str, str]) -> Path:
    """``HYDRA_DATA_DIR``, else ``var/`` in the checkout."""
    return envpath(environ, "HYDRA_DATA_DIR", BASE_DIR / "var")


def default_spill_dir(data: Path) -> Path:
    shm = Path("/dev/shm")
    return shm / "hydra" if shm.is_dir() else data / "spill"


def fault(environ: Mapping[str, str]) -> Fault | None:
    """``HYDRA_FAULT=<point>[:<action>][@<unit>]`` with ``HYDRA_FAULT_DIR`` (where it reports), else None."""
    raw = environ.get("HYDRA_FAULT", "").strip()
    if not raw:
        return None
    if not environ.get("HYDRA_FAULT_DIR", "").strip():
        raise ConfigError("HYDRA_FAULT is set but HYDRA_FAULT_DIR is not; give the directory it reports in.")
    try:
        return Fault.parse(raw, signal_dir=envpath(environ, "HYDRA_FAULT_DIR", Path()))
    except ValueError as error:
        raise ConfigError(f"HYDRA_FAULT={raw!r}: {error}") from None


def load(environ: Mapping[str, str]) -> WorkerConfig:
    """Turn an environment mapping into a `WorkerConfig`; raise ConfigError on any bad value."""
    data = data_dir(environ)
    devices = environ.get("HYDRA_DEVICES", "auto").strip() or "auto"
    if not DEVICES_PATTERN.match(devices):
        raise ConfigError(
            f"HYDRA_DEVICES={devices!r} is not understood; use auto, cpu:N (N CPU devices), cuda (every GPU) "
            "or cuda:0,1 (those GPUs)."
        )
    worker_device = environ.get("HYDRA_WORKER_DEVICE", "").strip() or None
    if worker_device is not None and not WORKER_DEVICE_PATTERN.match(worker_device):
        raise ConfigError(f"HYDRA_WORKER_DEVICE={worker_device!r} is not a device; use cpu:N or cuda:N.")
    host_id = environ.get("HYDRA_HOST_ID", "").strip() or socket.gethostname().split(".")[0] or "localhost"
    if not HOST_ID_PATTERN.match(host_id):
        raise ConfigError(f"HYDRA_HOST_ID={host_id!r} must be 1-63 letters, digits, '.', '_' or '-'.")
    return WorkerConfig(
        redis_url=redis_url(environ),
        host_id=host_id,
        data_dir=data,
        spill_dir=envpath(environ, "HYDRA_SPILL_DIR", default_spill_dir(data)),
        devices=devices,
        worker_device=worker_device,
        fault_oom_above_bytes=(envint(environ, "HYDRA_FAULT_OOM_ABOVE_BYTES", 0, minimum=1)
                               if environ.get("HYDRA_FAULT_OOM_ABOVE_BYTES", "").strip() else None),
        fault=fault(environ),
        spill_capacity_bytes=(envint(environ, "HYDRA_SPILL_CAPACITY_BYTES", 0, minimum=0)
                              if environ.get("HYDRA_SPILL_CAPACITY_BYTES", "").strip() else None),
    )


SPILL_CAPACITY_SHARE = 0.9  # of the spill directory's file system, when no capacity is configured


def spill_capacity(config: WorkerConfig) -> int:
    """The bytes trials' spill stores may take on this host (0: no limit): the configured figure, else 90% of
    the size of the file system that holds the spill directory (its nearest existing parent)."""
    if config.spill_capacity_bytes is not None:
        return config.spill_capacity_bytes
    path = config.spill_dir
    while not path.exists() and path != path.parent:
        path = path.parent
    return int(shutil.disk_usage(path).total * SPILL_CAPACITY_SHARE)


@functools.cache
def current() -> WorkerConfig:
    """This process's configuration, read from ``os.environ`` on first use."""
    return load(os.environ)
