"""Writes about experiments and trials: create, launch, control, record what the scheduler reports, delete.

Views, forms and the worker glue call these; they never change a trial's status themselves. The scheduler's
state is authoritative while a trial runs: `trial_status_record` is how the worker side reports it, and it
never moves a trial out of an ended state (a late report after a cancel is ignored).
"""

from __future__ import annotations

import contextlib
import math
import shutil
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from webapp.accounts.models import Team
from webapp.experiments import scheduler
from webapp.experiments.memory_preview import FitError, auto_budget_bytes
from webapp.experiments.model_shapes import ModelChoiceError, model_shape
from webapp.experiments.models import Experiment, Trial
from webapp.experiments.planning import (
    ExperimentDraft,
    TrialDraft,
    hyperparameters,
    plan_trials,
    total_steps,
    trial_plan,
    trial_spec,
)
from webapp.experiments.search_space import SearchSpaceError, parse_search_space
from webapp.experiments.trial_generation import TPE_FIRST_WAVE, Outcome, next_tpe_trials

PLAN_ERRORS = (SearchSpaceError, ModelChoiceError, FitError)
Status = Trial.Status


def memory_budget(*, explicit_bytes: int | None) -> tuple[int, str]:
    """The device budget in bytes and a note saying where it came from."""
    if explicit_bytes is not None:
        return explicit_bytes, "explicit"
    return auto_budget_bytes()


def experiment_plan(*, draft: ExperimentDraft) -> list[TrialDraft]:
    """The trials `draft` starts with, each with its estimated memory plan. Raises one of `PLAN_ERRORS`."""
    budget, _ = memory_budget(explicit_bytes=draft.memory_budget_bytes)
    return plan_trials(draft, budget_bytes=budget)


def experiment_create(
    *, team: Team, user: AbstractBaseUser | None, draft: ExperimentDraft, cloned_from: Experiment | None = None
) -> Experiment:
    """Save the experiment and its initial trials (status ``new``). Raises one of `PLAN_ERRORS`."""
    if draft.dataset.team_id != team.pk:
        raise ValidationError({"dataset": "Choose one of your team's datasets."})
    trials = experiment_plan(draft=draft)
    with transaction.atomic():
        experiment = Experiment.objects.create(
            team=team, name=draft.name, dataset=draft.dataset, model=draft.model,
            search_space=draft.space.to_dict(), strategy=draft.strategy, n_trials=draft.n_trials,
            budget_unit=draft.budget_unit, budget=draft.budget, eval_every=draft.eval_every, seed=draft.seed,
            memory_budget_bytes=draft.memory_budget_bytes, early_stop_patience=draft.early_stop_patience,
            cloned_from=cloned_from, created_by=user,
        )
        Trial.objects.bulk_create(
            Trial(experiment=experiment, number=t.number, params=t.params, total_steps=t.total_steps, plan=t.plan)
            for t in trials
        )
    return experiment


def _launch(trial: Trial) -> None:
    """Move a new or retried trial to planning and send it to the scheduler once this transaction commits."""
    experiment = trial.experiment
    shape = model_shape(experiment.model, models_root=settings.HYDRA.models_root)
    budget, _ = memory_budget(explicit_bytes=experiment.memory_budget_bytes)
    spec = trial_spec(params=trial.params, shape=shape, dataset=experiment.dataset, steps=trial.total_steps,
                      eval_every=experiment.eval_every, seed=experiment.seed, budget_bytes=budget,
                      early_stop_patience=experiment.early_stop_patience)
    trial.attempt += 1
    trial.queue_id = trial.attempt_queue_id(trial.attempt)
    trial.status = Status.PLANNING
    trial.spec = spec
    trial.message = ""
    trial.step, trial.remaining_s, trial.started, trial.finished = 0, None, None, None
    trial.best_val_loss = trial.best_val_ppl = None
    trial.save()
    scheduler.submit_on_commit(trial_id=trial.queue_id, spec=spec,
                               export_dir=str(trial.export_dir_for(trial.queue_id)),
                               auto_budget=experiment.memory_budget_bytes is None)


def experiment_launch(*, experiment: Experiment) -> int:
    """Send every trial not yet launched to the scheduler; returns how many were sent."""
    with transaction.atomic():
        trials = list(experiment.trials.select_for_update().filter(status=Status.NEW).select_related(
            "experiment__dataset"))
        for trial in trials:
            _launch(trial)
        if trials and experiment.launched is None:
            experiment.launched = timezone.now()
            experiment.save(update_fields=["launched"])
    return len(trials)


def trial_retry(*, trial: Trial) -> None:
    """Run a failed or cancelled trial again from the start (a new attempt with its own spill store)."""
    if trial.status not in (Status.FAILED, Status.CANCELLED):
        raise ValidationError(f"Trial #{trial.number} is {trial.get_status_display().lower()}; only failed or "
                              "cancelled trials can be retried.")
    with transaction.atomic():
        _launch(trial)


def experiment_retry_failed(*, experiment: Experiment) -> int:
    """Retry every failed trial of `experiment`; returns how many."""
    with transaction.atomic():
        trials = list(experiment.trials.select_for_update().filter(status=Status.FAILED))
        for trial in trials:
            _launch(trial)
    return len(trials)


def trial_control(*, trial: Trial, action: scheduler.Control) -> None:
    """Pause, resume or cancel. Takes effect at the next unit boundary; the status shows the scheduler's answer.

    Raises ValidationError for an action the trial's status does not allow, or when the scheduler refuses.
    """
    allowed = {
        "pause": (Status.PLANNING, Status.RUNNABLE, Status.RUNNING),
        "resume": (Status.PAUSED,),
        "cancel": (Status.NEW, *Trial.ACTIVE),
    }[action]
    if trial.status not in allowed:
        raise ValidationError(f"Trial #{trial.number} is {trial.get_status_display().lower()}; it cannot {action}.")
    if trial.status == Status.NEW:  # never sent: nothing to tell the scheduler
        trial.status = Status.CANCELLED
        trial.save(update_fields=["status", "updated"])
        return
    try:
        state = scheduler.control(trial_id=trial.queue_id, action=action)
    except scheduler.SchedulerError as error:
        raise ValidationError(str(error)) from error
    trial_status_record(trial_id=trial.queue_id, status=state)


def experiment_cancel(*, experiment: Experiment) -> int:
    """Cancel every trial that has not ended; returns how many were asked to stop."""
    count = 0
    for trial in experiment.trials.filter(status__in=[Status.NEW, *Trial.ACTIVE]):
        trial_control(trial=trial, action="cancel")
        count += 1
    return count


def trial_delete(*, trial: Trial) -> None:
    """Cancel the trial if it still runs, delete it and, once committed, its spill stores and exported model."""
    if trial.is_active:
        with contextlib.suppress(scheduler.SchedulerError):  # unknown to the scheduler: nothing left to stop
            scheduler.control(trial_id=trial.queue_id, action="cancel")
    paths = [*trial.spill_dirs, *([trial.export_dir_for(trial.queue_id)] if trial.queue_id else [])]
    with transaction.atomic():
        trial.delete()
        transaction.on_commit(lambda: [shutil.rmtree(path, ignore_errors=True) for path in paths])


def experiment_delete(*, experiment: Experiment) -> None:
    """Delete an experiment with its trials (cancelling what runs) and their files."""
    with transaction.atomic():
        for trial in experiment.trials.all():
            trial_delete(trial=trial)
        experiment.delete()


def trial_status_record(
    *,
    trial_id: str,
    status: str,
    step: int | None = None,
    remaining_s: float | None = None,
    message: str | None = None,
    best_val_loss: float | None = None,
    plan: dict[str, Any] | None = None,
    export_path: str | None = None,
) -> bool:
    """Record what the scheduler reports about the trial it knows as `trial_id` (its queue id).

    For the worker glue: call it with any subset of fields. ``best_val_loss`` only ever improves (its
    perplexity is derived); ``plan`` replaces the pre-launch estimate with the measured plan; a finished trial
    without ``export_path`` gets the export directory its launch named, if the model is there. Reports about
    an old attempt, an unknown trial, or that would move an ended trial back are ignored; returns whether
    anything was recorded. When a TPE trial ends, TPE is asked for the next one.
    """
    if status not in Status.values:
        raise ValueError(f"Unknown trial status {status!r}; use one of {', '.join(Status.values)}.")
    with transaction.atomic():
        trial = Trial.objects.select_for_update().filter(queue_id=trial_id).first()
        if trial is None or (trial.status in Trial.ENDED and status != trial.status):
            return False
        now = timezone.now()
        if status == Status.RUNNING and trial.started is None:
            trial.started = now
        if status in Trial.ENDED and trial.finished is None:
            trial.finished = now
        trial.status = status
        if step is not None:
            trial.step = max(trial.step, step)
        if remaining_s is not None:
            trial.remaining_s = remaining_s
        if message is not None:
            trial.message = message
        if best_val_loss is not None and (trial.best_val_loss is None or best_val_loss < trial.best_val_loss):
            trial.best_val_loss = best_val_loss
            trial.best_val_ppl = math.exp(min(best_val_loss, 700.0))
        if plan is not None:
            trial.plan = plan | {"source": "measured"}
        if export_path is not None:
            trial.export_path = export_path
        elif status == Status.FINISHED and not trial.export_path:
            # The scheduler exports a trial before it reports it finished, into the directory its launch named.
            exported = trial.export_dir_for(trial.queue_id)
            if exported.is_dir():
                trial.export_path = str(exported)
        trial.save()
        if status in Trial.ENDED and trial.experiment.strategy == Experiment.Strategy.TPE:
            experiment_extend_tpe(experiment=trial.experiment)
    return True


def experiment_extend_tpe(*, experiment: Experiment) -> list[Trial]:
    """Keep a TPE experiment's first-wave number of trials in flight: ask TPE (told every result so far) for
    as many new trials as have ended, up to the experiment's count, and launch them if it was launched."""
    trials = list(experiment.trials.select_for_update().order_by("number"))
    in_flight = sum(t.status not in Trial.ENDED for t in trials)
    wanted = min(experiment.n_trials - len(trials), min(experiment.n_trials, TPE_FIRST_WAVE) - in_flight)
    if wanted <= 0:
        return []
    history = [
        Outcome(params=t.params, value=t.best_val_loss if t.status == Status.FINISHED else None,
                ended=t.status in Trial.ENDED)
        for t in trials
    ]
    proposals = next_tpe_trials(parse_search_space(experiment.search_space), n_trials=experiment.n_trials,
                                seed=experiment.seed, history=history, count=wanted)
    shape = model_shape(experiment.model, models_root=settings.HYDRA.models_root)
    budget, _ = memory_budget(explicit_bytes=experiment.memory_budget_bytes)
    dataset = experiment.dataset
    created = []
    for number, params in enumerate(proposals, start=len(trials) + 1):
        values = hyperparameters(params, shape)
        trial = Trial.objects.create(
            experiment=experiment, number=number, params=params,
            total_steps=total_steps(budget_unit=experiment.budget_unit, budget=experiment.budget,
                                    batch_size=int(values["batch_size"]), seq_len=int(values["seq_len"]),
                                    train_tokens=dataset.train_tokens),
            plan=trial_plan(params, shape=shape, vocab_size=dataset.vocab_size, budget_bytes=budget),
        )
        if experiment.launched is not None:
            _launch(trial)
        created.append(trial)
    return created
