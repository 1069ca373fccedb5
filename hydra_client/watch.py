"""Following an experiment's trials until every one has ended: what ``hydra watch`` shows and decides.

Each poll reads the experiment's trials, then the new steps and evaluations (``/trials/{id}/metrics`` after
the trial's cursor) of each trial that runs or changed since it was last read: a queue of a hundred waiting
trials costs one request a poll, not a hundred, and stays well within the token's rate limit.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from hydra_client.client import ENDED, SUCCEEDED, Hydra
from hydra_client.connection import HydraError, HydraUnreachable
from hydra_client.render import duration, number, params

STEPS_PER_ANSWER = 1000  # the most steps one answer of /trials/{id}/metrics holds
MAX_PAGES_PER_POLL = 10  # a trial far ahead catches up over a few polls
OUTAGE_GRACE_S = 60.0  # a server restarting mid-watch is waited for this long before the watch gives up
# A trial's status comes from the scheduler's events, its final evaluation from the telemetry the server ingests
# a moment later: a finished trial without its final figures is waited for this long.
FINAL_EVAL_GRACE_S = 30.0
LABEL_PARAMS_CHARS = 40  # a bar's label names the parameters of a trial up to this many characters


class NotLaunched(HydraError):
    """Every trial that has not ended was never launched: watching would wait for ever."""


@dataclass
class TrialView:
    """A trial as the watch knows it: its last record, the cursor into its metrics, its latest training loss and
    its latest evaluation's bits per byte."""

    trial: dict[str, Any]
    cursor: int = -1
    train_loss: float | None = None
    eval_bpb: float | None = None
    read_at: tuple[Any, ...] | None = field(default=None)  # (status, step, attempt) when its metrics were read

    @property
    def status(self) -> str:
        return self.trial["status"]

    @property
    def val_bpb(self) -> float | None:
        """Validation bits per byte, what leaderboards rank by: the final evaluation's once there is one, else
        the latest evaluation's."""
        final = self.trial.get("final_bpb")
        return final if final is not None else self.eval_bpb

    def key(self) -> tuple[Any, ...]:
        return self.trial["status"], self.trial["step"], self.trial["attempt"]

    def stale(self) -> bool:
        """Whether its metrics should be read this poll: it runs, or it changed since they were last read."""
        return self.status == "running" or self.read_at != self.key()

    def take(self, trial: dict[str, Any]) -> None:
        """A newer record of the trial; a new attempt starts its metrics afresh."""
        if trial["attempt"] != self.trial["attempt"]:
            self.cursor, self.train_loss, self.eval_bpb, self.read_at = -1, None, None, None
        self.trial = trial

    def absorb(self, metrics: dict[str, Any]) -> None:
        """One answer of ``/trials/{id}/metrics``: its trial, its last step's loss and its last eval's bpb."""
        self.take(metrics["trial"])
        if metrics["steps"]:
            self.train_loss = metrics["steps"][-1]["loss"]
        bpbs = [e["bpb"] for e in metrics["evals"] if e.get("bpb") is not None]
        if bpbs:
            self.eval_bpb = bpbs[-1]
        self.cursor = metrics["next"]

    def label(self, varying: Collection[str] | None = None) -> str:
        """``#number`` and its parameters (those in `varying` when given: what tells it from the other trials),
        whole ``key=value`` pairs up to `LABEL_PARAMS_CHARS`, then ``…`` for the ones left out."""
        values = self.trial.get("params") or {}
        shown = {k: v for k, v in values.items() if varying is None or k in varying}
        pairs, width, left_out = [], 0, False
        for key, value in shown.items():
            pair = params({key: value})
            if pairs and width + 1 + len(pair) > LABEL_PARAMS_CHARS:
                left_out = True
                break
            pairs.append(pair)
            width += len(pair) + 1
        return " ".join([f"#{self.trial['number']}", *pairs, *(["…"] if left_out else [])])

    def summary(self) -> str:
        """Status, validation bits per byte (the final evaluation's, or the latest one's, said so), best validation
        loss, the latest training loss and time left, each named: as a bar's postfix or a line."""
        parts = [self.status]
        if self.val_bpb is not None:
            latest = "" if self.trial.get("final_bpb") is not None else " (latest eval)"
            parts.append(f"val bpb {number(self.val_bpb)}{latest}")
        if self.trial.get("best_val_loss") is not None:
            parts.append(f"best val loss {number(self.trial['best_val_loss'])}")
        if self.train_loss is not None:
            parts.append(f"train loss {number(self.train_loss)}")
        if self.status == "running" and self.trial.get("remaining_s") is not None:
            parts.append(f"eta {duration(self.trial['remaining_s'])}")
        if self.status in ("failed", "cancelled") and self.trial.get("message"):
            parts.append(self.trial["message"])
        return ", ".join(parts)

    def row(self) -> dict[str, Any]:
        """The trial as ``hydra watch`` reports it at the end."""
        keys = ("id", "number", "status", "message", "params", "attempt", "step", "total_steps", "final_loss",
                "final_bpb", "best_val_loss")
        return {**{key: self.trial.get(key) for key in keys}, "val_bpb": self.val_bpb, "train_loss": self.train_loss}


def varying_params(trials: Iterable[Mapping[str, Any]]) -> set[str] | None:
    """The parameters whose values differ between `trials`; None for one trial (all of its own tell it)."""
    trials = list(trials)
    if len(trials) < 2:
        return None
    keys = {key for trial in trials for key in (trial.get("params") or {})}
    return {key for key in keys
            if len({repr((trial.get("params") or {}).get(key)) for trial in trials}) > 1}


class Display:
    """One tqdm bar per trial on stderr (only on a terminal), and a line on stderr whenever a trial's status
    changes, so that a log shows the sweep's course too."""

    def __init__(self, *, bars: bool, lines: bool = True) -> None:
        self.bars_enabled = bars and sys.stderr.isatty()
        self.lines = lines
        self.bars: dict[int, tqdm] = {}
        self.statuses: dict[int, str] = {}
        self.varying: set[str] | None = None  # the parameters that tell the trials apart, for their labels

    def show(self, view: TrialView) -> None:
        trial_id = view.trial["id"]
        if self.bars_enabled:
            self._bar(view)
        if view.status == "finished" and view.trial.get("final_loss") is None:
            return  # its line waits for the final evaluation's figures
        if self.lines and self.statuses.get(trial_id) != view.status:
            self.note(f"{view.label(self.varying)}: {view.summary()}")
        self.statuses[trial_id] = view.status

    def _bar(self, view: TrialView) -> None:
        bar = self.bars.get(view.trial["id"])
        if bar is None:
            bar = tqdm(total=view.trial["total_steps"] or None, desc=view.label(self.varying),
                       position=len(self.bars), leave=True, dynamic_ncols=True, file=sys.stderr,
                       bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt}{postfix}")
            self.bars[view.trial["id"]] = bar
        bar.total = view.trial["total_steps"] or None
        bar.n = min(view.trial["step"], bar.total or view.trial["step"])
        bar.set_postfix_str(view.summary(), refresh=False)
        bar.refresh()

    def note(self, text: str) -> None:
        if self.bars:
            tqdm.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


class Watch:
    """Polls experiment `experiment_id` every `interval` seconds until every trial has ended."""

    def __init__(self, client: Hydra, experiment_id: int, *, interval: float = 2.0, display: Display,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.client = client
        self.experiment_id = experiment_id
        self.interval = interval
        self.display = display
        self.sleep = sleep
        self.views: dict[int, TrialView] = {}
        self.ended_at: float | None = None  # when every trial was first seen ended

    def run(self) -> list[TrialView]:
        """Every trial once all have ended, in trial number order."""
        outage_since: float | None = None
        while True:
            try:
                done = self.poll()
                outage_since = None
            except HydraError as error:
                if not _transient(error):
                    raise
                outage_since = outage_since or time.monotonic()
                if time.monotonic() - outage_since > OUTAGE_GRACE_S:
                    raise
                self.display.note(f"(server: {error.detail}; trying again)")
                done = False
            if done:
                return sorted(self.views.values(), key=lambda v: v.trial["number"])
            self.sleep(self.interval)

    def poll(self) -> bool:
        """Read what changed and show it; whether every trial has ended."""
        trials = self.client.experiments.trials(self.experiment_id)
        self.display.varying = varying_params(trials)
        for trial in trials:
            view = self.views.get(trial["id"])
            if view is None:
                view = self.views[trial["id"]] = TrialView(trial)
            else:
                view.take(trial)
            if view.stale():
                self._read_metrics(view)
            self.display.show(view)
        return self._ended()

    def _read_metrics(self, view: TrialView) -> None:
        for _ in range(MAX_PAGES_PER_POLL):
            metrics = self.client.trials.metrics(view.trial["id"], since=view.cursor)
            view.absorb(metrics)
            if len(metrics["steps"]) < STEPS_PER_ANSWER:
                break
        view.read_at = view.key()

    def _ended(self) -> bool:
        """Whether every trial has ended, with its final evaluation for those that finished (or the grace for it
        is over)."""
        statuses = [view.status for view in self.views.values()]
        if all(status in ENDED for status in statuses):
            self.ended_at = self.ended_at or time.monotonic()
            waiting = any(v.status == "finished" and v.trial.get("final_loss") is None for v in self.views.values())
            return not waiting or time.monotonic() - self.ended_at > FINAL_EVAL_GRACE_S
        if all(status in ENDED or status == "new" for status in statuses):
            waiting = sum(status == "new" for status in statuses)
            raise NotLaunched(None, f"{waiting} trial(s) of experiment {self.experiment_id} are not launched, and "
                                    f"no other trial runs or waits: hydra experiments launch {self.experiment_id}")
        return False


def _transient(error: HydraError) -> bool:
    """A failure that a server restart explains: out of reach, or a 502/503/504 from it or its proxy."""
    return isinstance(error, HydraUnreachable) or error.status in (502, 503, 504)


def succeeded(views: list[TrialView]) -> bool:
    """Whether every trial ended with a model (finished or pruned)."""
    return all(view.status in SUCCEEDED for view in views)
