"""``hydra trials``, ``hydra download``, ``hydra queue`` and ``hydra leaderboard``: control one trial, download
its model or adapter, see what the lab's devices run and why trials wait, and rank a dataset's trials."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from hydra_client.commands.common import HydraGroup, client, emit, json_option, note
from hydra_client.connection import HydraError
from hydra_client.render import duration, number, params, size, table


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


@click.group(cls=HydraGroup)
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


@click.command()
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


@click.command()
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


@click.command()
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

