"""The shard task queue's leases and holds: a unit put back when its lease expires, renewals, a planning
lease that lapses, and the device that holds a trial's activations going on with it."""

from __future__ import annotations

import pytest

from tests.worker.queue_helpers import SPEC, Clock, events, runnable, survey
from tests.worker.queue_helpers import clock as clock
from tests.worker.queue_helpers import shard_queue as shard_queue
from worker.scheduling.policy import BaseShard, Candidate
from worker.scheduling.queue import LeaseLost, ShardQueue

# Lease tests move the queue's clock (`Clock.advance`) instead of sleeping: a minute-long lease that the clock
# moves just short of, or well past, gives the same answer however slowly this machine runs.
LEASE_S = 60.0


def test_it_puts_a_unit_back_when_its_lease_expires(shard_queue: ShardQueue, clock: Clock) -> None:
    shard_queue.configure(lease_s=LEASE_S)
    runnable(shard_queue, "t1")
    lease = shard_queue.claim("t1", "cpu0")
    assert lease.lease_s == LEASE_S
    clock.advance(LEASE_S - 10)
    assert survey(shard_queue).candidates == [] and shard_queue.trial("t1").requeues == 0  # still leased
    assert shard_queue.renew("t1", lease.token)
    clock.advance(LEASE_S - 10)
    assert survey(shard_queue).candidates == []  # renewed: a lease from the renewal
    clock.advance(20)

    seen = survey(shard_queue)
    assert [c.trial_id for c in seen.candidates] == ["t1"]
    assert seen.units_done == {"t1": 0}  # the unit is re-run, not skipped
    assert shard_queue.trial("t1").requeues == 1
    assert not shard_queue.renew("t1", lease.token)
    with pytest.raises(LeaseLost, match="'t1'"):
        shard_queue.complete(lease, remaining_units=2, unit_s=0.5)
    assert shard_queue.claim("t1", "cpu1").units_done == 0


def test_a_device_holds_a_trial_whose_activations_it_keeps_until_the_hold_lapses(
    shard_queue: ShardQueue, clock: Clock
) -> None:
    runnable(shard_queue, "t1")
    shard_queue.complete(shard_queue.claim("t1", "cpu0"), remaining_units=2, unit_s=0.5, hold_s=60.0)
    assert survey(shard_queue, "cpu1").candidates == [Candidate("t1", 1.0, "cpu0", held_by="cpu0")]
    clock.advance(50)
    assert survey(shard_queue, "cpu1").candidates == [Candidate("t1", 1.0, "cpu0", held_by="cpu0")]
    clock.advance(20)
    assert survey(shard_queue, "cpu1").candidates == [Candidate("t1", 1.0, "cpu0")]  # a dead holder is passed
    shard_queue.complete(shard_queue.claim("t1", "cpu1"), remaining_units=1, unit_s=0.5, hold_s=60.0)
    assert survey(shard_queue).candidates[0].held_by == "cpu1"
    shard_queue.complete(shard_queue.claim("t1", "cpu1"), remaining_units=1, unit_s=0.5)  # the backward is through
    assert survey(shard_queue).candidates[0].held_by is None


def test_surveys_report_the_base_layers_each_trial_s_next_unit_reads(shard_queue: ShardQueue, clock: Clock) -> None:
    runnable(shard_queue, "t1", units=6, unit_s=1.0)
    layers = BaseShard("a1b2", 3, 7)
    shard_queue.complete(shard_queue.claim("t1", "cpu0"), remaining_units=5, unit_s=1.0, next_base=layers)
    assert survey(shard_queue, "cpu1").candidates == [Candidate("t1", 5.0, "cpu0", next_base=layers)]
    lease = shard_queue.claim("t1", "cpu1")
    clock.advance(24 * 3600)  # the lease expires: the same unit runs again
    assert survey(shard_queue, "cpu1").candidates[0].next_base == layers
    shard_queue.complete(shard_queue.claim("t1", "cpu1"), remaining_units=4, unit_s=1.0)  # reads no base
    assert survey(shard_queue).candidates[0].next_base is None
    shard_queue.complete(shard_queue.claim("t1", "cpu0"), remaining_units=3, unit_s=1.0, next_base=layers)
    shard_queue.replan(shard_queue.claim("t1", "cpu0"), remaining_units=9, unit_s=0.5, plan={}, message="oom")
    assert survey(shard_queue).candidates[0].next_base is None  # the new plan cuts the base elsewhere
    with pytest.raises(LeaseLost):
        shard_queue.complete(lease, remaining_units=4, unit_s=1.0)


def test_a_hold_ends_with_the_lease_of_its_holder(shard_queue: ShardQueue, clock: Clock) -> None:
    shard_queue.configure(lease_s=LEASE_S)
    runnable(shard_queue, "t1")
    shard_queue.complete(shard_queue.claim("t1", "cpu0"), remaining_units=2, unit_s=0.5, hold_s=100 * LEASE_S)
    shard_queue.claim("t1", "cpu0")  # the holder takes it back, then dies mid-unit
    clock.advance(LEASE_S + 10)
    assert survey(shard_queue, "cpu1").candidates == [Candidate("t1", 1.0, "cpu0")]


def test_a_device_goes_on_with_the_trial_it_holds_without_a_claim(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1", units=3)
    runnable(shard_queue, "t2", units=9)  # longer: a claim would pick it
    survey(shard_queue)  # the loop's epoch
    lease = shard_queue.claim("t1", "cpu0")
    state, seen, after = shard_queue.complete_then_survey(lease, "epoch-1", remaining_units=2, unit_s=0.5, hold_s=2.0)
    assert state == "running" and after is not None
    assert (after.trial_id, after.units_done, after.remaining_units) == ("t1", 1, 2)
    assert int(after.token) > int(lease.token) and after.job == lease.job
    assert [c.trial_id for c in seen.candidates] == ["t2"]  # t1 is leased again, not runnable
    state, _, after = shard_queue.complete_then_survey(after, "epoch-1", remaining_units=1, unit_s=0.5)
    assert (state, after) == ("runnable", None)  # the backward is through: no hold, the policy picks again
    assert shard_queue.trial("t1").units_done == 2


@pytest.mark.parametrize("reason", ["pause", "planning", "stopped", "old epoch"])
def test_a_held_trial_goes_back_to_the_policy_when_the_loop_must_look_first(
    shard_queue: ShardQueue, reason: str
) -> None:
    runnable(shard_queue, "t1")
    survey(shard_queue)
    lease = shard_queue.claim("t1", "cpu0")
    if reason == "pause":
        shard_queue.pause("t1")
    elif reason == "planning":
        shard_queue.submit(trial_id="t2", job=SPEC, export_dir="")
    elif reason == "stopped":
        shard_queue.device_stop("cpu0")
    epoch = "epoch-0" if reason == "old epoch" else "epoch-1"
    state, _, after = shard_queue.complete_then_survey(lease, epoch, remaining_units=2, unit_s=0.5, hold_s=2.0)
    assert after is None
    assert state == ("paused" if reason == "pause" else "runnable")


def test_it_renews_a_lease(shard_queue: ShardQueue, clock: Clock) -> None:
    shard_queue.configure(lease_s=LEASE_S)
    runnable(shard_queue, "t1")
    lease = shard_queue.claim("t1", "cpu0")
    for _ in range(3):  # three times 2/3 of the lease: it would have expired without the renewals
        clock.advance(LEASE_S * 2 / 3)
        assert shard_queue.renew("t1", lease.token)
        survey(shard_queue)
    assert shard_queue.trial("t1").requeues == 0
    assert shard_queue.complete(lease, remaining_units=2, unit_s=0.5) == "runnable"


def test_it_replans_when_a_planning_lease_expires(shard_queue: ShardQueue, clock: Clock) -> None:
    shard_queue.configure(lease_s=LEASE_S)
    shard_queue.submit(trial_id="t1", job=SPEC, export_dir="")
    stale = shard_queue.claim_plan("cpu0")
    assert survey(shard_queue).planning == 0
    clock.advance(LEASE_S + 10)
    assert survey(shard_queue).planning == 1
    job = shard_queue.claim_plan("cpu1")
    assert job.trial_id == "t1" and job.token != stale.token
    with pytest.raises(LeaseLost):
        shard_queue.plan_done(stale, remaining_units=1, unit_s=1.0, plan={})


def test_it_publishes_a_requeue_after_a_lost_lease(shard_queue: ShardQueue, clock: Clock) -> None:
    shard_queue.configure(lease_s=LEASE_S)
    runnable(shard_queue, "t1")
    shard_queue.claim("t1", "cpu1")
    clock.advance(LEASE_S + 10)
    survey(shard_queue)
    shard_queue.claim("t1", "cpu0")
    assert events(shard_queue)[-2:] == [
        ("runnable", "lease of cpu1 expired; the unit runs again"), ("running", "")
    ]
