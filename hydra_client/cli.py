"""``hydra``: a Hydra server from the shell. Log in once with a personal access token, then upload datasets,
create and launch experiments, watch their trials train, control trials and download their models.

Every command takes ``--json``: it then prints one JSON document on stdout (the API's answer, or the
command's result), and nothing else there; nothing at all when the command fails (``watch`` prints its
document also when a trial failed). Messages, progress bars and errors go to stderr; an error prints the
server's ``detail`` and its field errors, never a traceback.

Exit codes, for scripts:

    0  done
    1  the server refused the request (a 4xx other than those below: bad input, not ready, too large,
       throttled), work it did failed (a dataset, a download), or a watched trial failed or was cancelled
    2  the command itself was wrong (an unknown option, a missing argument: click's usage errors)
    3  not authenticated or not allowed: no login, or the token is unknown, revoked or expired (401), or the
       token or your role may not do this (403)
    4  not found: no such object, or it belongs to another team (404)
    5  the server is out of reach, or it failed (5xx, or 503: its scheduler is down)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import click

from hydra_client import config as settings
from hydra_client.client import Hydra
from hydra_client.commands.common import EXIT_CODES_HELP, HydraGroup, client, emit, json_option, when
from hydra_client.commands.datasets import datasets, models
from hydra_client.commands.experiments import experiments, watch
from hydra_client.commands.trials import download, leaderboard, queue, trials
from hydra_client.connection import api_base, sends_in_clear


@click.group(cls=HydraGroup, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--team", type=int, metavar="ID",
              help="Act in this team (default: HYDRA_TEAM, the team saved by login, else your current team).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout (any command takes it).")
@click.pass_context
def cli(ctx: click.Context, team: int | None, as_json: bool) -> None:
    """Hydra from the shell: datasets, experiments, trials and their models, with a personal access token.

    Start with: hydra login https://your-hydra-server (make the token on the server's page /account/tokens/).
    """
    ctx.ensure_object(dict)
    ctx.obj.update(team=team, json=as_json)


def read_token() -> str:
    """The token from a hidden prompt on a terminal, else the first line of stdin."""
    if sys.stdin.isatty():
        return click.prompt("Token", hide_input=True)
    return sys.stdin.readline()


@cli.command()
@click.argument("url")
@click.option("--token", help="The token (hyd_…); default: a hidden prompt, or the first line of stdin.")
@click.option("--team", "team", type=int, metavar="ID", help="Save this team to act in (default: your current team).")
@click.option("--insecure", is_flag=True,
              help="Log in over plain http:// to another machine all the same: the token then crosses the network "
                   "in clear, readable by anyone on the way.")
@json_option
def login(url: str, token: str | None, team: int | None, insecure: bool) -> None:
    """Check a personal access token with the server at URL and save both.

    Make the token on the server's page URL/account/tokens/. They are saved to $HYDRA_CONFIG or
    ~/.config/hydra/config.json, readable by you only. A plain http:// URL is refused unless it is this machine
    (localhost), or --insecure is given: use the server's https:// address.
    """
    try:
        url = api_base(url)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="URL") from None
    if sends_in_clear(url):
        click.echo(f"Warning: {url} is plain HTTP to another machine: the token would cross the network in clear, "
                   "readable by anyone on the way. Use the server's https:// address.", err=True)
        if not insecure:
            raise click.BadParameter("refusing to send the token in clear; give an https:// URL, or --insecure "
                                     "if you accept that risk on this network.", param_hint="URL")
    secret = (token if token is not None else read_token()).strip()
    if not secret:
        raise click.UsageError(f"No token given: make one at {url}/account/tokens/ and paste it.")
    team = team or click.get_current_context().find_root().obj.get("team")
    try:
        hydra = Hydra(url, secret, team=team)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--token") from None
    with hydra:
        me = hydra.me()
    path = settings.save(settings.Config(url=url, token=secret, team=str(team or "")))
    emit({"url": url, "config": str(path), "me": me},
         lambda: f"Logged in to {url} as {me['username']}{_in_team(me)}; saved to {path}.")


def _in_team(me: Mapping[str, Any]) -> str:
    team = me.get("team")
    return f" in team {team['name']} (id {team['id']}, {team['role']})" if team else " (no team chosen)"


@cli.command()
@json_option
def whoami() -> None:
    """Who the token acts as, in which team, and its scope and expiry."""
    me = client().me()

    def text() -> str:
        teams = ", ".join(f"{t['name']} (id {t['id']}, {t['role']})" for t in me["teams"]) or "none"
        return (f"{me['username']} at {client().url}{_in_team(me)}\n"
                f"teams: {teams}\n"
                f"token: {me['token']} ({me['scope']}), expires {when(me['token_expires'])}")

    emit(me, text)


for command in (datasets, models, experiments, watch, trials, download, queue, leaderboard):
    cli.add_command(command)


def main() -> None:
    """The ``hydra`` script."""
    cli(prog_name="hydra")


if __name__ == "__main__":
    main()
