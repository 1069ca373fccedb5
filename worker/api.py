"""The workers' API for whoever submits trials (the web app, through its one client module): submit trials,
control them, read their state and telemetry.

Every call names the `WorkerConfig` it works under (the web app passes the one in its settings; a device
worker its own) and a host (default: the config's). Jobs are typed (`worker.contract`); what comes back is
the contract's records or plain data. Nothing here imports torch or Django.

Errors: JobError for a job that cannot run, ValueError for a bad id; TrialExists, TrialNotFound,
InvalidTransition (all QueueError); redis.RedisError when Redis cannot be reached.
"""

from __future__ import annotations

import functools
from typing import Any

import redis

from worker.config import WorkerConfig
from worker.contract import Control, Job, TrialRecord
from worker.devices import worker_node
from worker.scheduling import telemetry
from worker.scheduling.keys import HOSTS_KEY
from worker.scheduling.placement import place
from worker.scheduling.policy import Shares
from worker.scheduling.queue import ShardQueue


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def host_queue(config: WorkerConfig, host_id: str | None = None) -> ShardQueue:
    """The shard queue of `host_id` (default: the config's host) in the configured Redis."""
    return ShardQueue(_client(config.redis_url), host_id or config.host_id)


def trial_submit(
    *, config: WorkerConfig, trial_id: str, job: Job, export_dir: str | None = None, host_id: str | None = None,
    team: str = "", priority: str = "normal", host_bytes: int = 0, lane_bytes: int = 0,
) -> None:
    """Queue a trial of `team` for planning on `host_id`; a finished trial exports its model to `export_dir`
    (default ``<data dir>/exports/<host>/<trial_id>``). See `ShardQueue.submit` for the bytes."""
    queue = host_queue(config, host_id)
    if export_dir is None:
        export_dir = str(config.data_dir / "exports" / queue.host_id / trial_id)
    queue.submit(trial_id=trial_id, job=job, export_dir=export_dir, team=team, priority=priority,
                 host_bytes=host_bytes, lane_bytes=lane_bytes)


def team_limits_set(*, config: WorkerConfig, weights: dict[str, float], quotas: dict[str, int],
                    byte_quotas: dict[str, int] | None = None, host_id: str | None = None) -> None:
    """Set the teams' fair-share weights (a team not named weighs 1) and quotas of trials and of spill-store
    bytes at once (a team not named has none) on `host_id`."""
    queue = host_queue(config, host_id)
    queue.set_weights(weights)
    queue.set_quotas(quotas, byte_quotas)


def host_capacity_set(*, config: WorkerConfig, host_id: str, capacity_bytes: int | None) -> None:
    """Set the host tier's capacity an administrator chose for `host_id`, or drop it (None)."""
    host_queue(config, host_id).set_capacity_override(capacity_bytes)


def trial_control(*, config: WorkerConfig, trial_id: str, control: Control, host_id: str | None = None) -> str:
    """Pause, resume or cancel (`worker.contract.CONTROL_TRANSITIONS`); returns the state now, which for a
    trial whose unit is in flight is still ``running`` (or ``planning``) until that unit ends."""
    queue = host_queue(config, host_id)
    return {"pause": queue.pause, "resume": queue.resume, "cancel": queue.cancel}[Control(control)](trial_id)


def trial_get(*, config: WorkerConfig, trial_id: str, host_id: str | None = None) -> TrialRecord:
    """State, message, pending control, device, remaining units and seconds, plan... of one trial."""
    return host_queue(config, host_id).trial(trial_id)


def trial_list(*, config: WorkerConfig, host_id: str | None = None) -> list[TrialRecord]:
    return host_queue(config, host_id).trials()


def trial_states(*, config: WorkerConfig, host_id: str | None = None) -> dict[str, str]:
    """Every trial of the host -> its state (what `trial_list` says, without reading each job)."""
    return host_queue(config, host_id).states()


def telemetry_read(
    *, config: WorkerConfig, stream: str, after: str = "0-0", count: int = 1000, host_id: str | None = None
) -> telemetry.Batch:
    """Entries of `stream` (spans, steps, evals, samples, events) after cursor `after`, oldest first.

    Store the returned ``cursor`` with what you saved and pass it next time.
    """
    return telemetry.read(_client(config.redis_url), host_id or config.host_id, stream, after=after, count=count)


def devices_list(*, config: WorkerConfig, host_id: str | None = None) -> dict[str, dict[str, str]]:
    """Devices whose loops ran on the host: name -> epoch, stop, seen (time of their last survey)."""
    return host_queue(config, host_id).devices()


def hosts_known(*, config: WorkerConfig) -> list[str]:
    """Every host whose device workers ever started against this Redis, and this config's own host."""
    return sorted(set(_client(config.redis_url).zrange(HOSTS_KEY, 0, -1)) | {config.host_id})


def host_place(*, config: WorkerConfig, host_bytes: int) -> str:
    """The host a new trial whose spill store takes `host_bytes` goes to (`worker.scheduling.placement`)."""
    loads = [host_queue(config, host).load() for host in hosts_known(config=config)]
    return place(loads, host_bytes, default=config.host_id)


def shares_get(*, config: WorkerConfig, host_id: str | None = None) -> Shares:
    """The fair-share standing of the teams with work on `host_id`: decayed usage (device seconds), weight,
    when each was last served (ms)."""
    return host_queue(config, host_id).shares()


def workers_online(*, config: WorkerConfig, timeout_s: float, destination: list[str] | None = None,
                   ) -> list[dict[str, Any]]:
    """Ask every device worker (or those of `destination`, Celery node names) which device it is bound to (a
    Celery broadcast each one answers): one ``{"name", "device", "host", "pid"}`` per worker that answered within
    `timeout_s`; with `destination`, the answer comes as soon as every named worker has answered."""
    from worker.celery_app import app

    replies = app.control.broadcast("hydra_device", reply=True, timeout=timeout_s, destination=destination,
                                    limit=len(destination) if destination else None) or []
    return [
        {"name": name, **(info if isinstance(info, dict) else {})}
        for reply in replies for name, info in reply.items()
    ]


def live_workers(*, config: WorkerConfig, host_id: str | None = None) -> list[str]:
    """The Celery node names of the host's device workers whose loops surveyed their queue lately
    (`ShardQueue.live_devices`)."""
    host = host_id or config.host_id
    return [worker_node(device, host) for device in host_queue(config, host).live_devices()]


def heartbeat_set(*, config: WorkerConfig, name: str, host_id: str | None = None) -> None:
    """Record that the process `name` (e.g. ``ingest``) serving `host_id` is alive now (Redis's clock)."""
    queue = host_queue(config, host_id)
    seconds, micros = queue.client.time()
    queue.client.hset(queue.key("heartbeats"), name, seconds + micros / 1e6)


# Take the role `KEYS[1]` for owner ARGV[1] for ARGV[2] ms, or keep it if that owner holds it: 1; else 0.
_ROLE_TAKE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""


def role_take(*, config: WorkerConfig, role: str, owner: str, ttl_s: float, host_id: str | None = None) -> bool:
    """Whether `owner` holds `role` (e.g. ``reconciler``) of `host_id` now, for `ttl_s` more seconds: it
    takes the role when nobody holds it (or its holder stopped renewing), and renews it when it holds it.
    One process at a time does what the role names."""
    queue = host_queue(config, host_id)
    return bool(queue.client.eval(_ROLE_TAKE, 1, queue.key(f"role:{role}"), owner, int(ttl_s * 1000)))


def role_holder(*, config: WorkerConfig, role: str, host_id: str | None = None) -> str | None:
    """The owner holding `role` of `host_id`, or None."""
    queue = host_queue(config, host_id)
    holder: str | None = queue.client.get(queue.key(f"role:{role}"))
    return holder


def heartbeat_age(*, config: WorkerConfig, name: str, host_id: str | None = None) -> float | None:
    """Seconds since `name` last called `heartbeat_set` for `host_id`, or None if it never did."""
    queue = host_queue(config, host_id)
    seen = queue.client.hget(queue.key("heartbeats"), name)
    if seen is None:
        return None
    seconds, micros = queue.client.time()
    return max(0.0, seconds + micros / 1e6 - float(seen))
