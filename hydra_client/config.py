"""Where the command line finds its server and token: a JSON file that only its owner may read, and the
environment, which overrides it.

The file is ``$HYDRA_CONFIG``, else ``~/.config/hydra/config.json`` (under ``$XDG_CONFIG_HOME`` when set):
``{"url": ..., "token": ..., "team": ...}``, written by ``hydra login`` with mode 0600 in a folder of mode
0700, since the token acts as its owner. ``HYDRA_URL``, ``HYDRA_TOKEN`` and ``HYDRA_TEAM`` override its
entries one by one (a CI job needs no file at all).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

ENV_FILE = "HYDRA_CONFIG"
ENV_URL, ENV_TOKEN, ENV_TEAM = "HYDRA_URL", "HYDRA_TOKEN", "HYDRA_TEAM"


@dataclass(frozen=True)
class Config:
    url: str = ""
    token: str = ""
    team: str = ""  # a team id, or empty: the token owner's current team


class ConfigError(Exception):
    """The config file exists but cannot be read as one."""


def config_path(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get(ENV_FILE):
        return Path(environ[ENV_FILE]).expanduser()
    base = Path(environ["XDG_CONFIG_HOME"]) if environ.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "hydra" / "config.json"


def read_file(path: Path) -> Config:
    """The file's settings; empty ones when there is no file."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Config()
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} is not a readable Hydra config ({error}); run hydra login again.") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} is not a Hydra config (not a JSON object); run hydra login again.")
    return Config(url=str(raw.get("url") or ""), token=str(raw.get("token") or ""), team=str(raw.get("team") or ""))


def load(environ: Mapping[str, str] = os.environ) -> Config:
    """The file's settings, each overridden by its environment variable when that is set and not empty."""
    found = read_file(config_path(environ))
    return Config(url=environ.get(ENV_URL) or found.url, token=environ.get(ENV_TOKEN) or found.token,
                  team=environ.get(ENV_TEAM) or found.team)


def save(config: Config, environ: Mapping[str, str] = os.environ) -> Path:
    """Write `config` where `load` reads it, readable by its owner only (mode 0600, also when the file existed
    with a wider mode), replacing the old file in one step."""
    path = config_path(environ)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            if hasattr(os, "fchmod"):  # a file left by an earlier try keeps its mode otherwise
                os.fchmod(handle.fileno(), 0o600)
            json.dump(asdict(config), handle, indent=2)
            handle.write("\n")
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return path
