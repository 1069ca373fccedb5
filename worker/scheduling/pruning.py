"""Stopping trials that fall behind, decided on the device at each evaluation with Optuna's pruners.

A study is an experiment's trials as its pruner sees them. Its records live in Redis, outside every host's
namespace (an experiment's trials may train on several hosts), one hash per study::

    hydra:study:<study>    HASH   trial number -> {"values": {step: loss}, "attrs": {...}, "state": ...}

``values`` are the trial's reported figures by step (of its pruner's ``metric``: the validation loss unless the
experiment chose another, whose direction the study takes), ``attrs`` the system attributes the pruner
keeps on it (successive halving's completed rungs), ``state`` running, pruned or complete.

When a trial's evaluation ends, the device reports the loss and asks whether to go on (`report`): under the
study's lock, the records become an in-memory Optuna study (the trial numbered as in its experiment, less
one), the pruner decides on the trial with its new value, and what the pruner noted on it is written back.
Nothing else of Optuna is stored, the way the web app's TPE rebuilds its study from its trials. A pruned
trial ends at that unit boundary: the evaluation has applied every update, so its committed state, the one
exported, is its state after the evaluated step, and the device it held goes to the others at once.

Asynchronous successive halving decides on what the study holds when a trial reaches a rung: the first
trials up a rung go on unless another did better there (Optuna's rule for fewer than ``reduction_factor``
of them), later ones only within the best ``1 / reduction_factor``. So a good trial always goes on, and
which mediocre ones do depends on the order trials reach a rung, as in every asynchronous scheme.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import redis

from worker.contract import PrunerSpec, PruningJob

LOCK_TIMEOUT_S = 30.0  # a device that died holding the lock frees it after this long
METRIC_WORDS = {"loss": "validation loss", "bpb": "validation bits per byte", "reward_accuracy": "preference accuracy",
                "reward_margin": "reward margin"}  # each of `worker.contract.PRUNER_METRICS`, for a pruned trial's page


def study_key(study: str) -> str:
    return f"hydra:study:{study}"


@dataclass(frozen=True)
class Verdict:
    """The pruner's answer for one evaluation: ``prune`` the trial, the ``rung`` it reached (successive
    halving and Hyperband; None for the median rule) and, when pruned, why, for the trial's page."""

    prune: bool
    rung: int | None = None
    reason: str = ""


def make_pruner(spec: PrunerSpec) -> Any:
    """The Optuna pruner `spec` names."""
    from optuna.pruners import HyperbandPruner, MedianPruner, SuccessiveHalvingPruner

    if spec.kind == "asha":
        return SuccessiveHalvingPruner(min_resource=spec.min_resource, reduction_factor=spec.reduction_factor,
                                       min_early_stopping_rate=spec.min_early_stopping_rate)
    if spec.kind == "hyperband":
        return HyperbandPruner(min_resource=spec.min_resource, reduction_factor=spec.reduction_factor,
                               max_resource=spec.max_resource if spec.max_resource is not None else "auto")
    return MedianPruner(n_startup_trials=spec.n_startup_trials, n_warmup_steps=spec.n_warmup_steps)


def report(client: redis.Redis, job: PruningJob, *, step: int, loss: float) -> Verdict:
    """Record that trial ``job.trial_number`` had the figure `loss` of its pruner's metric (the validation loss
    unless it names another) after `step` steps, and return whether its pruner stops it there. Safe to repeat: a
    unit run again reports the same step again."""
    import optuna
    from optuna.trial import TrialState, create_trial

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    key = study_key(job.study)
    with client.lock(f"{key}:lock", timeout=LOCK_TIMEOUT_S, blocking_timeout=LOCK_TIMEOUT_S):
        records = {int(number): json.loads(raw) for number, raw in client.hgetall(key).items()}
        mine = records.setdefault(job.trial_number, {"values": {}, "attrs": {}, "state": "running"})
        mine["values"][str(step)] = loss if math.isfinite(loss) else float("nan")
        study = optuna.create_study(study_name=job.study, direction=job.pruner.direction,
                                    pruner=make_pruner(job.pruner))
        states = {"running": TrialState.RUNNING, "pruned": TrialState.PRUNED, "complete": TrialState.COMPLETE}
        for number in range(1, max(records) + 1):  # Optuna numbers trials from 0, in the order they are added
            record = records.get(number)
            if record is None:  # a trial that reported nothing yet: no pruner reads a failed trial
                study.add_trial(create_trial(state=TrialState.FAIL))
                continue
            values = {int(s): v for s, v in record["values"].items()}
            state = states[record["state"]]
            final = values[max(values)] if state == TrialState.COMPLETE and values else None
            study.add_trial(create_trial(state=state, value=final, intermediate_values=values,
                                         system_attrs=record["attrs"]))
        trial = study.get_trials(deepcopy=False)[job.trial_number - 1]
        prune = bool(study.pruner.prune(study, trial))
        mine["attrs"] = dict(study._storage.get_trial(trial._trial_id).system_attrs)  # the rungs it noted
        if prune:
            mine["state"] = "pruned"
        client.hset(key, str(job.trial_number), json.dumps(mine))
    rung = _top_rung(mine["attrs"])
    if not prune:
        return Verdict(False, rung)
    figure = f"its {METRIC_WORDS[job.pruner.metric]} {loss:.4f}"
    if job.pruner.kind == "median":
        reason = f"pruned after step {step}: {figure} was worse than the median of the finished trials at that step"
    else:
        reason = (f"pruned at rung {rung} (step {step}): {figure} was not in the best "
                  f"1/{job.pruner.reduction_factor} of the trials that reached that rung")
    return Verdict(True, rung, reason)


def finish(client: redis.Redis, job: PruningJob, *, step: int, loss: float | None) -> None:
    """Record that the trial trained its whole budget, `step` steps, its last evaluation's figure `loss` of the
    pruner's metric (None without one): its final value, which the median rule compares with."""
    key = study_key(job.study)
    with client.lock(f"{key}:lock", timeout=LOCK_TIMEOUT_S, blocking_timeout=LOCK_TIMEOUT_S):
        raw = client.hget(key, str(job.trial_number))
        record = json.loads(raw) if raw else {"values": {}, "attrs": {}, "state": "running"}
        if loss is not None:
            record["values"][str(step)] = loss if math.isfinite(loss) else float("nan")
        if record["values"]:
            record["state"] = "complete"
            client.hset(key, str(job.trial_number), json.dumps(record))


def rung_of(client: redis.Redis, job: PruningJob) -> int | None:
    """The last rung the trial reached, as the study recorded it (None: none, or the median rule)."""
    raw = client.hget(study_key(job.study), str(job.trial_number))
    return _top_rung(json.loads(raw)["attrs"] if raw else {})


def _top_rung(attrs: dict[str, Any]) -> int | None:
    """The highest rung successive halving noted as completed in a trial's system attributes."""
    rungs = [int(name.removeprefix("completed_rung_")) for name in attrs if name.startswith("completed_rung_")]
    return max(rungs) if rungs else None


def restart(client: redis.Redis, job: PruningJob) -> None:
    """Drop what the study holds of a trial that trains again from its first step (a retry)."""
    client.hdel(study_key(job.study), str(job.trial_number))


def forget(client: redis.Redis, study: str) -> None:
    """Drop a study's records (its experiment was deleted)."""
    client.delete(study_key(study))
