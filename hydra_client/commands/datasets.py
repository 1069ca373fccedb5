"""``hydra datasets`` and ``hydra models``: what an experiment trains on, the team's datasets (list, upload,
the server's sample) and the server's model catalog."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import click

from hydra_client.commands.common import HydraGroup, client, emit, json_option, note, when
from hydra_client.render import size, table

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


@click.group(cls=HydraGroup)
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

@click.group(cls=HydraGroup)
def models() -> None:
    """The server's model catalog."""


@models.command("list")
@json_option
def models_list() -> None:
    """The catalog's checkpoints."""
    found = client().models.list()
    emit(found, lambda: table(found, [("id", "ID"), ("name", "NAME"), ("family", "FAMILY"), ("status", "STATUS"),
                                      ("n_params", "PARAMS"), ("context_length", "CONTEXT")]))

