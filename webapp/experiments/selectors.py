"""Reads about experiments and trials, scoped to a team, as querysets or plain data for the pages."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, QuerySet

from webapp.accounts.models import Team
from webapp.accounts.roles import can_change
from webapp.accounts.selectors import team_scoped_get
from webapp.experiments.model_shapes import model_to_spec
from webapp.experiments.search_space import (
    CHECKPOINT_KEY,
    DEVICES_KEY,
    HOLDOUT_KEY,
    MODEL_KEY,
    OBJECTIVE_KEY,
    PRUNER_KEY,
    TEMPLATE_KEY,
)
from webapp.ground.models import Experiment, Trial
from webapp.worker_door import Control, control_changes


def experiment_list(*, team: Team | None) -> QuerySet[Experiment]:
    """The team's experiments, newest first, with their datasets; `experiment_trial_counts` counts the trials of
    the ones a page shows."""
    if not team:  # request.team is a lazy object; test its truth
        return Experiment.objects.none()
    return Experiment.objects.filter(team=team).select_related("dataset").order_by("-created", "-pk")


def experiment_trial_counts(*, experiments: Iterable[Experiment]) -> dict[int, dict[str, int]]:
    """Each experiment's trials by status, in one query over those experiments only: ``total``, ``new``,
    ``active`` (planning, queued, running or paused), ``finished`` and ``failed``, by experiment id."""
    counts = {e.pk: {"total": 0, "new": 0, "active": 0, "finished": 0, "failed": 0} for e in experiments}
    rows = (Trial.objects.filter(experiment_id__in=list(counts)).order_by()
            .values_list("experiment_id", "status").annotate(n=Count("pk")))
    for experiment_id, status, n in rows:
        row = counts[experiment_id]
        row["total"] += n
        if status == Trial.Status.NEW:
            row["new"] += n
        elif status in Trial.ACTIVE:
            row["active"] += n
        elif status in (Trial.Status.FINISHED, Trial.Status.FAILED):
            row[status] += n
        elif status == Trial.Status.PRUNED:  # ended at an evaluation by the pruner, its model exported
            row["finished"] += n
    return counts


def experiment_get(*, team: Team | None, experiment_id: int) -> Experiment:
    """The team's experiment, or Http404 (also for another team's)."""
    return team_scoped_get(Experiment.objects.select_related("dataset", "team", "cloned_from"), team=team,
                           pk=experiment_id)


def trial_get(*, team: Team | None, trial_id: int) -> Trial:
    """The team's trial, or Http404 (also for another team's)."""
    return team_scoped_get(
        Trial.objects.select_related("experiment__dataset"), team=team, team_field="experiment__team", pk=trial_id
    )


def experiment_can_change(*, user: AbstractBaseUser, experiment: Experiment) -> bool:
    """Whether `user` may launch, control and delete the experiment and its trials (see `accounts.roles`)."""
    return can_change(user=user, team=experiment.team, created_by_id=experiment.created_by_id)


def experiment_trials(*, experiment: Experiment) -> QuerySet[Trial]:
    """The experiment's trials by number (each keeps its experiment: a page names it without a query per row)."""
    return experiment.trials.order_by("number")


def experiment_state(*, experiment: Experiment) -> dict[str, Any]:
    """Counts by status and one word for the whole experiment: draft, running, finished or stopped."""
    counts = dict(experiment.trials.values_list("status").annotate(n=Count("pk")))
    active = sum(counts.get(s, 0) for s in Trial.ACTIVE)
    if counts.get(Trial.Status.NEW) and not active and not any(counts.get(s) for s in Trial.ENDED):
        word = "draft"
    elif active:
        word = "running"
    elif counts.get(Trial.Status.NEW):
        word = "partly launched"
    elif counts.get(Trial.Status.FINISHED, 0) + counts.get(Trial.Status.PRUNED, 0) == sum(counts.values()):
        word = "finished"
    else:
        word = "stopped"
    return {"word": word, "counts": counts, "active": active, "total": sum(counts.values())}


def trial_actions(trial: Trial) -> list[str]:
    """The controls a trial's status allows, in the order the page shows them: those the scheduler's
    transitions say change something (`worker.contract.CONTROL_TRANSITIONS`), cancel of a trial not launched
    yet, and retry of one that failed or was cancelled."""
    status = trial.status
    actions = [str(control) for control in Control if control_changes(status, control)]
    if status == Trial.Status.NEW:
        actions.append("cancel")
    if status in (Trial.Status.FAILED, Trial.Status.CANCELLED):
        actions.append("retry")
    return actions


def plan_summary(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    """Shards, peak device bytes and spilled bytes of a stored memory plan, for tables; a LoRA trial's frozen
    base bytes (what its units read from the host's shared base, not its own state) and, in an estimate, the
    shared base's size on the host."""
    if not plan:
        return None
    spilled = plan.get("spilled_bytes")
    return {
        "shards": len(plan.get("shards", [])),
        "peak_bytes": plan.get("peak_bytes"),
        "budget_bytes": plan.get("budget_bytes"),
        "state_bytes": plan.get("state_bytes"),
        "spilled_bytes": sum(spilled.values()) if isinstance(spilled, dict) else spilled,
        "frozen_bytes": plan.get("frozen_bytes") or 0,  # a LoRA trial's base weights, from the host's shared copy
        "base_bytes": plan.get("base_bytes"),
        "source": plan.get("source", "measured"),
        "head_token_chunk": plan.get("head_token_chunk"),  # the head's loss in chunks of this many tokens
    }


def plan_shard_rows(plan: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per shard: its layers and bytes by category (what the memory-plan chart stacks)."""
    rows = []
    for shard in (plan or {}).get("shards", []):
        layers = shard.get("layers", [])
        rows.append({
            "index": shard.get("index"),
            "layers": f"{layers[0]} … {layers[-1]}" if len(layers) > 2 else ", ".join(layers),
            "n_layers": len(layers),
            "param_bytes": shard.get("param_bytes", 0),
            "grad_bytes": shard.get("grad_bytes", 0),
            "optim_bytes": shard.get("optim_bytes", 0),
            "activation_bytes": shard.get("activation_bytes", 0),
            "frozen_bytes": shard.get("frozen_bytes", 0),
        })
    return rows


def experiment_spec(experiment: Experiment) -> dict[str, Any]:
    """The experiment's search space with its model, checkpoint interval, pruner, held-out size, devices per trial,
    chat template and objective (when dpo) beside the parameters: the text the form and the API take, which gives
    the same experiment."""
    model = model_to_spec(experiment.model)
    return {**({MODEL_KEY: model} if model is not None else {}), CHECKPOINT_KEY: experiment.checkpoint_minutes,
            **({PRUNER_KEY: experiment.pruner} if experiment.pruner else {}),
            **({HOLDOUT_KEY: experiment.holdout_bytes} if experiment.holdout_bytes else {}),
            **({TEMPLATE_KEY: experiment.chat_template} if experiment.chat_template else {}),
            **({DEVICES_KEY: experiment.max_devices_per_trial} if experiment.max_devices_per_trial else {}),
            **({OBJECTIVE_KEY: experiment.objective} if experiment.objective != Experiment.Objective.SFT else {}),
            **experiment.search_space}
