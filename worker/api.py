"""The scheduler's API for the web app: submit trials, control them, read their state and telemetry.

Callers pass ids and plain JSON-able data and get plain data back; nothing here imports torch. A trial
lives on one host (its spill store is there); ``host_id`` defaults to this process's ``HYDRA_HOST_ID``.

    trial_submit(trial_id="42", spec={"kind": "engine", "trial": TrialSpec(...).to_dict()})
    trial_pause(trial_id="42") / trial_resume(...) / trial_cancel(...)   -> the state afterwards
    trial_get(trial_id="42") -> {"state": "running", "remaining_s": 12.5, ...}
    telemetry_read(stream="steps", after=cursor) -> {"entries": [...], "cursor": "1700000000000-0"}

Errors: ValueError for a bad spec or id, TrialExists, TrialNotFound, InvalidTransition (all QueueError).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import redis
from django.conf import settings

from worker.engine.config import TrialSpec
from worker.engine.errors import SpecError
from worker.scheduling import telemetry
from worker.scheduling.queue import ShardQueue
from worker.scheduling.synthetic import synthetic_spec


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def host_queue(host_id: str | None = None) -> ShardQueue:
    """The shard queue of `host_id` (default: this host) in the configured Redis."""
    return ShardQueue(_client(settings.HYDRA.redis_url), host_id or settings.HYDRA.host_id)


def spec_validate(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Check a trial spec and return it as plain data; raise ValueError saying what is wrong."""
    kind = spec.get("kind")
    if kind == "engine":
        budget = spec.get("budget", "explicit")
        if budget not in ("explicit", "auto"):
            raise ValueError(f"engine trial budget {budget!r} is unknown; use 'explicit' (the trial's budget_bytes) "
                             "or 'auto' (the planning device's memory).")
        try:
            trial = TrialSpec.from_dict(dict(spec["trial"])).to_dict()
        except (KeyError, TypeError, SpecError) as error:
            raise ValueError(f"engine trial spec is invalid: {error}") from error
        return {"kind": "engine", "trial": trial} | ({"budget": "auto"} if budget == "auto" else {})
    if kind == "synthetic":
        try:
            return synthetic_spec(units=spec["units"], unit_ms=spec.get("unit_ms", 0.0),
                                  fail_at_unit=spec.get("fail_at_unit"))
        except KeyError as error:
            raise ValueError(f"synthetic trial spec lacks {error}") from error
    raise ValueError(f"trial spec kind {kind!r} is unknown; use 'engine' or 'synthetic'.")


def trial_submit(
    *, trial_id: str, spec: Mapping[str, Any], export_dir: str | None = None, host_id: str | None = None
) -> None:
    """Queue a trial for planning on `host_id`; a finished trial exports its model to `export_dir`
    (default ``$HYDRA_DATA_DIR/exports/<host>/<trial_id>``)."""
    queue = host_queue(host_id)
    if export_dir is None:
        export_dir = str(settings.HYDRA.data_dir / "exports" / queue.host_id / trial_id)
    queue.submit(trial_id=trial_id, spec=spec_validate(spec), export_dir=export_dir)


def trial_pause(*, trial_id: str, host_id: str | None = None) -> str:
    """Pause at the next unit boundary; returns the state now (``paused``, or ``running`` until then)."""
    return host_queue(host_id).pause(trial_id)


def trial_resume(*, trial_id: str, host_id: str | None = None) -> str:
    return host_queue(host_id).resume(trial_id)


def trial_cancel(*, trial_id: str, host_id: str | None = None) -> str:
    """Cancel at the next unit boundary; returns the state now (``cancelled``, or ``running`` until then)."""
    return host_queue(host_id).cancel(trial_id)


def trial_get(*, trial_id: str, host_id: str | None = None) -> dict[str, Any]:
    """State, message, pending control, device, remaining units and seconds, plan... of one trial."""
    return asdict(host_queue(host_id).trial(trial_id))


def trial_list(*, host_id: str | None = None) -> list[dict[str, Any]]:
    return [asdict(record) for record in host_queue(host_id).trials()]


def telemetry_read(
    *, stream: str, after: str = "0-0", count: int = 1000, host_id: str | None = None
) -> dict[str, Any]:
    """Entries of `stream` (spans, steps, evals, samples, events) after cursor `after`, oldest first.

    Store the returned ``cursor`` with what you saved and pass it next time.
    """
    batch = telemetry.read(_client(settings.HYDRA.redis_url), host_id or settings.HYDRA.host_id, stream,
                           after=after, count=count)
    return {"entries": batch.entries, "cursor": batch.cursor}


def devices_list(*, host_id: str | None = None) -> dict[str, dict[str, str]]:
    """Devices whose loops ran on the host: name -> epoch, stop, seen (time of their last survey)."""
    return host_queue(host_id).devices()


def host_configure(*, lease_s: float, host_id: str | None = None) -> None:
    """Set how long a unit's lease lasts without renewal before another device re-runs the unit."""
    host_queue(host_id).configure(lease_s=lease_s)
