"""The speculative claim: a survey claims the device's guess of its policy's choice, which the policy then
confirms or gives back as it was (worker/scheduling/queue/speculative.py)."""

from __future__ import annotations

import pytest
import redis

from tests.worker.queue_helpers import SPEC, Clock, events, runnable, survey
from worker.scheduling.queue import LeaseLost, ShardQueue


def standing(queue: ShardQueue, trial_id: str) -> dict[str, object]:
    """What a claim changes and a speculative claim given back must restore, apart from the lease token."""
    record, client = queue.trial(trial_id), queue.client
    fields = client.hgetall(queue.key(f"trial:{trial_id}"))
    return {"state": record.state, "message": record.message, "device": fields.get("device"),
            "active": fields.get("active"), "score": client.zscore(queue.key("runnable::1"), trial_id),
            "leased": client.zscore(queue.key("leases"), trial_id) is not None,
            "served": client.hgetall(queue.key("served")), "usage": queue.shares().usage.get("", 0.0),
            "events": len(events(queue))}


@pytest.mark.parametrize("active", [False, True])
def test_a_survey_claims_the_guess_and_gives_it_back_as_it_was(shard_queue: ShardQueue, active: bool) -> None:
    runnable(shard_queue, "t1", units=2)
    runnable(shard_queue, "t2", units=3)
    survey(shard_queue)
    if active:  # t2 has run a unit: its claims publish nothing
        shard_queue.complete(shard_queue.claim("t2", "cpu1"), remaining_units=3, unit_s=0.5)
    lease = shard_queue.claim("t1", "cpu0")
    before = standing(shard_queue, "t2")

    state, seen, after = shard_queue.complete_then_survey(lease, "epoch-1", remaining_units=1, unit_s=0.5,
                                                          claim=["t9", "t2", "t1"])
    assert (state, after) == ("runnable", None)
    # The survey was taken before its claim: t2 is a candidate, and the claim took it (t9 is no trial).
    assert [c.trial_id for c in seen.candidates] == ["t2", "t1"]
    assert seen.claimed is not None and (seen.claimed.trial_id, seen.claimed.units_done) == ("t2", int(active))
    assert shard_queue.trial("t2").state == "running"
    assert standing(shard_queue, "t2")["usage"] == pytest.approx(before["usage"] + 0.5, abs=1e-3)

    # The policy chose otherwise: t2 goes back as it was (the policy's choice here is no trial at all).
    assert shard_queue.unclaim_then_claim(seen.claimed, ["t9"]) is None
    assert standing(shard_queue, "t2") == {
        **before, "usage": pytest.approx(before["usage"], abs=1e-3),
        # Its claim published 'running' unless it was between units; giving it back says 'runnable' again.
        "events": before["events"] + (0 if active else 2)}
    with pytest.raises(LeaseLost):
        shard_queue.complete(seen.claimed, remaining_units=2, unit_s=0.5)  # its lease is gone


@pytest.mark.parametrize(("control", "ended"), [("pause", "paused"), ("cancel", "cancelled")])
def test_a_claim_given_back_honours_a_pause_or_cancel_asked_meanwhile(
    shard_queue: ShardQueue, control: str, ended: str
) -> None:
    runnable(shard_queue, "t1", units=2)
    runnable(shard_queue, "t2", units=3)
    survey(shard_queue)
    _, seen, _ = shard_queue.complete_then_survey(shard_queue.claim("t1", "cpu0"), "epoch-1", remaining_units=1,
                                                  unit_s=0.5, claim=["t2"])
    assert getattr(shard_queue, control)("t2") == "running"  # in flight: it waits for the claim to end
    taken = shard_queue.unclaim_then_claim(seen.claimed, ["t2", "t1"])  # the policy's choice, in the same trip
    assert taken is not None and taken.trial_id == "t1"
    assert (shard_queue.trial("t2").state, shard_queue.trial("t2").control) == (ended, "")
    assert shard_queue.client.zscore(shard_queue.key("runnable::1"), "t2") is None


@pytest.mark.parametrize("reason", ["planning", "stopped"])
def test_a_survey_claims_nothing_when_the_device_is_to_plan_or_stop(shard_queue: ShardQueue, reason: str) -> None:
    runnable(shard_queue, "t1", units=2)
    runnable(shard_queue, "t2", units=3)
    survey(shard_queue)
    lease = shard_queue.claim("t1", "cpu0")
    if reason == "planning":  # and no other device plans it: this one plans next
        shard_queue.submit(trial_id="t3", job=SPEC, export_dir="")
    else:
        shard_queue.device_stop("cpu0")
    _, seen, _ = shard_queue.complete_then_survey(lease, "epoch-1", remaining_units=1, unit_s=0.5, claim=["t2"])
    assert (seen.claimed, seen.planned, seen.alive) == (None, None, reason != "stopped")
    assert shard_queue.trial("t2").state == "runnable"


def test_a_completion_whose_lease_was_lost_still_hands_over_its_survey_and_claim(
    redis_client: redis.Redis, host_id: str
) -> None:
    clock = Clock()
    queue = ShardQueue(redis_client, host_id, clock=clock)
    runnable(queue, "t1", units=2)
    runnable(queue, "t2", units=3)
    survey(queue)
    lease = queue.claim("t1", "cpu0")
    clock.advance(60)  # the lease expires; another device's survey requeues t1
    survey(queue, "cpu1")
    with pytest.raises(LeaseLost) as lost:
        queue.complete_then_survey(lease, "epoch-1", remaining_units=1, unit_s=0.5, claim=["t2"])
    assert lost.value.survey.claimed.trial_id == "t2"  # the loop goes on with it
    assert queue.trial("t2").state == "running"


def test_a_claim_whose_lease_expired_before_it_was_given_back_stays_as_the_expiry_left_it(
    redis_client: redis.Redis, host_id: str
) -> None:
    clock = Clock()
    queue = ShardQueue(redis_client, host_id, clock=clock)
    runnable(queue, "t1", units=2)
    runnable(queue, "t2", units=3)
    survey(queue)
    _, seen, _ = queue.complete_then_survey(queue.claim("t1", "cpu0"), "epoch-1", remaining_units=1, unit_s=0.5,
                                            claim=["t2"])
    clock.advance(60)  # the claim's lease expires: a survey puts t2 back, charged for the unit it never ran
    survey(queue, "cpu1")
    requeued = standing(queue, "t2")
    assert (requeued["state"], requeued["leased"], queue.trial("t2").requeues) == ("runnable", False, 1)

    assert queue.unclaim_then_claim(seen.claimed, []) is None  # nothing to give back
    assert standing(queue, "t2") == {**requeued, "usage": pytest.approx(requeued["usage"], abs=1e-3)}
    taken = queue.unclaim_then_claim(seen.claimed, ["t2"])  # the policy's choice is claimed all the same
    assert taken is not None and (taken.trial_id, taken.units_done) == ("t2", 0)
