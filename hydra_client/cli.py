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

import functools
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from hydra_client import config as settings
from hydra_client.client import Hydra, HydraError, HydraUnreachable, api_base, sends_in_clear
from hydra_client.render import document, duration, number, params, size, table
from hydra_client.watch import Display, Watch, succeeded

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_AUTH, EXIT_NOT_FOUND, EXIT_SERVER = 0, 1, 2, 3, 4, 5
EXIT_CODES_HELP = """\b
Exit codes:
  0  done
  1  the server refused the request (other 4xx), its work failed, or a watched trial failed or was cancelled
  2  usage error (unknown option, missing argument)
  3  not authenticated or not allowed (no login, 401, 403)
  4  not found, or another team's (404)
  5  server unreachable or failing (5xx, 503)"""

# `experiments create` options and `clone --set` keys, by the API's field names.
EXPERIMENT_FIELDS = ("name", "dataset", "space", "strategy", "n_trials", "budget_unit", "budget", "eval_every",
                     "seed", "memory_budget_mib", "early_stop_patience", "priority", "holdout_bytes",
                     "chat_template", "objective", "launch")
TEXT_FIELDS = frozenset({"name", "space", "strategy", "budget_unit", "priority", "chat_template", "objective"})
FIELD_ALIASES = {"trials": "n_trials", "memory_mib": "memory_budget_mib", "patience": "early_stop_patience"}


class NotLoggedIn(HydraError):
    def __init__(self) -> None:
        super().__init__(401, "Not logged in: run hydra login URL (or set HYDRA_URL and HYDRA_TOKEN).")


def exit_code(error: HydraError) -> int:
    """The exit code of a failed call (see the module's docstring)."""
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


# Datasets ------------------------------------------------------------------------------------------------------

DATASET_COLUMNS = [("id", "ID"), ("name", "NAME"), ("kind", "KIND"), ("status", "STATUS"),
                   ("n_tokens", "TOKENS"), ("n_examples", "EXAMPLES"), ("vocab_size", "VOCAB"),
                   ("created", "CREATED")]


def _dataset_rows(datasets: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{**d, "created": when(d["created"])} for d in datasets]


def _dataset_line(dataset: Mapping[str, Any]) -> str:
    line = f"Dataset {dataset['id']} {dataset['name']!r}: {dataset['status']}"
    if dataset["status"] == "ready":
        line += (f", {dataset['n_examples']} examples" if dataset["n_examples"] else
                 f", {dataset['n_tokens']} tokens")
    return line + (f" ({dataset['message']})" if dataset.get("message") else "")


@cli.group(cls=HydraGroup)
def datasets() -> None:
    """The team's datasets: list, upload a file, or take the server's sample."""


@datasets.command("list")
@click.option("--status", type=click.Choice(["tokenizing", "ready", "failed"]), help="Only datasets in this state.")
@json_option
def datasets_list(status: str | None) -> None:
    """Every dataset of the team, newest first."""
    found = client().datasets.list(status=status)
    emit(found, lambda: table(_dataset_rows(found), DATASET_COLUMNS))


@datasets.command("show")
@click.argument("dataset", metavar="DATASET")
@json_option
def datasets_show(dataset: str) -> None:
    """One dataset, by id or name."""
    found = client().datasets.find(dataset)
    emit(found, lambda: _dataset_line(found))


def _created(dataset: dict[str, Any], wait: bool) -> None:
    """Report a new dataset; with `wait`, once its tokenizer is trained (exit 1 when that fails)."""
    if wait and dataset["status"] == "tokenizing":
        note(f"Dataset {dataset['id']} {dataset['name']!r}: training its tokenizer…")
        dataset = client().datasets.wait(dataset["id"])
    emit(dataset, lambda: _dataset_line(dataset))


def dataset_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The tokenizer's options and ``--wait``, shared by upload and sample."""
    for option in reversed([
        click.option("--name", default="", help="The dataset's name (default: the file's or the sample's)."),
        click.option("--vocab-size", type=int, default=2048, show_default=True,
                     help="Tokenizer vocabulary size (byte-level BPE)."),
        click.option("--val-fraction", type=float, default=0.1, show_default=True,
                     help="Fraction held out for validation."),
        click.option("--wait", is_flag=True, help="Wait until the tokenizer is trained (exit 1 if it fails)."),
    ]):
        command = option(command)
    return command


@datasets.command("upload")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--kind", default="", help="Instruction data only: text, prompt_completion, alpaca, messages or "
                                         "preference (default: detect from the columns).")
@click.option("--column", "columns", multiple=True, metavar="ROLE=COLUMN",
              help="Instruction data only: the column of a role whose column has another name (repeat for each).")
@dataset_options
@json_option
def datasets_upload(file: Path, kind: str, columns: tuple[str, ...], name: str, vocab_size: int, val_fraction: float,
                    wait: bool) -> None:
    """Upload FILE: a UTF-8 text corpus, or instruction, chat or preference data (.jsonl, .json, .csv,
    .parquet)."""
    mapping = {}
    for pair in columns:
        role, equals, column = pair.partition("=")
        if not equals or not role.strip() or not column.strip():
            raise click.BadParameter(f"{pair!r} is not ROLE=COLUMN, e.g. prompt=question", param_hint="--column")
        mapping[role.strip()] = column.strip()
    note(f"Uploading {file.name} ({size(file.stat().st_size)})…")
    dataset = client().datasets.upload(file, name=name, kind=kind, vocab_size=vocab_size, val_fraction=val_fraction,
                                       columns=mapping)
    _created(dataset, wait)


@datasets.command("sample")
@click.option("--chat", is_flag=True, help="The sample chat data instead of the sample text corpus.")
@click.option("--pairs", is_flag=True, help="The sample preference pairs (for DPO) instead of the text corpus.")
@dataset_options
@json_option
def datasets_sample(chat: bool, pairs: bool, name: str, vocab_size: int, val_fraction: float, wait: bool) -> None:
    """Make a dataset of the server's built-in sample (a text corpus, with --chat chat data, with --pairs
    preference pairs)."""
    if chat and pairs:
        raise click.UsageError("Give --chat or --pairs, not both.")
    dataset = client().datasets.sample(chat=chat, pairs=pairs, name=name, vocab_size=vocab_size,
                                       val_fraction=val_fraction)
    _created(dataset, wait)


# Models --------------------------------------------------------------------------------------------------------

@cli.group(cls=HydraGroup)
def models() -> None:
    """The server's model catalog."""


@models.command("list")
@json_option
def models_list() -> None:
    """The catalog's checkpoints."""
    found = client().models.list()
    emit(found, lambda: table(found, [("id", "ID"), ("name", "NAME"), ("family", "FAMILY"), ("status", "STATUS"),
                                      ("n_params", "PARAMS"), ("context_length", "CONTEXT")]))


# Experiments ---------------------------------------------------------------------------------------------------

def _experiment_line(experiment: Mapping[str, Any]) -> str:
    counts = experiment["trials"]
    objective = ""
    if experiment.get("objective") == "dpo":
        searched = [f"{name} {_dimension(experiment.get(name))}" for name in ("dpo_beta", "dpo_loss_type")]
        objective = f" (DPO: {', '.join(searched)})"
    return (f"Experiment {experiment['id']} {experiment['name']!r} on {experiment['dataset_name']}{objective}: "
            f"{experiment['status']}, {counts['total']} trial(s) ({counts['finished']} finished, "
            f"{counts['active']} active, {counts['failed']} failed, {counts['new']} not launched)")


def _dimension(dimension: Mapping[str, Any] | None) -> str:
    """A searched parameter in a few characters: its values, or its range."""
    if not dimension:
        return "?"
    if dimension.get("kind") == "categorical":
        return "/".join(str(value) for value in dimension.get("values", []))
    return f"{dimension.get('low')}..{dimension.get('high')}{' (log)' if dimension.get('kind') == 'logfloat' else ''}"


TRIAL_COLUMNS = [("id", "ID"), ("number", "#"), ("status", "STATUS"), ("progress", "STEP"), ("params", "PARAMS"),
                 ("final_bpb", "VAL BPB"), ("best_val_loss", "BEST VAL LOSS"), ("eta", "ETA")]
# A DPO experiment's trials: the final evaluation's DPO loss, preference accuracy, reward margin and the chosen
# answers' bits per byte.
DPO_TRIAL_COLUMNS = [("id", "ID"), ("number", "#"), ("status", "STATUS"), ("progress", "STEP"), ("params", "PARAMS"),
                     ("final_loss", "DPO LOSS"), ("final_reward_accuracy", "PREF ACC"),
                     ("final_reward_margin", "MARGIN"), ("final_bpb", "CHOSEN BPB"), ("eta", "ETA")]


def _trial_rows(trials: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{**t, "progress": f"{t['step']}/{t['total_steps']}",
             "eta": duration(t.get("remaining_s")) if t["status"] == "running" else None} for t in trials]


@cli.group(cls=HydraGroup)
def experiments() -> None:
    """The team's experiments: create from a search space, launch, list, clone, cancel."""


@experiments.command("list")
@click.option("-q", "--search", "q", default="", help="Words of the name, or tag:x terms.")
@click.option("--tag", default="", help="Only experiments with this tag.")
@click.option("--dataset", default="", help="Only experiments on this dataset (id).")
@click.option("--model", default="", help="Only experiments of this model.")
@click.option("--status", default="", help="Only experiments in this state.")
@click.option("--sort", default="newest", show_default=True, help="newest, oldest, name or best.")
@json_option
def experiments_list(**filters: str) -> None:
    """The team's experiments, filtered and sorted as on the experiments page."""
    found = client().experiments.list(**filters)
    rows = [{**e, "counts": f"{e['trials']['finished']}/{e['trials']['total']}", "created": when(e["created"])}
            for e in found]
    emit(found, lambda: table(rows, [("id", "ID"), ("name", "NAME"), ("status", "STATUS"),
                                     ("dataset_name", "DATASET"), ("counts", "FINISHED"), ("created", "CREATED")]))


@experiments.command("show")
@click.argument("experiment_id", type=int, metavar="EXPERIMENT")
@json_option
def experiments_show(experiment_id: int) -> None:
    """One experiment and its trials."""
    hydra = client()
    experiment = hydra.experiments.get(experiment_id)
    trials = hydra.experiments.trials(experiment_id)
    columns = DPO_TRIAL_COLUMNS if experiment.get("objective") == "dpo" else TRIAL_COLUMNS
    emit({**experiment, "trial_list": trials},
         lambda: _experiment_line(experiment) + "\n" + table(_trial_rows(trials), columns))


@experiments.command("space")
@click.argument("experiment_id", type=int, metavar="EXPERIMENT")
@json_option
def experiments_space(experiment_id: int) -> None:
    """The experiment's search space with its model, as JSON (valid YAML too): the SPACE file create takes."""
    click.echo(document(client().experiments.space(experiment_id)))


@experiments.command("create")
@click.argument("space", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", required=True, help="The experiment's name.")
@click.option("--dataset", required=True, help="The dataset's id or name.")
@click.option("--strategy", help="grid, random or tpe (server default: grid).")
@click.option("--trials", "n_trials", type=int, help="Trials to sample (random and tpe).")
@click.option("--budget", type=float, help="Each trial's budget, in --budget-unit.")
@click.option("--budget-unit", help="steps or epochs (server default: steps).")
@click.option("--eval-every", type=int, help="Evaluate every this many steps.")
@click.option("--seed", type=int, help="The sweep's random seed.")
@click.option("--memory-mib", "memory_budget_mib", type=int, help="Device memory per trial (default: auto).")
@click.option("--early-stop-patience", type=int, help="Stop a trial after this many evaluations without gain.")
@click.option("--priority", help="low, normal or high.")
@click.option("--objective", type=click.Choice(["sft", "dpo"]),
              help="sft: language modelling (server default); dpo: preference tuning of a checkpoint on a "
                   "preference dataset, searching SPACE's dpo_beta and dpo_loss_type.")
@click.option("--launch", is_flag=True, help="Launch it at once.")
@json_option
def experiments_create(space: Path, name: str, dataset: str, launch: bool, **fields: Any) -> None:
    """Create an experiment from SPACE, a YAML or JSON search space as the web form takes it (and as
    `hydra experiments space` prints it): the parameters, and optionally model, pruner, holdout_bytes... With
    --objective dpo, SPACE may search dpo_beta ({kind: logfloat, low: 0.03, high: 0.3}) and dpo_loss_type
    ([sigmoid, ipo]), and a pruner may compare trials by metric reward_accuracy or reward_margin."""
    hydra = client()
    experiment = hydra.experiments.create(space.read_text(encoding="utf-8"), name=name,
                                          dataset=hydra.datasets.find(dataset)["id"], launch=launch, **fields)
    emit(experiment, lambda: _experiment_line(experiment))


def _changes(items: Iterable[str]) -> dict[str, Any]:
    """``--set key=value`` pairs as the API's fields: numbers, true/false and null read as JSON, the text fields
    kept as text, and ``@FILE`` read from a file (a search space)."""
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        key = FIELD_ALIASES.get(key, key)
        if not sep or key not in EXPERIMENT_FIELDS:
            raise click.BadParameter(f"{item!r}: give key=value with a key among {', '.join(EXPERIMENT_FIELDS)}.",
                                     param_hint="--set")
        if raw.startswith("@"):
            changes[key] = Path(raw[1:]).read_text(encoding="utf-8")
        elif key in TEXT_FIELDS:
            changes[key] = raw
        else:
            try:
                changes[key] = json.loads(raw)
            except ValueError:
                changes[key] = raw  # the server's message says what it expected
    return changes


@experiments.command("clone")
@click.argument("experiment_id", type=int, metavar="EXPERIMENT")
@click.option("--set", "items", multiple=True, metavar="KEY=VALUE",
              help="A field to change: name, budget, n_trials, space=@space.yaml... (repeatable).")
@click.option("--launch", is_flag=True, help="Launch the copy at once.")
@json_option
def experiments_clone(experiment_id: int, items: tuple[str, ...], launch: bool) -> None:
    """A new experiment like EXPERIMENT, with the --set fields changed."""
    changes = _changes(items)
    changes["launch"] = launch or bool(changes.get("launch"))
    experiment = client().experiments.clone(experiment_id, **changes)
    emit(experiment, lambda: _experiment_line(experiment))


def _experiment_action(name: str, method: str, summary: str) -> None:
    @experiments.command(name, help=summary)
    @click.argument("experiment_id", type=int, metavar="EXPERIMENT")
    @json_option
    def command(experiment_id: int) -> None:
        answer = getattr(client().experiments, method)(experiment_id)
        emit(answer, answer["detail"])


_experiment_action("launch", "launch", "Send every trial not launched yet to the scheduler.")
_experiment_action("cancel", "cancel", "Stop every trial that runs or waits.")
_experiment_action("retry-failed", "retry_failed", "Run every failed trial again.")


# Watching ------------------------------------------------------------------------------------------------------

@cli.command()
@click.argument("experiment_id", type=int, metavar="EXPERIMENT")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between polls.")
@json_option
def watch(experiment_id: int, interval: float) -> None:
    """Follow EXPERIMENT's trials until every one has ended: a progress bar each, with its status, validation bits
    per byte (what leaderboards rank by, the lower the better), best validation loss, latest training loss and time
    left. Exit 0 when all finished (or were pruned), 1 when any failed or was cancelled."""
    display = Display(bars=not wants_json())
    try:
        views = Watch(client(), experiment_id, interval=interval, display=display).run()
    finally:
        display.close()
    ok = succeeded(views)
    rows = [view.row() for view in views]
    emit({"experiment": experiment_id, "ok": ok, "trials": rows},
         lambda: table([{**r, "progress": f"{r['step']}/{r['total_steps']}"} for r in rows],
                       [("id", "ID"), ("number", "#"), ("status", "STATUS"), ("progress", "STEP"),
                        ("params", "PARAMS"), ("val_bpb", "VAL BPB"), ("best_val_loss", "BEST VAL LOSS"),
                        ("train_loss", "TRAIN LOSS"), ("message", "MESSAGE")]))
    if not ok:
        click.get_current_context().exit(EXIT_REFUSED)


# Trials --------------------------------------------------------------------------------------------------------

def _trial_line(trial: Mapping[str, Any]) -> str:
    line = (f"Trial {trial['id']} (#{trial['number']} of experiment {trial['experiment']}): {trial['status']}, "
            f"step {trial['step']}/{trial['total_steps']}")
    if trial.get("params"):
        line += f", {params(trial['params'])}"
    if trial.get("final_reward_accuracy") is not None:
        line += (f", DPO loss {number(trial['final_loss'])}, preference accuracy "
                 f"{number(trial['final_reward_accuracy'])}, margin {number(trial['final_reward_margin'])}")
    if trial.get("final_bpb") is not None:
        line += f", bpb {number(trial['final_bpb'])}"
    return line + (f"\n  {trial['message']}" if trial.get("message") else "")


@cli.group(cls=HydraGroup)
def trials() -> None:
    """Control one trial: pause, resume, cancel, retry, continue."""


@trials.command("show")
@click.argument("trial_id", type=int, metavar="TRIAL")
@json_option
def trials_show(trial_id: int) -> None:
    """One trial."""
    trial = client().trials.get(trial_id)
    emit(trial, lambda: _trial_line(trial))


def _trial_action(name: str, summary: str) -> None:
    @trials.command(name, help=summary)
    @click.argument("trial_id", type=int, metavar="TRIAL")
    @json_option
    def command(trial_id: int) -> None:
        trial = getattr(client().trials, name)(trial_id)
        emit(trial, lambda: _trial_line(trial))


_trial_action("pause", "Pause TRIAL at its next unit boundary.")
_trial_action("resume", "Resume a paused TRIAL.")
_trial_action("cancel", "Stop TRIAL for good.")
_trial_action("retry", "Run a failed or cancelled TRIAL again.")


@trials.command("continue")
@click.argument("trial_id", type=int, metavar="TRIAL")
@click.option("--steps", type=int, required=True, help="Optimizer steps to add.")
@click.option("--lr", type=float, required=True, help="Peak learning rate of the added steps.")
@click.option("--warmup-steps", type=int, default=0, show_default=True, help="Linear warm-up steps.")
@click.option("--decay", default="cosine", show_default=True, help="Decay to 0 over the added steps.")
@json_option
def trials_continue(trial_id: int, steps: int, lr: float, warmup_steps: int, decay: str) -> None:
    """Train a finished TRIAL further, from its last checkpoint."""
    trial = client().trials.continue_(trial_id, steps=steps, lr=lr, warmup_steps=warmup_steps, decay=decay)
    emit(trial, lambda: _trial_line(trial))


class ByteBar:
    """A transfer's progress as a tqdm bar on stderr (on a terminal only), made once the size is known."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: tqdm | None = None

    def __call__(self, done: int, total: int | None) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.label, unit="B", unit_scale=True, unit_divisor=1000,
                            file=sys.stderr, disable=None, dynamic_ncols=True)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _download_choice(offered: list[dict[str, Any]], adapter: bool) -> dict[str, Any]:
    """The download asked for among those the trial offers; UsageError for an adapter of a trial without one."""
    kind = "adapter" if adapter else "model"
    chosen = next((d for d in offered if d["kind"] == kind), None)
    if chosen is None:
        raise click.UsageError("This trial trained no LoRA adapter: download its model (without --adapter)."
                               if adapter else "This trial has no model to download.")
    return chosen


@cli.command()
@click.argument("trial_id", type=int, metavar="TRIAL")
@click.option("--adapter", is_flag=True,
              help="A LoRA trial's adapter alone (a few MB; load it on the base model with peft), not its merged "
                   "model.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="The folder to save the .tar.gz in.")
@json_option
def download(trial_id: int, adapter: bool, out_dir: Path) -> None:
    """Download TRIAL's model (weights, config, tokenizer) as a .tar.gz, or with --adapter a LoRA trial's adapter
    alone: the server packs it first. The file is named by the experiment, the trial's number in it, its id
    and what it holds."""
    hydra = client()
    trial, offered = hydra.trials.get(trial_id), hydra.trials.downloads(trial_id)
    if not offered:
        raise HydraError(409, f"Trial {trial_id} has no exported model to download (it is {trial['status']}).")
    chosen = _download_choice(offered, adapter)
    others = "; ".join(f"{d['title'].lower()} {size(d['content_bytes'])}" + (" (--adapter)" if d["kind"] ==
                       "adapter" else " (without --adapter)") for d in offered if d is not chosen)
    note(f"Trial {trial_id} (#{trial['number']} of experiment {trial['experiment']}): {chosen['title'].lower()}, "
         f"about {size(chosen['content_bytes'])}" + (f"; also: {others}" if others else ""))
    packing, receiving = ByteBar("packing"), ByteBar("downloading")
    try:
        path = hydra.trials.download(trial_id, out_dir, progress=receiving, packing=packing, kind=chosen["kind"])
    finally:
        packing.close()
        receiving.close()
    path = path.resolve()
    emit({"trial": trial_id, "number": trial["number"], "experiment": trial["experiment"], "kind": chosen["kind"],
          "path": str(path), "size_bytes": path.stat().st_size}, str(path))


# The lab -------------------------------------------------------------------------------------------------------

def _queue_text(queue: Mapping[str, Any]) -> str:
    devices = [{**d, "online": d["online"], "trial": (d["trial"] or {}).get("label"), "ends": duration(d["end_s"])}
               for d in queue["devices"]]
    waiting = [{**w, "trial": w["trial"].get("label"), "why": w.get("detail") or w.get("label")}
               for w in queue["waiting"]]
    lines = [table(devices, [("name", "DEVICE"), ("online", "ONLINE"), ("state", "STATE"), ("trial", "TRIAL"),
                             ("ends", "ENDS IN")]),
             "", f"{queue['running']} running; waiting (page {queue['page']} of {queue['pages']}):"]
    lines.append(table(waiting, [("position", "#"), ("trial", "TRIAL"), ("state", "STATE"), ("why", "WHY")])
                 if waiting else "nothing waits")
    return "\n".join(lines)


@cli.command()
@click.option("--page", type=int, default=1, show_default=True, help="Which page of the waiting trials.")
@json_option
def queue(page: int) -> None:
    """The lab queue: what each device runs, and why the waiting trials wait."""
    found = client().queue(page=page)
    emit(found, lambda: _queue_text(found))


def _leaderboard_text(board: Mapping[str, Any]) -> str:
    ranked_by = board.get("metric_label") or board["metric"]
    lines = [f"Dataset {board['dataset']}, best by {ranked_by} ({board.get('direction', 'lower is better')}):"]
    lines.append(table(board["team"], [("rank", "#"), ("value", board["metric"].upper()), ("trial_id", "TRIAL"),
                                       ("experiment", "EXPERIMENT"), ("number", "NO."), ("params", "PARAMS")])
                 if board["team"] else "no finished trial yet")
    if board["teams"]:
        lines += ["", "Each team's best:", table(board["teams"], [("rank", "#"), ("team", "TEAM"),
                                                                   ("value", board["metric"].upper())])]
    return "\n".join(lines)


@cli.command()
@click.argument("dataset", metavar="DATASET")
@click.option("--metric", type=click.Choice(["bpb", "val_ppl", "val_loss", "reward_accuracy", "reward_margin"]),
              help="What to rank by (default: bpb; on a preference dataset val_loss, the DPO loss). A preference "
                   "dataset ranks by val_loss, reward_accuracy, reward_margin or bpb (of the chosen answers).")
@click.option("--limit", type=click.IntRange(1, 200), default=20, show_default=True, help="How many trials.")
@json_option
def leaderboard(dataset: str, metric: str | None, limit: int) -> None:
    """The team's best trials on DATASET (its id or name), and each team's best."""
    board = client().leaderboard(dataset, metric=metric, limit=limit)
    emit(board, lambda: _leaderboard_text(board))


def main() -> None:
    """The ``hydra`` script."""
    cli(prog_name="hydra")


if __name__ == "__main__":
    main()
