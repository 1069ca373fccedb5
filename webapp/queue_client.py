"""The web app's one door to the workers: the only `webapp` module that talks to the shard queue.

It wraps `worker.api` with the web app's configuration (``settings.HYDRA.worker``) and turns the queue's
refusals and Redis outages into `SchedulerError`, whose message is fit for the UI. It also re-exports the
typed contract (`worker.contract`) and the engine's trial spec that the web app builds jobs from, so that
what crosses the layers is named in one place. Nothing here imports torch: `worker.contract` and
`worker.engine.config` are torch-free.
"""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings

from worker import api
from worker.contract import (
    ENDED,
    Control,
    EngineJob,
    Job,
    QueueError,
    TrialEvent,
    TrialNotFound,
    TrialRecord,
    TrialState,
    control_changes,
)
from worker.engine.config import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSpec
from worker.engine.errors import SpecError

__all__ = [
    "ENDED", "Control", "DataSpec", "EngineJob", "Job", "ModelSpec", "OptimizerSpec",
    "ScheduleSpec", "SchedulerError", "SpecError", "TrialEvent", "TrialRecord", "TrialSpec", "TrialState",
    "control_changes", "events_read", "heartbeat_age", "heartbeat_set", "trial_control", "trial_record",
    "trial_submit", "workers_online",
]

WORKER_REPLY_TIMEOUT_S = 1.5


class SchedulerError(RuntimeError):
    """The scheduler refused or could not be reached; the message says which and why."""


def trial_submit(*, trial_id: str, job: Job, export_dir: str) -> None:
    """Queue the trial on this host. Raises SchedulerError (a refused job, a known id, Redis down)."""
    try:
        api.trial_submit(config=settings.HYDRA.worker, trial_id=trial_id, job=job, export_dir=export_dir)
    except (QueueError, ValueError, redis.RedisError) as error:  # ValueError: a bad id, or a JobError
        raise SchedulerError(f"The scheduler did not accept the trial: {error}") from error


def trial_control(*, trial_id: str, control: Control) -> TrialState:
    """Pause, resume or cancel a queued or running trial; returns the scheduler's state afterwards.

    Raises SchedulerError when the scheduler refuses (for example, a trial it does not know).
    """
    try:
        return TrialState(api.trial_control(config=settings.HYDRA.worker, trial_id=trial_id, control=control))
    except QueueError as error:
        raise SchedulerError(f"The scheduler refused to {control} trial {trial_id}: {error}") from error
    except redis.RedisError as error:
        raise SchedulerError(f"The scheduler could not be reached: {error}") from error


def trial_record(*, trial_id: str, host_id: str | None = None) -> TrialRecord | None:
    """The queue's record of a trial, or None when the queue does not know it. Raises redis.RedisError."""
    try:
        return api.trial_get(config=settings.HYDRA.worker, trial_id=trial_id, host_id=host_id)
    except TrialNotFound:
        return None


def telemetry_read(
    *, stream: str, after: str, count: int, host_id: str | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Entries of a telemetry stream after cursor `after`, and the cursor to pass next time.
    Raises redis.RedisError."""
    batch = api.telemetry_read(config=settings.HYDRA.worker, stream=stream, after=after, count=count,
                               host_id=host_id)
    return batch.entries, batch.cursor


def events_read(*, after: str, count: int, host_id: str | None = None) -> tuple[list[TrialEvent], str]:
    """Trial state changes after cursor `after`, oldest first, and the cursor to pass next time.
    Entries that cannot be parsed are skipped. Raises redis.RedisError."""
    entries, cursor = telemetry_read(stream="events", after=after, count=count, host_id=host_id)
    events = []
    for entry in entries:
        try:
            events.append(TrialEvent.from_entry(entry))
        except ValueError:
            continue
    return events, cursor


def heartbeat_set(*, name: str, host_id: str | None = None) -> None:
    api.heartbeat_set(config=settings.HYDRA.worker, name=name, host_id=host_id)


def heartbeat_age(*, name: str, host_id: str | None = None) -> float | None:
    """Seconds since the process `name` last said it was alive, or None if never. Raises redis.RedisError."""
    return api.heartbeat_age(config=settings.HYDRA.worker, name=name, host_id=host_id)


def workers_online() -> list[dict[str, Any]]:
    """Every device worker that answered: ``{"name", "device", "host", "pid"}``; [] when Redis is down."""
    try:
        return api.workers_online(config=settings.HYDRA.worker, timeout_s=WORKER_REPLY_TIMEOUT_S)
    except (OSError, redis.RedisError):
        return []
