"""The notifications' part of the web app's configuration, read from the environment by `webapp.config.load`.

- ``HYDRA_WEBHOOK_ALLOWED_HOSTS``: host names and IP networks webhooks may reach, on the scheme's default port
  or the one an entry names (``localhost:8080``, ``[::1]:8080``; `webapp.allowlist`); empty (the default)
  allows none.
- ``HYDRA_NOTIFY_RETRY_SECONDS``: the waits before each retry of a delivery that failed, comma-separated (10 s,
  1 min, 5 min, 30 min, 2 h by default: six tries in all).
- ``HYDRA_PUBLIC_URL``: the site's address, for the experiment links notifications carry (default: the first
  of ``CSRF_TRUSTED_ORIGINS``, else ``http://127.0.0.1:8000`` in development, else ``https://`` and the
  first of ``ALLOWED_HOSTS``).
- ``EMAIL_BACKEND`` (``console``, ``smtp`` or a dotted path; ``console`` by default in development, ``smtp``
  otherwise), ``EMAIL_HOST``, ``EMAIL_PORT``, ``EMAIL_HOST_USER``, ``EMAIL_HOST_PASSWORD``, ``EMAIL_USE_TLS``,
  ``EMAIL_USE_SSL`` and ``DEFAULT_FROM_EMAIL``: Django's e-mail settings.

Pure: a bad value raises ConfigError naming the variable, which `webapp.config.load` turns into its start-up
error. Booleans and numbers are read as every other setting is (`worker.config.envbool`, `envint`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from webapp.allowlist import Allowlist, allowlist_parse
from webapp.worker_door import ConfigError, envbool, envint

RETRY_SECONDS_DEFAULT = (10.0, 60.0, 300.0, 1800.0, 7200.0)
MAX_RETRIES = 20
EMAIL_BACKENDS = {
    "console": "django.core.mail.backends.console.EmailBackend",
    "smtp": "django.core.mail.backends.smtp.EmailBackend",
}


@dataclass(frozen=True, kw_only=True)
class Email:
    backend: str
    host: str = "localhost"
    port: int = 25
    user: str = ""
    password: str = field(default="", repr=False)
    use_tls: bool = False
    use_ssl: bool = False
    from_address: str = "hydra@localhost"


@dataclass(frozen=True, kw_only=True)
class NotifyConfig:
    webhook_allowlist: Allowlist
    retry_s: tuple[float, ...]
    public_url: str
    email: Email


def notify_config(environ: Mapping[str, str], *, debug: bool, allowed_hosts: list[str],
                  csrf_trusted_origins: list[str]) -> NotifyConfig:
    return NotifyConfig(
        webhook_allowlist=webhook_allowlist(environ),
        retry_s=retry_seconds(environ),
        public_url=public_url(environ, debug=debug, allowed_hosts=allowed_hosts,
                              csrf_trusted_origins=csrf_trusted_origins),
        email=email_config(environ, debug=debug),
    )


def webhook_allowlist(environ: Mapping[str, str]) -> Allowlist:
    name = "HYDRA_WEBHOOK_ALLOWED_HOSTS"
    try:
        return allowlist_parse(environ.get(name, ""))
    except ValueError as error:
        raise ConfigError(f"{name}: {error}; give host names and IP networks, comma-separated, each with an "
                         "optional :port (e.g. hooks.example.org,10.0.0.0/8,localhost:8080,[::1]:8080).") from None


def retry_seconds(environ: Mapping[str, str]) -> tuple[float, ...]:
    name = "HYDRA_NOTIFY_RETRY_SECONDS"
    raw = environ.get(name, "").strip()
    if not raw:
        return RETRY_SECONDS_DEFAULT
    if raw.lower() in {"0", "off", "none"}:
        return ()
    try:
        waits = tuple(float(item) for item in raw.split(","))
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a comma-separated list of seconds (e.g. 10,60,300).") from None
    if len(waits) > MAX_RETRIES or any(not math.isfinite(wait) or wait < 0 for wait in waits):
        raise ConfigError(f"{name}={raw!r}: give at most {MAX_RETRIES} waits, each 0 s or more.")
    return waits


def public_url(environ: Mapping[str, str], *, debug: bool, allowed_hosts: list[str],
               csrf_trusted_origins: list[str]) -> str:
    name = "HYDRA_PUBLIC_URL"
    raw = environ.get(name, "").strip()
    if raw:
        try:
            parts = urlsplit(raw)
        except ValueError:  # an unclosed IPv6 bracket
            parts = None
        if parts is None or parts.scheme not in {"http", "https"} or not parts.netloc:
            raise ConfigError(f"{name}={raw!r} must be an http:// or https:// address, e.g. https://hydra.lab.org.")
        return raw.rstrip("/")
    if csrf_trusted_origins:
        return csrf_trusted_origins[0].rstrip("/")
    if debug:
        return "http://127.0.0.1:8000"
    host = next((h for h in allowed_hosts if h not in {"*", "localhost", "127.0.0.1"}), allowed_hosts[0])
    return f"https://{host.lstrip('.')}"


def email_config(environ: Mapping[str, str], *, debug: bool) -> Email:
    raw = environ.get("EMAIL_BACKEND", "").strip() or ("console" if debug else "smtp")
    backend = EMAIL_BACKENDS.get(raw.lower(), raw)
    if "." not in backend:
        raise ConfigError(f"EMAIL_BACKEND={raw!r}: use console, smtp or a dotted path to an e-mail backend.")
    use_tls = envbool(environ, "EMAIL_USE_TLS", default=False)
    use_ssl = envbool(environ, "EMAIL_USE_SSL", default=False)
    if use_tls and use_ssl:
        raise ConfigError("EMAIL_USE_TLS and EMAIL_USE_SSL are both on; choose one (STARTTLS or implicit TLS).")
    port = envint(environ, "EMAIL_PORT", 465 if use_ssl else (587 if use_tls else 25), minimum=1)
    if port > 65535:
        raise ConfigError(f"EMAIL_PORT={port} is not a port number.")
    return Email(
        backend=backend, host=environ.get("EMAIL_HOST", "").strip() or "localhost", port=port,
        user=environ.get("EMAIL_HOST_USER", ""), password=environ.get("EMAIL_HOST_PASSWORD", ""),
        use_tls=use_tls, use_ssl=use_ssl,
        from_address=environ.get("DEFAULT_FROM_EMAIL", "").strip() or "hydra@localhost",
    )

