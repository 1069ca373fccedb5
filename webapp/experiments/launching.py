"""Sending trials to the workers: a trial's job, its launch, and TPE's next trials.

A launch is an outbox. Its transaction moves the trial to ``planning`` with its job's spec and
``submitted`` false; once that commits (the guarantee Celery's ``delay_on_commit`` gives), `trial_send`
submits the job and marks the trial submitted. Nothing reaches the queue unless the rows that say
"launched" are committed, and a launch whose send never ran (the process died) or could not reach Redis
stays to submit until the reconciler (`webapp.experiments.reconcile`) sends it. Sending twice is one
submission, so the launch and the reconciler may race. A job the queue refuses fails that attempt at once
with the reason; it is not a trial event (the queue never knew the trial), so it does not ask TPE for
another trial.

A trial whose token ids are still being made (a pretrained model's tokenizer over the dataset:
`webapp.experiments.trial_data`) is launched but not sent: its send waits, saying so, until the ids are ready
(the reconciler's passes send it then), and fails the attempt if they cannot be made or its sequence length
drops every example of a split.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from webapp import queue_client
from webapp.experiments.chat_template import template_refusal
from webapp.experiments.memory_preview import auto_budget_bytes
from webapp.experiments.model_shapes import ModelChoiceError, model_shape
from webapp.experiments.objective import DPO
from webapp.experiments.planning import hyperparameters, total_steps, trial_plan, trial_spec
from webapp.experiments.pruning import trial_pruning
from webapp.experiments.search_space import parse_search_space
from webapp.experiments.trial_data import (
    TrialDataError,
    data_waiting,
    epoch_size,
    epoch_size_of,
    sent_data_fields,
    token_set_of,
    trial_data,
    trial_data_request,
)
from webapp.experiments.trial_generation import TPE_FIRST_WAVE, Outcome, next_tpe_trials
from webapp.ground.models import Experiment, Trial
from webapp.worker_door import Budget, EngineJob, SpecError, TrialSpec

log = logging.getLogger(__name__)
Status = Trial.Status


def memory_budget(*, explicit_bytes: int | None) -> tuple[int, str]:
    """The device budget in bytes and a note saying where it came from."""
    if explicit_bytes is not None:
        return explicit_bytes, "explicit"
    return auto_budget_bytes()


def trial_job(*, trial: Trial) -> EngineJob:
    """The job of `trial`'s next attempt. With no explicit memory budget, the device that plans it decides.
    A pretrained model's tokens of the dataset are asked for (once per dataset, tokenizer and chat template).
    Raises TrialDataError for data the trial cannot train on."""
    experiment = trial.experiment
    shape = model_shape(experiment.model, models_root=settings.HYDRA.models_root)
    refusal = template_refusal(dataset=experiment.dataset, shape=shape, chat_template=experiment.chat_template)
    if refusal is not None:
        raise TrialDataError(refusal)
    budget, _ = memory_budget(explicit_bytes=experiment.memory_budget_bytes)
    trial_data_request(shape=shape, dataset=experiment.dataset, chat_template=experiment.chat_template)
    data = trial_data(shape=shape, dataset=experiment.dataset, chat_template=experiment.chat_template)
    spec = trial_spec(params=trial.params, shape=shape, dataset=experiment.dataset, data=data,
                      steps=trial.total_steps,
                      eval_every=experiment.eval_every, seed=experiment.seed, budget_bytes=budget,
                      early_stop_patience=experiment.early_stop_patience, objective=experiment.objective)
    return EngineJob(trial=spec, budget=_budget_mode(experiment), checkpoint_minutes=experiment.checkpoint_minutes,
                     pruning=trial_pruning(trial=trial), max_devices=experiment.max_devices_per_trial)


def _budget_mode(experiment: Experiment) -> Budget:
    return "auto" if experiment.memory_budget_bytes is None else "explicit"


def trial_launch(*, trial: Trial) -> None:
    """Start a new attempt of a new, failed or cancelled trial: it moves to planning, to be submitted, and its
    job is sent once the current transaction commits. A trial whose values the engine refuses fails at once."""
    try:
        job: EngineJob | None = trial_job(trial=trial)
    except SpecError as error:
        job = None
        refusal = f"The scheduler did not accept the trial: engine trial spec is invalid: {error}"
    except ModelChoiceError as error:  # its checkpoint left the catalog since the experiment was made
        job = None
        refusal = f"The trial's model cannot be used: {error}"
    except TrialDataError as error:
        job = None
        refusal = f"The trial's data cannot be trained on: {error}"
    trial.attempt += 1
    trial.queue_id = trial.attempt_queue_id(trial.attempt)
    trial.submitted, trial.host = False, ""  # each attempt is placed anew
    trial.status = Status.PLANNING if job is not None else Status.FAILED
    trial.spec = job.trial.to_dict() if job is not None else None
    trial.message = "" if job is not None else refusal
    trial.step, trial.remaining_s, trial.started, trial.finished = 0, None, None, None
    trial.best_val_loss = trial.best_val_ppl = None
    trial.final_bpb = trial.final_loss = trial.final_ppl = trial.final_step = trial.final_eval_bytes = None
    trial.final_reward_accuracy = trial.final_reward_margin = None
    trial.checkpoint_step, trial.checkpoint_at = None, None  # an attempt's checkpoints are its own
    trial.save()
    if job is not None:
        queue_id = trial.queue_id
        transaction.on_commit(lambda: trial_send(queue_id=queue_id))


def trial_sent_job(*, trial: Trial, resume: bool = False) -> EngineJob:
    """The job the queue holds for `trial`'s current attempt, from the spec its launch stored; `resume` when it
    is sent again after the queue lost it (`webapp.experiments.reconcile`). A continued trial trains its added
    steps without the experiment's pruner: continuing it was someone's decision, which a rung reached long ago
    should not undo."""
    continue_from = continued_from(trial)
    return EngineJob(trial=TrialSpec.from_dict(trial.spec), budget=_budget_mode(trial.experiment), resume=resume,
                     continue_from=continue_from, checkpoint_minutes=trial.experiment.checkpoint_minutes,
                     pruning=trial_pruning(trial=trial) if continue_from is None else None,
                     max_devices=trial.experiment.max_devices_per_trial)


def continued_from(trial: Trial) -> str | None:
    """The queue id whose last checkpoint the trial's current queue id continues (`webapp.experiments.continuing`),
    or None when it trains from the start."""
    last = trial.continued[-1] if trial.continued else None
    return last["from"] if last is not None and last.get("queue_id") == trial.queue_id else None


def trial_send(*, queue_id: str) -> bool:
    """Submit the launched attempt `queue_id` if it is still to be submitted; returns whether this call marked it
    submitted (by its submit, or by finding that an earlier one landed).

    Any number of callers may call it for the same attempt, at once: the trial's row is locked while its job
    is sent, and a trial submitted, ended, retried or deleted meanwhile is left alone. When Redis cannot be
    reached the trial stays to submit, its message saying so; a job the queue refuses fails the attempt.
    """
    if not _placed(queue_id):
        return False
    with transaction.atomic():
        trial = (Trial.objects.select_for_update(of=("self",)).select_related("experiment")
                 .filter(queue_id=queue_id, status=Status.PLANNING, submitted=False).first())
        if trial is None:
            return False
        if not _data_ready(trial):
            return False
        job = trial_sent_job(trial=trial)
        try:
            queue_client.trial_submit(trial_id=queue_id, job=job, export_dir=str(trial.export_dir_for(queue_id)),
                                      team=str(trial.experiment.team_id), priority=trial.experiment.priority,
                                      host_bytes=trial.host_bytes(), lane_bytes=trial.lane_bytes(),
                                      host_id=trial.queue_host)
        except queue_client.SchedulerUnavailable as error:
            log.warning("trial %s not queued yet: %s", queue_id, error)
            trial.message = f"Waiting to be sent to the scheduler. {error}"
            trial.save(update_fields=["message", "updated"])
            return False
        except queue_client.SchedulerError as error:
            log.warning("trial %s could not be queued: %s", queue_id, error)
            trial.status, trial.message = Status.FAILED, str(error)
            trial.save(update_fields=["status", "message", "updated"])
            return False
        trial.submitted, trial.message = True, ""
        trial.save(update_fields=["submitted", "message", "updated"])
    return True


def _placed(queue_id: str) -> bool:
    """Choose the host of the attempt `queue_id` if it has none (`worker.scheduling.placement`), and commit the
    choice before anything is sent, so that a send repeated after a crash goes to the same host. False when
    the attempt is no longer to send, or no host could be asked (its message then says so)."""
    with transaction.atomic():
        trial = (Trial.objects.select_for_update(of=("self",))
                 .filter(queue_id=queue_id, status=Status.PLANNING, submitted=False).first())
        if trial is None:
            return False
        if trial.host:
            return True
        try:
            trial.host = queue_client.host_place(host_bytes=trial.host_bytes())
        except queue_client.SchedulerUnavailable as error:
            trial.message = f"Waiting to be sent to the scheduler. {error}"
            trial.save(update_fields=["message", "updated"])
            return False
        trial.save(update_fields=["host", "updated"])
    return True


def _data_ready(trial: Trial) -> bool:
    """Whether the locked `trial`'s token ids are ready to send it; if not, its message says why, and ids that
    cannot be made (or that its sequence length drops every example of a split of) fail it. Ids that became
    ready set an epoch budget's steps from their real count, and the final evaluation's held-out set."""
    data = trial.spec["data"]
    dataset = trial.experiment.dataset
    waiting = data_waiting(data=data, dataset=dataset,
                           vocab_size=trial.spec["model"]["vocab_size"])  # a pretrained model's: its config's
    if waiting is not None:
        message, final = waiting
        trial.message = message
        if final:
            trial.status = Status.FAILED
        trial.save(update_fields=["status", "message", "updated"])
        return False
    experiment = trial.experiment
    token_set = token_set_of(dataset=dataset, data=data)
    try:
        fields = sent_data_fields(data=data, dataset=dataset, token_set=token_set,
                                  holdout_bytes=experiment.holdout_bytes)
    except TrialDataError as error:
        trial.status, trial.message = Status.FAILED, f"The trial's data cannot be trained on: {error}"
        trial.save(update_fields=["status", "message", "updated"])
        return False
    if experiment.budget_unit == Experiment.BudgetUnit.EPOCHS and token_set is not None and not trial.continued:
        steps = total_steps(budget_unit=experiment.budget_unit, budget=experiment.budget,
                            batch_size=trial.spec["batch_size"], seq_len=data["seq_len"],
                            epoch=epoch_size_of(dataset=dataset, token_set=token_set))
        if steps != trial.total_steps:
            trial.total_steps, trial.spec = steps, {**trial.spec, "steps": steps}
            trial.save(update_fields=["total_steps", "spec", "updated"])
    if any(trial.spec["data"].get(key) != value for key, value in fields.items()):  # what the ready ids decide
        trial.spec = {**trial.spec, "data": {**trial.spec["data"], **fields}}
        trial.save(update_fields=["spec", "updated"])
    return True


def experiment_extend_tpe(*, experiment: Experiment) -> list[Trial]:
    """Keep a TPE experiment's first-wave number of trials in flight: ask TPE (told every result so far) for
    as many new trials as have ended, up to the experiment's count, and launch them if it was launched.
    Call it inside a transaction."""
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
    try:
        shape = model_shape(experiment.model, models_root=settings.HYDRA.models_root)
    except ModelChoiceError as error:  # its checkpoint left the catalog: the experiment cannot grow
        log.warning("experiment %s asks no more trials of TPE: %s", experiment.pk, error)
        return []
    budget, _ = memory_budget(explicit_bytes=experiment.memory_budget_bytes)
    dataset = experiment.dataset
    epoch = epoch_size(shape=shape, dataset=dataset, chat_template=experiment.chat_template)
    created = []
    for number, params in enumerate(proposals, start=len(trials) + 1):
        values = hyperparameters(params, shape)
        trial = Trial.objects.create(
            experiment=experiment, number=number, params=params,
            total_steps=total_steps(budget_unit=experiment.budget_unit, budget=experiment.budget,
                                    batch_size=int(values["batch_size"]), seq_len=int(values["seq_len"]),
                                    epoch=epoch),
            plan=trial_plan(params, shape=shape, vocab_size=dataset.vocab_size, budget_bytes=budget,
                            dpo_pairs=dataset.n_examples if experiment.objective == DPO else None),
        )
        if experiment.launched is not None:
            trial_launch(trial=trial)
        created.append(trial)
    return created
