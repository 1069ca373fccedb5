"""A trial on several devices in the queue: lanes leased apart, work-conserving widening, per-lane expiry and
fencing, admission by width, and controls that wait for every lane (worker/scheduling/queue)."""

from __future__ import annotations

import pytest

from tests.worker.queue_helpers import Clock, runnable, survey
from tests.worker.queue_helpers import clock as clock
from tests.worker.queue_helpers import shard_queue as shard_queue
from worker.contract import EngineJob
from worker.engine.config import DataSpec, TrialSpec
from worker.scheduling.queue import LeaseLost, ShardQueue

# 4 micro-batches a step: at most 4 devices at once; 3 with max_devices.
FOUR = TrialSpec(data=DataSpec(tokens_path="tokens.npy", seq_len=8), batch_size=4, micro_batches=4)


def wide(queue: ShardQueue, trial_id: str, *, units: int = 20, unit_s: float = 0.5, ready: tuple[int, ...] = (0,),
         max_devices: int | None = None, host_bytes: int = 0, lane_bytes: int = 0, team: str = "") -> None:
    """Submit and plan a trial of 4 micro-batches so that it is runnable, with `ready` lanes."""
    queue.submit(trial_id=trial_id, job=EngineJob(trial=FOUR, max_devices=max_devices), export_dir="", team=team,
                 host_bytes=host_bytes, lane_bytes=lane_bytes)
    job = queue.claim_plan("cpu0")
    assert job is not None and job.trial_id == trial_id
    assert queue.plan_done(job, remaining_units=units, unit_s=unit_s, plan={}, ready=ready, ready_version=1) == \
        "runnable"


def test_a_trial_takes_a_second_device_for_another_lane_only_when_nothing_else_can_run(shard_queue: ShardQueue
                                                                                       ) -> None:
    wide(shard_queue, "a")
    first = shard_queue.claim("a", "cpu0")
    assert (first.lane, shard_queue.trial("a").devices) == (0, ["cpu0"])
    assert not [c for c in survey(shard_queue, "cpu1").candidates if c.widening]  # lane 1 cannot run yet
    shard_queue.complete(first, remaining_units=19, unit_s=0.5, ready=[0, 1], ready_version=2)
    second = shard_queue.claim("a", "cpu0")
    (candidate,) = survey(shard_queue, "cpu1").candidates
    assert candidate.trial_id == "a" and candidate.widening
    third = shard_queue.claim("a", "cpu1")
    assert (second.lane, third.lane) == (0, 1)
    record = shard_queue.trial("a")
    assert (record.state, record.devices, record.width) == ("running", ["cpu0", "cpu1"], 4)
    assert shard_queue.claim("a", "cpu2") is None  # both ready lanes are in flight
    runnable(shard_queue, "b", units=3)
    assert [c.trial_id for c in survey(shard_queue, "cpu2").candidates if not c.widening] == ["b"]


def test_a_lane_that_frees_up_while_its_trial_s_holder_goes_on_wakes_an_idle_device(shard_queue: ShardQueue) -> None:
    wide(shard_queue, "a")
    survey(shard_queue, "cpu0")  # the holder's loop is current: it goes on with its lane
    first = shard_queue.claim("a", "cpu0")
    shard_queue.client.delete(shard_queue.key("wake"))  # what woke the devices for the runnable trial is taken
    # The holder goes on with lane 0 (the trial never becomes runnable, the wake-up that makes): lane 1 is ready now.
    _, _, second = shard_queue.complete_then_survey(first, "epoch-1", remaining_units=19, unit_s=0.5, hold_s=2.0,
                                                    ready=[0, 1], ready_version=2)
    assert second is not None and second.lane == 0
    assert shard_queue.client.llen(shard_queue.key("wake")) == 1  # an idle device's wait ends at once
    # The holder's next unit leaves lane 1 free still: the trial stays widening, and wakes no device again.
    shard_queue.client.delete(shard_queue.key("wake"))
    _, _, third = shard_queue.complete_then_survey(second, "epoch-1", remaining_units=18, unit_s=0.5, hold_s=2.0,
                                                   ready=[0, 1], ready_version=3)
    assert third is not None and shard_queue.client.llen(shard_queue.key("wake")) == 0
    (candidate,) = survey(shard_queue, "cpu1").candidates
    assert candidate.widening and shard_queue.claim("a", "cpu1").lane == 1


def test_the_newest_commit_s_view_of_lanes_and_units_wins_whatever_order_completions_arrive_in(
        shard_queue: ShardQueue) -> None:
    wide(shard_queue, "a", ready=(0, 1))
    lane0, lane1 = shard_queue.claim("a", "cpu0"), shard_queue.claim("a", "cpu1")
    assert (lane0.lane, lane1.lane) == (0, 1)
    # lane 1 committed last (version 3) but its completion arrives first
    assert shard_queue.complete(lane1, remaining_units=18, unit_s=0.5, ready=[1, 2], ready_version=3) == "running"
    assert shard_queue.complete(lane0, remaining_units=19, unit_s=0.5, ready=[0, 1], ready_version=2) == "runnable"
    record = shard_queue.trial("a")
    assert (record.remaining_units, record.units_done, record.devices) == (18, 2, [])
    assert [shard_queue.claim("a", "cpu0").lane, shard_queue.claim("a", "cpu1").lane] == [1, 2]


def test_an_expired_lane_runs_again_with_the_token_of_the_lease_that_expired_and_the_others_go_on(
        shard_queue: ShardQueue, clock: Clock) -> None:
    shard_queue.configure(lease_s=5.0)
    wide(shard_queue, "a", ready=(0, 1))
    lane0 = shard_queue.claim("a", "cpu0")
    clock.advance(3.0)
    lane1 = shard_queue.claim("a", "cpu1")  # a lease of 5 s from now
    clock.advance(3.0)  # lane 0's lease is 6 s old, lane 1's 3 s
    survey(shard_queue, "cpu2")
    record = shard_queue.trial("a")
    assert (record.state, record.devices, record.requeues) == ("running", ["cpu1"], 1)
    with pytest.raises(LeaseLost):
        shard_queue.complete(lane0, remaining_units=19, unit_s=0.5, ready=[0, 1], ready_version=2)
    again = shard_queue.claim("a", "cpu2")
    assert (again.lane, again.expired) == (0, lane0.token)
    assert shard_queue.complete(lane1, remaining_units=19, unit_s=0.5, ready=[1], ready_version=2) == "running"


def test_a_pause_waits_for_every_lane_and_no_lane_starts_meanwhile(shard_queue: ShardQueue) -> None:
    wide(shard_queue, "a", ready=(0, 1, 2))
    lane0, lane1 = shard_queue.claim("a", "cpu0"), shard_queue.claim("a", "cpu1")
    assert shard_queue.pause("a") == "running"
    assert shard_queue.claim("a", "cpu2") is None
    assert not survey(shard_queue, "cpu2").candidates
    assert shard_queue.complete(lane0, remaining_units=19, unit_s=0.5, ready=[0, 1, 2], ready_version=2) == "running"
    assert shard_queue.complete(lane1, remaining_units=18, unit_s=0.5, ready=[0, 1, 2], ready_version=3) == "paused"


def test_a_failed_lane_fails_the_trial_and_refuses_the_others(shard_queue: ShardQueue) -> None:
    wide(shard_queue, "a", ready=(0, 1))
    lane0, lane1 = shard_queue.claim("a", "cpu0"), shard_queue.claim("a", "cpu1")
    assert shard_queue.fail("a", lane0.token, "unit 3 failed on cpu0: boom") == "failed"
    with pytest.raises(LeaseLost):
        shard_queue.complete(lane1, remaining_units=19, unit_s=0.5, ready=[1], ready_version=2)
    assert shard_queue.trial("a").devices == []


def test_a_replan_ends_the_other_lanes_leases(shard_queue: ShardQueue) -> None:
    wide(shard_queue, "a", ready=(0, 1))
    lane0, lane1 = shard_queue.claim("a", "cpu0"), shard_queue.claim("a", "cpu1")
    assert shard_queue.replan(lane0, remaining_units=30, unit_s=0.3, plan={"shards": 3}, message="re-planned",
                              ready=[0], ready_version=5) == "runnable"
    with pytest.raises(LeaseLost):
        shard_queue.complete(lane1, remaining_units=19, unit_s=0.5, ready=[1], ready_version=3)
    assert (shard_queue.trial("a").remaining_units, shard_queue.claim("a", "cpu1").lane) == (30, 0)


def test_admission_makes_a_trial_as_wide_as_the_host_has_room_for_and_its_cap(shard_queue: ShardQueue) -> None:
    shard_queue.configure(capacity_bytes=1000)
    wide(shard_queue, "roomy", host_bytes=100, lane_bytes=100)  # 4 micro-batches: 400 bytes
    wide(shard_queue, "capped", host_bytes=100, lane_bytes=100, max_devices=2)  # 200 bytes
    wide(shard_queue, "tight", host_bytes=200, lane_bytes=150)  # 400 bytes taken: only 2 lanes fit
    widths = {t: (shard_queue.trial(t).width, shard_queue.trial(t).width_cap) for t in ("roomy", "capped", "tight")}
    assert widths == {"roomy": (4, 4), "capped": (2, 2), "tight": (2, 4)}
    assert shard_queue.load().admitted_bytes == 400 + 200 + 350


def test_a_narrow_trial_never_takes_a_second_device(shard_queue: ShardQueue) -> None:
    wide(shard_queue, "a", ready=(0, 1), max_devices=1)
    assert shard_queue.claim("a", "cpu0") is not None
    assert shard_queue.claim("a", "cpu1") is None
    assert not survey(shard_queue, "cpu1").candidates


def test_a_lane_given_back_brings_the_engine_s_view_so_it_is_not_leased_again_until_it_can_run(
        shard_queue: ShardQueue) -> None:
    """The queue's view can be behind the store's: a store restored from its checkpoint is back at an earlier
    unit, where only lane 0 can run. The lane given back says so, and the next lease is lane 0's."""
    wide(shard_queue, "a", ready=(1,))
    stale = shard_queue.claim("a", "cpu0")
    assert stale.lane == 1
    assert shard_queue.unclaim(stale, remaining_units=26, ready=[0], ready_version=1_000_000) == "runnable"
    record = shard_queue.trial("a")
    assert (record.remaining_units, record.units_done, record.devices) == (26, 0, [])
    assert shard_queue.claim("a", "cpu0").lane == 0


def test_a_lane_given_back_with_an_older_view_than_the_queue_s_leaves_the_newer_one(shard_queue: ShardQueue) -> None:
    wide(shard_queue, "a", ready=(0, 1))
    lane0, lane1 = shard_queue.claim("a", "cpu0"), shard_queue.claim("a", "cpu1")
    assert shard_queue.complete(lane0, remaining_units=19, unit_s=0.5, ready=[0, 2], ready_version=3) == "running"
    assert shard_queue.unclaim(lane1, remaining_units=20, ready=[0], ready_version=2) == "runnable"
    assert shard_queue.trial("a").remaining_units == 19
    assert [shard_queue.claim("a", "cpu0").lane, shard_queue.claim("a", "cpu1").lane] == [0, 2]
