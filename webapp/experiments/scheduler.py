"""The web app's one door to the scheduler (`worker.api`): submit and control trials.

Submitting is a Redis script, not a Celery task (the scheduler's workers pull units from the queue), so a
launch is sent with ``transaction.on_commit``, the same guarantee ``delay_on_commit`` gives: nothing reaches
the queue unless the rows that say "launched" are committed. `worker.api` is imported inside the functions:
it pulls in the engine's config module and Redis, which the web process need not load to render a page.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from django.db import transaction

log = logging.getLogger(__name__)

Control = Literal["pause", "resume", "cancel"]


class SchedulerError(RuntimeError):
    """The scheduler refused or could not be reached; the message says which and why."""


def submit_on_commit(*, trial_id: str, spec: dict[str, Any], export_dir: str, auto_budget: bool = False) -> None:
    """After the current transaction commits, queue the trial; a refusal fails the trial with the reason.

    With `auto_budget`, the device worker that plans the trial replaces its budget with its own device's
    (the web host may see no GPU, or other ones)."""

    def send() -> None:
        from webapp.experiments.services import trial_status_record

        try:
            from worker import api

            api.trial_submit(trial_id=trial_id, export_dir=export_dir,
                             spec={"kind": "engine", "trial": spec, "budget": "auto" if auto_budget else "explicit"})
        except Exception as error:  # any refusal (bad spec, Redis down) must reach the UI
            log.warning("trial %s could not be queued: %s", trial_id, error)
            trial_status_record(trial_id=trial_id, status="failed",
                                message=f"The scheduler did not accept the trial: {error}")

    transaction.on_commit(send)


def control(*, trial_id: str, action: Control) -> str:
    """Pause, resume or cancel a queued or running trial; returns the scheduler's state afterwards.

    Raises SchedulerError when the scheduler refuses (for example, a trial it does not know).
    """
    from redis import RedisError

    from worker import api
    from worker.scheduling.queue import QueueError

    function = {"pause": api.trial_pause, "resume": api.trial_resume, "cancel": api.trial_cancel}[action]
    try:
        return function(trial_id=trial_id)
    except QueueError as error:
        raise SchedulerError(f"The scheduler refused to {action} trial {trial_id}: {error}") from error
    except RedisError as error:
        raise SchedulerError(f"The scheduler could not be reached: {error}") from error

