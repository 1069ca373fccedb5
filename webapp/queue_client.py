"""The web app's client of the shard queue: the only `webapp` module that talks to it.

It calls the queue's operations (`worker.api`, through `webapp.worker_door`) with the web app's configuration
(``settings.HYDRA.worker``) and turns the queue's refusals and Redis outages into `SchedulerError`, whose
message is fit for the UI. The typed contract that crosses (jobs, trial records and states, controls) is the
door's: callers name it from there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from webapp.worker_door import (
    Control,
    Job,
    QueueError,
    TrialEvent,
    TrialExists,
    TrialNotFound,
    TrialRecord,
    TrialState,
    api,
)

WORKER_REPLY_TIMEOUT_S = 1.5


class SchedulerError(RuntimeError):
    """The scheduler refused or could not be reached; the message says which and why."""


class SchedulerUnavailable(SchedulerError):
    """Redis could not be reached, so nothing changed in the queue; the same call may succeed later."""


class TrialUnknown(SchedulerError):
    """The queue does not hold the trial (Redis lost its data, or it was never sent); nothing changed."""


def trial_submit(*, trial_id: str, job: Job, export_dir: str, team: str = "", priority: str = "normal",
                 host_bytes: int = 0, lane_bytes: int = 0, host_id: str | None = None) -> None:
    """Queue the trial on this host, as a trial of `team` (the devices are shared fairly between teams) at
    `priority` among the team's trials, whose spill store takes about `host_bytes` (admission waits until
    the host tier has room for them) and `lane_bytes` more for each device beyond the first its micro-batches
    run on at once, on `host_id` (default: this web app's own host).

    Submitting the same job under the same id again is one submission, not an error: a caller that cannot
    tell whether an earlier submit landed (it died, or lost its connection, before hearing back) repeats it.
    Raises SchedulerUnavailable (Redis down) or SchedulerError (a refused job, an id another job holds).
    """
    try:
        api.trial_submit(config=settings.HYDRA.worker, trial_id=trial_id, job=job, export_dir=export_dir, team=team,
                         priority=priority, host_bytes=host_bytes, lane_bytes=lane_bytes, host_id=host_id)
        return
    except TrialExists as error:
        taken = error
    except redis.RedisError as error:
        raise SchedulerUnavailable(f"The scheduler could not be reached: {error}") from error
    except (QueueError, ValueError) as error:  # ValueError: a bad id, or a JobError
        raise SchedulerError(f"The scheduler did not accept the trial: {error}") from error
    try:
        held = trial_record(trial_id=trial_id, host_id=host_id)
    except redis.RedisError as error:
        raise SchedulerUnavailable(f"The scheduler could not be reached: {error}") from error
    stored_job = json.loads(json.dumps(job.to_dict()))  # as the queue stores it: tuples become lists
    if held is None or held.job != stored_job or held.export_dir != export_dir:
        raise SchedulerError(f"The scheduler did not accept the trial: {taken}") from taken


def team_limits_send(weights: dict[str, float], quotas: dict[str, int], byte_quotas: dict[str, int], *,
                     host_id: str | None = None) -> None:
    """Give the scheduler of `host_id` (default: every known host) every team's fair-share weight and quotas
    of trials and of spill-store bytes at once (by team id, as trials are submitted), replacing the ones it
    had. Raises SchedulerUnavailable (Redis down)."""
    try:
        for host in [host_id] if host_id else api.hosts_known(config=settings.HYDRA.worker):
            api.team_limits_set(config=settings.HYDRA.worker, weights=weights, quotas=quotas,
                                byte_quotas=byte_quotas, host_id=host)
    except redis.RedisError as error:
        raise SchedulerUnavailable(f"The scheduler could not be reached: {error}") from error


def host_capacity_send(*, host_id: str, capacity_bytes: int | None) -> None:
    """Give `host_id`'s scheduler the host tier's capacity an administrator chose (None: the host keeps what
    its workers found). Raises SchedulerUnavailable (Redis down)."""
    try:
        api.host_capacity_set(config=settings.HYDRA.worker, host_id=host_id, capacity_bytes=capacity_bytes)
    except redis.RedisError as error:
        raise SchedulerUnavailable(f"The scheduler could not be reached: {error}") from error


def hosts_known() -> list[str]:
    """Every host whose device workers started against this Redis, and this web app's own. Raises
    SchedulerUnavailable (Redis down)."""
    try:
        return api.hosts_known(config=settings.HYDRA.worker)
    except redis.RedisError as error:
        raise SchedulerUnavailable(f"The scheduler could not be reached: {error}") from error


def host_place(*, host_bytes: int) -> str:
    """The host a new trial whose spill store takes `host_bytes` goes to: of the hosts whose devices answered
    lately and can hold it, the least loaded (this web app's own when none answered). Raises
    SchedulerUnavailable (Redis down)."""
    try:
        return api.host_place(config=settings.HYDRA.worker, host_bytes=host_bytes)
    except redis.RedisError as error:
        raise SchedulerUnavailable(f"The scheduler could not be reached: {error}") from error


def trial_control(*, trial_id: str, control: Control, host_id: str | None = None) -> TrialState:
    """Pause, resume or cancel a queued or running trial; returns the scheduler's state afterwards.

    Raises TrialUnknown for a trial the queue does not hold, SchedulerError when the scheduler refuses (a
    control the trial's state does not allow), and SchedulerUnavailable when it cannot be reached.
    """
    try:
        return TrialState(api.trial_control(config=settings.HYDRA.worker, trial_id=trial_id, control=control,
                                            host_id=host_id))
    except TrialNotFound as error:
        raise TrialUnknown(f"The scheduler does not hold trial {trial_id}: {error}") from error
    except QueueError as error:
        raise SchedulerError(f"The scheduler refused to {control} trial {trial_id}: {error}") from error
    except redis.RedisError as error:
        raise SchedulerUnavailable(f"The scheduler could not be reached: {error}") from error


def trial_record(*, trial_id: str, host_id: str | None = None) -> TrialRecord | None:
    """The queue's record of a trial, or None when the queue does not know it. Raises redis.RedisError."""
    try:
        return api.trial_get(config=settings.HYDRA.worker, trial_id=trial_id, host_id=host_id)
    except TrialNotFound:
        return None


def trial_states(*, host_id: str | None = None) -> dict[str, TrialState]:
    """Every trial in the queue of `host_id` (default: this host) -> its state. Raises redis.RedisError."""
    return {trial_id: TrialState(state) for trial_id, state in
            api.trial_states(config=settings.HYDRA.worker, host_id=host_id).items()}


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


def role_take(*, role: str, owner: str, ttl_s: float, host_id: str | None = None) -> bool:
    """Whether `owner` holds `role` of the host now (taking or renewing it). Raises redis.RedisError."""
    return api.role_take(config=settings.HYDRA.worker, role=role, owner=owner, ttl_s=ttl_s, host_id=host_id)


def role_holder(*, role: str, host_id: str | None = None) -> str | None:
    """Who holds `role` of the host, or None. Raises redis.RedisError."""
    return api.role_holder(config=settings.HYDRA.worker, role=role, host_id=host_id)


def heartbeat_set(*, name: str, host_id: str | None = None) -> None:
    api.heartbeat_set(config=settings.HYDRA.worker, name=name, host_id=host_id)


def heartbeat_age(*, name: str, host_id: str | None = None) -> float | None:
    """Seconds since the process `name` last said it was alive, or None if never. Raises redis.RedisError."""
    return api.heartbeat_age(config=settings.HYDRA.worker, name=name, host_id=host_id)


def workers_online(*, live_only: bool = False) -> list[dict[str, Any]]:
    """Every device worker that answered: ``{"name", "device", "host", "pid"}``; [] when Redis is down.

    The broadcast waits out its reply timeout for every worker there is. With `live_only` it asks only this
    host's workers whose device loops are alive (`api.live_workers`) and ends once they have answered: a page
    that sizes work for this host's devices answers at once, and asks nobody when no loop is alive."""
    config = settings.HYDRA.worker
    try:
        destination = api.live_workers(config=config) if live_only else None
        if destination == []:
            return []
        return api.workers_online(config=config, timeout_s=WORKER_REPLY_TIMEOUT_S, destination=destination)
    except (OSError, redis.RedisError):
        return []


@dataclass(frozen=True)
class HostQueue:
    """What this host's queue holds now, for the pages that show it: every trial's record (oldest first), the
    devices whose loops ran here (name -> ``epoch``, ``stop``, ``seen``: the time of their last survey, in
    seconds) and the fair-share weights of the teams with work (a team not named weighs 1)."""

    trials: list[TrialRecord]
    devices: dict[str, dict[str, str]]
    weights: dict[str, float]


def host_queue_read(*, host_id: str | None = None) -> HostQueue:
    """Read the host's trials, devices and teams' weights. Raises SchedulerUnavailable (Redis down).

    The scheduler's pure policy (`worker_door.timetable`) replays the scheduling rule over them, which is how
    the pages estimate when a waiting trial starts and when a trial ends."""
    config = settings.HYDRA.worker
    try:
        return HostQueue(trials=api.trial_list(config=config, host_id=host_id),
                         devices=api.devices_list(config=config, host_id=host_id),
                         weights=dict(api.shares_get(config=config, host_id=host_id).weights))
    except redis.RedisError as error:
        raise SchedulerUnavailable(f"The scheduler could not be reached: {error}") from error
