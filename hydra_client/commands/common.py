"""What every ``hydra`` command shares: the exit codes, the group that turns the client's errors into them,
``--json`` and the output helpers, and the API client the config and environment give. The command modules and the
root group in `hydra_client.cli` all build on it, so it imports none of them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from hydra_client import config as settings
from hydra_client.client import Hydra
from hydra_client.connection import HydraError, HydraUnreachable
from hydra_client.render import document

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_AUTH, EXIT_NOT_FOUND, EXIT_SERVER = 0, 1, 2, 3, 4, 5
EXIT_CODES_HELP = """\b
Exit codes:
  0  done
  1  the server refused the request (other 4xx), its work failed, or a watched trial failed or was cancelled
  2  usage error (unknown option, missing argument)
  3  not authenticated or not allowed (no login, 401, 403)
  4  not found, or another team's (404)
  5  server unreachable or failing (5xx, 503)"""


class NotLoggedIn(HydraError):
    def __init__(self) -> None:
        super().__init__(401, "Not logged in: run hydra login URL (or set HYDRA_URL and HYDRA_TOKEN).")


def exit_code(error: HydraError) -> int:
    """The exit code of a failed call (see `hydra_client.cli`'s docstring)."""
    if isinstance(error, HydraUnreachable):
        return EXIT_SERVER
    if error.status in (401, 403):
        return EXIT_AUTH
    if error.status == 404:
        return EXIT_NOT_FOUND
    if error.status is not None and error.status >= 500:
        return EXIT_SERVER
    return EXIT_REFUSED


def report(error: HydraError) -> None:
    """The error on stderr: the server's detail, its field errors, and when a 429 may be tried again."""
    text = error.describe()
    if error.status == 429 and error.retry_after is not None:
        text += f"\n  (try again in {error.retry_after:g} s)"
    click.echo(f"Error: {text}", err=True)


class HydraGroup(click.Group):
    """Turns the client's errors into a message on stderr and the documented exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HydraError as error:
            report(error)
            ctx.exit(exit_code(error))
        except settings.ConfigError as error:
            click.echo(f"Error: {error}", err=True)
            ctx.exit(EXIT_AUTH)
        except OSError as error:  # a local file: the space to read, the folder to download into
            click.echo(f"Error: {error}", err=True)
            ctx.exit(EXIT_REFUSED)


def json_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--json`` on a command: its output becomes one JSON document on stdout."""

    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
    @click.pass_context
    @functools.wraps(command)
    def wrapper(ctx: click.Context, *args: Any, as_json: bool, **kwargs: Any) -> Any:
        root = ctx.find_root()
        root.obj["json"] = root.obj.get("json") or as_json
        return command(*args, **kwargs)

    return wrapper


def wants_json() -> bool:
    return bool(click.get_current_context().find_root().obj.get("json"))


def emit(data: Any, text: str | Callable[[], str]) -> None:
    """The command's result: `data` as JSON with ``--json``, else `text` (or what it makes)."""
    click.echo(document(data) if wants_json() else (text() if callable(text) else text))


def note(text: str) -> None:
    """A message for the person at the terminal (stderr), never mixed into the result."""
    click.echo(text, err=True)


def client() -> Hydra:
    """The API as the config and environment (and ``--team``) say; `NotLoggedIn` without a server or token."""
    root = click.get_current_context().find_root()
    if "client" not in root.obj:
        found = settings.load()
        if not found.url or not found.token:
            raise NotLoggedIn()
        try:
            hydra = Hydra(found.url, found.token, team=root.obj.get("team") or found.team or None)
        except ValueError as error:
            raise click.UsageError(f"{error} (from HYDRA_URL, HYDRA_TOKEN, HYDRA_TEAM or {settings.config_path()})"
                                   ) from None
        root.obj["client"] = hydra
        root.call_on_close(hydra.close)
    return root.obj["client"]


def when(value: str | None) -> str:
    """An ISO time from the API as ``YYYY-MM-DD HH:MM``."""
    return value[:16].replace("T", " ") if value else "-"


