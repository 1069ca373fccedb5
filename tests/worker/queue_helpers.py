"""What the queue's tests share: a clock they move instead of sleeping, a `ShardQueue` on it, and the steps
that bring a trial to a state (submitted and planned, surveyed, its events read)."""

from __future__ import annotations

import time

import pytest
import redis

from worker.contract import SyntheticJob
from worker.scheduling.queue import ShardQueue, Survey

SPEC = SyntheticJob(units=3)


class Clock:
    """The clock these tests give the queue: this machine's time (Redis's, on the same machine) plus how far the
    test moved it forward."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead_s

    def advance(self, seconds: float) -> None:
        self.ahead_s += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def shard_queue(redis_client: redis.Redis, host_id: str, clock: Clock) -> ShardQueue:
    return ShardQueue(redis_client, host_id, clock=clock)


def survey(queue: ShardQueue, device: str = "cpu0") -> Survey:
    queue.device_start(device, "epoch-1")
    return queue.survey(device, "epoch-1")


def runnable(queue: ShardQueue, trial_id: str, *, units: int = 3, unit_s: float = 0.5, team: str = "",
             priority: str = "normal") -> None:
    """Submit and plan a trial so that it is runnable."""
    queue.submit(trial_id=trial_id, job=SPEC, export_dir=f"/exports/{trial_id}", team=team, priority=priority)
    job = queue.claim_plan("cpu0")
    assert job is not None and job.trial_id == trial_id
    assert queue.plan_done(job, remaining_units=units, unit_s=unit_s, plan={"shards": 2}) == "runnable"


def events(queue: ShardQueue) -> list[tuple[str, str]]:
    return [(fields["state"], fields["message"]) for _, fields in queue.client.xrange(queue.key("events"))]
