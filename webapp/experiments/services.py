"""Writes about experiments and trials: create, launch, control, retry, delete.

Views and forms call these. Every write that launches, controls or deletes takes the `actor` and checks
`webapp.accounts.roles`: a team's owners act on all its experiments, members on those they created.
The scheduler's state is authoritative while a trial runs: its status changes only through
`webapp.experiments.events` (what the scheduler reports, and its answer to a control).
"""

from __future__ import annotations

import logging
import shutil

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from webapp import queue_client
from webapp.accounts.models import Team
from webapp.accounts.roles import require_creator_or_owner
from webapp.experiments import continuing
from webapp.experiments.events import trial_event_apply, trial_events_sync_quietly
from webapp.experiments.launching import memory_budget, trial_launch
from webapp.experiments.planning import PLAN_ERRORS as PLAN_ERRORS  # what planning raises, for the views
from webapp.experiments.planning import ExperimentDraft, TrialDraft, plan_trials
from webapp.experiments.previews import experiment_preview_trials, plans_in_background
from webapp.experiments.selectors import trial_actions
from webapp.experiments.trial_data import trial_data_request
from webapp.ground.models import Experiment, Trial
from webapp.worker_door import Control

log = logging.getLogger(__name__)
Status = Trial.Status


def experiment_plan(*, draft: ExperimentDraft) -> list[TrialDraft]:
    """The trials `draft` starts with, each with its estimated memory plan. Raises one of `PLAN_ERRORS`."""
    budget, _ = memory_budget(explicit_bytes=draft.memory_budget_bytes)
    return plan_trials(draft, budget_bytes=budget, caps=settings.HYDRA.caps)


def experiment_create(
    *, team: Team, user: AbstractBaseUser | None, draft: ExperimentDraft, cloned_from: Experiment | None = None
) -> Experiment:
    """Save the experiment and its initial trials (status ``new``). Raises one of `PLAN_ERRORS`.

    A draft too large to plan in a request takes the trials of its ready preview; without one it raises
    `previews.PreviewPending` (and asks the web worker for the preview).
    """
    if draft.dataset.team_id != team.pk:
        raise ValidationError({"dataset": "Choose one of your team's datasets."})
    if plans_in_background(draft):
        trials = experiment_preview_trials(team=team, draft=draft)
    else:
        trials = experiment_plan(draft=draft)
    with transaction.atomic():
        experiment = Experiment.objects.create(
            team=team, name=draft.name, dataset=draft.dataset, model=draft.model,
            search_space=draft.space.to_dict(), strategy=draft.strategy, n_trials=draft.n_trials,
            budget_unit=draft.budget_unit, budget=draft.budget, eval_every=draft.eval_every, seed=draft.seed,
            memory_budget_bytes=draft.memory_budget_bytes, early_stop_patience=draft.early_stop_patience,
            checkpoint_minutes=draft.checkpoint_minutes, priority=draft.priority, pruner=draft.pruner,
            holdout_bytes=draft.holdout_bytes, chat_template=draft.chat_template,
            max_devices_per_trial=draft.max_devices_per_trial, objective=draft.objective, cloned_from=cloned_from,
            created_by=user,
        )
        Trial.objects.bulk_create(
            Trial(experiment=experiment, number=t.number, params=t.params, total_steps=t.total_steps, plan=t.plan)
            for t in trials
        )
        # a pretrained model's ids, made meanwhile
        trial_data_request(shape=draft.shape, dataset=draft.dataset, chat_template=draft.chat_template)
    return experiment


def experiment_require_change(*, actor: AbstractBaseUser, experiment: Experiment) -> None:
    """Raise PermissionDenied unless `actor` owns the experiment's team or created the experiment."""
    require_creator_or_owner(user=actor, team=experiment.team, created_by_id=experiment.created_by_id,
                             what=f"experiment {experiment.name!r}")


def experiment_launch(*, experiment: Experiment, actor: AbstractBaseUser) -> int:
    """Send every trial not yet launched to the scheduler; returns how many were sent.
    Raises PermissionDenied unless `actor` may change the experiment."""
    experiment_require_change(actor=actor, experiment=experiment)
    with transaction.atomic():
        trials = list(experiment.trials.select_for_update().filter(status=Status.NEW).select_related(
            "experiment__dataset"))
        for trial in trials:
            trial_launch(trial=trial)
        if trials and experiment.launched is None:
            experiment.launched = timezone.now()
            experiment.save(update_fields=["launched"])
    return len(trials)


def trial_retry(*, trial: Trial, actor: AbstractBaseUser) -> None:
    """Run a failed or cancelled trial again from the start (a new attempt with its own spill store); a failed
    or cancelled continuation again from the checkpoint it continues (`webapp.experiments.continuing`)."""
    experiment_require_change(actor=actor, experiment=trial.experiment)
    if trial.status not in (Status.FAILED, Status.CANCELLED):
        raise ValidationError(f"Trial #{trial.number} is {trial.get_status_display().lower()}; only failed or "
                              "cancelled trials can be retried.")
    with transaction.atomic():
        if continuing.continuing(trial):
            continuing.continue_again(trial)
        else:
            trial_launch(trial=trial)


def experiment_retry_failed(*, experiment: Experiment, actor: AbstractBaseUser) -> int:
    """Retry every failed trial of `experiment`; returns how many."""
    experiment_require_change(actor=actor, experiment=experiment)
    with transaction.atomic():
        trials = list(experiment.trials.select_for_update().filter(status=Status.FAILED))
        for trial in trials:
            if continuing.continuing(trial):
                continuing.continue_again(trial)
            else:
                trial_launch(trial=trial)
    return len(trials)


def trial_control(*, trial: Trial, action: str, actor: AbstractBaseUser) -> None:
    """Pause, resume or cancel. Takes effect at the next unit boundary; the status shows the scheduler's answer.

    Raises PermissionDenied unless `actor` may change the trial's experiment; ValidationError for an unknown
    action, one the trial's status does not allow (see `trial_actions`), or when the scheduler refuses.
    """
    experiment_require_change(actor=actor, experiment=trial.experiment)
    _trial_control(trial=trial, action=action)


def _trial_control(*, trial: Trial, action: str) -> None:
    if action not in ("pause", "resume", "cancel"):
        raise ValidationError(f"{action!r} is not a trial control; use pause, resume or cancel.")
    if action not in trial_actions(trial):
        raise ValidationError(f"Trial #{trial.number} is {trial.get_status_display().lower()}; it cannot {action}.")
    if trial.status == Status.NEW:  # never sent: nothing to tell the scheduler
        trial.status = Status.CANCELLED
        trial.save(update_fields=["status", "updated"])
        return
    try:
        queue_client.trial_control(trial_id=trial.queue_id, control=Control(action), host_id=trial.queue_host)
    except queue_client.TrialUnknown as error:
        if action != "cancel":
            raise ValidationError(f"The scheduler does not hold trial #{trial.number} right now (Redis lost its "
                                  "data?); it is sent again within seconds, so try again then.") from error
        # Nothing runs it, and the reconciler sends no stopped trial again (nor lets one it sent run on).
        trial_event_apply(trial_id=trial.queue_id, status=Status.CANCELLED,
                          message="Cancelled. The scheduler no longer held this trial.")
        return
    except queue_client.SchedulerError as error:
        raise ValidationError(str(error)) from error
    # The status follows the queue's events, applied in their order: a control that took effect at once has
    # published its event already. Writing the control's answer here instead could land after a later event
    # (a pending pause whose unit ended meanwhile) and leave the page showing "running" for good.
    trial_events_sync_quietly()


def experiment_cancel(*, experiment: Experiment, actor: AbstractBaseUser) -> int:
    """Cancel every trial that has not ended; returns how many were asked to stop."""
    experiment_require_change(actor=actor, experiment=experiment)
    count = 0
    for trial in experiment.trials.filter(status__in=[Status.NEW, *Trial.ACTIVE]):
        _trial_control(trial=trial, action="cancel")
        count += 1
    return count


def trial_delete(*, trial: Trial, actor: AbstractBaseUser) -> None:
    """Cancel the trial if it still runs, delete it and, once committed, its spill stores and exported model.
    Raises PermissionDenied unless `actor` may change the trial's experiment."""
    experiment_require_change(actor=actor, experiment=trial.experiment)
    _trial_delete(trial=trial)


def _trial_delete(*, trial: Trial) -> None:
    if trial.is_active:
        try:
            queue_client.trial_control(trial_id=trial.queue_id, control=Control.CANCEL, host_id=trial.queue_host)
        except queue_client.SchedulerUnavailable as error:
            # Redis is down: the reconciler cancels the queue's copy, which no row names, once it is back.
            log.warning("trial %s deleted while the scheduler could not be reached: %s", trial.queue_id, error)
        except queue_client.SchedulerError:  # unknown to the scheduler: nothing left to stop
            pass
    paths = [*trial.spill_dirs, *trial.archive_dirs, *trial.checkpoint_dirs,
             *([trial.export_dir_for(trial.queue_id)] if trial.queue_id else []),
             *(trial.export_dir_for(c["from"]) for c in trial.continued)]  # the models continued since
    with transaction.atomic():
        trial.delete()
        transaction.on_commit(lambda: [shutil.rmtree(path, ignore_errors=True) for path in paths])


def experiment_delete(*, experiment: Experiment, actor: AbstractBaseUser) -> None:
    """Delete an experiment with its trials (cancelling what runs) and their files.
    Raises PermissionDenied unless `actor` may change the experiment."""
    experiment_require_change(actor=actor, experiment=experiment)
    with transaction.atomic():
        for trial in experiment.trials.all():
            _trial_delete(trial=trial)
        experiment.delete()
