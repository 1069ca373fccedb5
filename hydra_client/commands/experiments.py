"""``hydra experiments`` and ``hydra watch``: create an experiment from a search space, list, show, clone,
launch and cancel experiments, and follow one's trials until they end."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import click

from hydra_client.commands.common import EXIT_REFUSED, HydraGroup, client, emit, json_option, wants_json, when
from hydra_client.render import document, duration, table
from hydra_client.watch import Display, Watch, succeeded

# `experiments create` options and `clone --set` keys, by the API's field names.
EXPERIMENT_FIELDS = ("name", "dataset", "space", "strategy", "n_trials", "budget_unit", "budget", "eval_every",
                     "seed", "memory_budget_mib", "early_stop_patience", "priority", "holdout_bytes",
                     "chat_template", "objective", "launch")
TEXT_FIELDS = frozenset({"name", "space", "strategy", "budget_unit", "priority", "chat_template", "objective"})
FIELD_ALIASES = {"trials": "n_trials", "memory_mib": "memory_budget_mib", "patience": "early_stop_patience"}


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


@click.group(cls=HydraGroup)
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

@click.command()
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

