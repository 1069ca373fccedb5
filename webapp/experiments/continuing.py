"""Continuing a finished or pruned trial for more steps, from the state it ended with.

A trial's state lives in its spill store (host memory) while it trains; when it ends, the worker writes its
last commit to disk as a durable checkpoint (``HYDRA_DATA_DIR/checkpoints/<queue id>/``, when its experiment's
``checkpoint_minutes`` is above 0) and frees the store. That checkpoint, its parameters and optimizer state,
is what a continuation starts from: it is kept until the trial (or its experiment) is deleted, and costs its
size on disk, shown on the trial's page.

Continuing adds a segment of steps with its own peak learning rate, warm-up and decay (the engine's
``ContinuationSpec``), records it in ``Trial.continued`` and sends the trial again, under a new queue id
(``<attempt's id>-c<n>``, as an ended id is never queued twice) on the same host, whose job names the ended
queue id to start from (``EngineJob.continue_from``). The trial keeps its attempt, so its telemetry, keyed by
trial and attempt, goes on on the same curves, its steps counting on from where it ended. When the continued
trial finishes, its own last checkpoint replaces the one it started from. A continuation that failed or was
cancelled is retried as the same continuation, from the same checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from webapp.accounts.roles import require_creator_or_owner
from webapp.experiments.launching import continued_from, trial_send
from webapp.ground.models import Trial
from webapp.worker_door import SpecError, TrialSpec

Status = Trial.Status
CONTINUABLE = (Status.FINISHED, Status.PRUNED)
DECAYS = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class KeptState:
    """A trial's last checkpoint on disk: steps trained, and its bytes (parameters and optimizer state)."""

    path: Path
    step: int
    bytes: int


def kept_state(trial: Trial) -> KeptState | None:
    """The last committed checkpoint of the trial's current queue id (`worker.engine.durable`'s layout: the
    newest ``ckpt-<version>`` with its ``checkpoint.json``), or None."""
    if not trial.queue_id:
        return None
    root = settings.HYDRA.data_dir / "checkpoints" / trial.queue_id
    try:
        versions = sorted((int(p.name[5:]) for p in root.iterdir() if p.name.startswith("ckpt-")
                           and p.name[5:].isdigit()), reverse=True)
    except OSError:
        return None
    for version in versions:
        path = root / f"ckpt-{version}"
        try:
            meta = json.loads((path / "checkpoint.json").read_text())
            return KeptState(path=path, step=int(meta["step"]), bytes=int(meta["bytes"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def continue_blocker(trial: Trial) -> str | None:
    """Why the trial cannot be continued now, for the page; None when it can."""
    if trial.status not in CONTINUABLE:
        return "Only a finished or pruned trial can be continued."
    if kept_state(trial) is None:
        if not trial.experiment.checkpoint_minutes:
            return ("This trial has no checkpoint to continue from: its experiment takes no checkpoints "
                    "(checkpoint_minutes is 0), so its state was freed when it ended.")
        return "This trial has no checkpoint to continue from: its state was not kept on disk when it ended."
    return None


def trial_continue(*, trial: Trial, actor: AbstractBaseUser, steps: int, lr: float, warmup_steps: int = 0,
                   decay: str = "cosine") -> None:
    """Train the finished or pruned `trial` for `steps` more steps from its last checkpoint, at peak learning
    rate `lr` with `warmup_steps` of warm-up and then `decay` over the added steps. Raises PermissionDenied
    unless `actor` may change its experiment; ValidationError saying why it cannot be continued."""
    experiment = trial.experiment
    require_creator_or_owner(user=actor, team=experiment.team, created_by_id=experiment.created_by_id,
                             what=f"experiment {experiment.name!r}")
    limit = settings.HYDRA.caps.steps_per_trial
    if not 1 <= steps <= limit:
        raise ValidationError(f"Add from 1 to {limit} steps.")
    with transaction.atomic():
        trial = Trial.objects.select_for_update(of=("self",)).select_related("experiment").get(pk=trial.pk)
        blocker = continue_blocker(trial)
        if blocker is not None:
            raise ValidationError(blocker)
        kept = kept_state(trial)
        assert kept is not None and trial.spec is not None, "an ended trial with a checkpoint was sent with a spec"
        if kept.step + steps > limit:
            raise ValidationError(f"A trial trains at most {limit} steps; it trained {kept.step}, so add at most "
                                  f"{limit - kept.step}.")
        segment = {"after": kept.step, "steps": steps, "lr": lr, "warmup_steps": warmup_steps, "decay": decay}
        spec = {**trial.spec, "continuations": [*trial.spec.get("continuations", []), segment]}
        try:
            TrialSpec.from_dict(spec)
        except (SpecError, TypeError) as error:
            raise ValidationError(f"These steps cannot be added: {error}") from error
        number = len(trial.continued) + 1
        queue_id = f"{trial.attempt_queue_id(trial.attempt)}-c{number}"
        trial.continued = [*trial.continued, {**segment, "at": timezone.now().isoformat(), "queue_id": queue_id,
                                              "from": trial.queue_id}]
        _send_again(trial, queue_id=queue_id, spec=spec, total_steps=kept.step + steps)


def continue_again(trial: Trial) -> None:
    """Send the trial's last continuation again, from the same checkpoint, under a new queue id (it failed or
    was cancelled). Call it inside a transaction, with the trial locked."""
    last = trial.continued[-1]
    queue_id = f"{trial.attempt_queue_id(trial.attempt)}-c{len(trial.continued) + 1}"
    trial.continued = [*trial.continued, {**last, "at": timezone.now().isoformat(), "queue_id": queue_id}]
    _send_again(trial, queue_id=queue_id, spec=trial.spec, total_steps=trial.total_steps)


def continuing(trial: Trial) -> bool:
    """Whether the trial's current queue id is a continuation (its job starts from another's checkpoint)."""
    return continued_from(trial) is not None


def _send_again(trial: Trial, *, queue_id: str, spec: dict, total_steps: int) -> None:
    trial.queue_id, trial.spec, trial.total_steps = queue_id, spec, total_steps
    trial.status, trial.submitted, trial.message = Status.PLANNING, False, ""  # on the same host: Trial.host
    trial.remaining_s, trial.finished = None, None
    trial.save()
    transaction.on_commit(lambda: trial_send(queue_id=queue_id))
