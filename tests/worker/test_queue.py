"""The Redis shard task queue: states, atomic claims, planning, control and the events it publishes
(worker/scheduling/queue/shard_queue.py); leases and holds are `test_queue_leases`, teams and admission
`test_queue_fair_share`."""

from __future__ import annotations

import pytest
import redis

from tests.worker.queue_helpers import SPEC, events, runnable, survey
from tests.worker.queue_helpers import clock as clock
from tests.worker.queue_helpers import shard_queue as shard_queue
from worker.scheduling.policy import Candidate
from worker.scheduling.queue import InvalidTransition, LeaseLost, ShardQueue, TrialExists, TrialNotFound


def test_it_plans_a_submitted_trial_then_makes_it_runnable(shard_queue: ShardQueue) -> None:
    shard_queue.submit(trial_id="t1", job=SPEC, export_dir="/exports/t1")
    assert shard_queue.trial("t1").state == "planning"
    assert survey(shard_queue).planning == 1

    job = shard_queue.claim_plan("cpu1")
    assert job is not None and (job.trial_id, job.job) == ("t1", SPEC)
    assert shard_queue.claim_plan("cpu0") is None
    assert shard_queue.plan_done(job, remaining_units=4, unit_s=0.25, plan={"shards": 2}) == "runnable"

    record = shard_queue.trial("t1")
    assert (record.state, record.remaining_units, record.remaining_s, record.plan) == (
        "runnable", 4, 1.0, {"shards": 2}
    )
    assert survey(shard_queue).candidates == [Candidate("t1", 1.0, None)]


def test_it_scores_runnable_trials_by_remaining_time(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "short", units=2, unit_s=1.0)
    runnable(shard_queue, "long", units=5, unit_s=1.0)
    assert [c.trial_id for c in survey(shard_queue).candidates] == ["long", "short"]
    # Team "", priority normal; scored by minus the remaining seconds, so the longest comes first in ZRANGE.
    assert shard_queue.client.zscore(shard_queue.key("runnable::1"), "long") == -5.0


def test_it_claims_a_trial_once(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1")
    lease = shard_queue.claim("t1", "cpu0")
    assert lease is not None and (lease.units_done, lease.remaining_units, lease.job) == (0, 3, SPEC)
    assert shard_queue.claim("t1", "cpu1") is None
    assert shard_queue.trial("t1").state == "running"
    assert survey(shard_queue).candidates == []


def test_it_requeues_after_a_unit_and_finishes_after_the_last(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1", units=2)
    lease = shard_queue.claim("t1", "cpu0")
    assert shard_queue.complete(lease, remaining_units=1, unit_s=0.75) == "runnable"
    record = shard_queue.trial("t1")
    assert (record.units_done, record.last_device, record.remaining_s) == (1, "cpu0", 0.75)
    assert survey(shard_queue).candidates == [Candidate("t1", 0.75, "cpu0")]

    lease = shard_queue.claim("t1", "cpu1")
    assert lease.units_done == 1
    assert shard_queue.complete(lease, remaining_units=0, unit_s=0.75, message="stopped early") == "finished"
    assert survey(shard_queue).candidates == []
    assert (shard_queue.trial("t1").last_device, shard_queue.trial("t1").message) == ("cpu1", "stopped early")


def test_a_survey_takes_a_trial_to_plan_when_its_device_is_to_plan_next(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1", units=2)
    for device in ("cpu0", "cpu1"):
        shard_queue.device_start(device, "epoch-1")
    shard_queue.submit(trial_id="t2", job=SPEC, export_dir="")
    shard_queue.submit(trial_id="t3", job=SPEC, export_dir="")

    seen = shard_queue.survey("cpu0", "epoch-1", plan=True)
    assert seen.planned is not None and seen.planned.trial_id == "t2"  # the oldest, as claim_plan takes
    assert seen.claimed is None and shard_queue.trial("t2").state == "planning"
    # Another device with units to run goes on training meanwhile: its survey takes no trial to plan.
    _, other, _ = shard_queue.complete_then_survey(shard_queue.claim("t1", "cpu1"), "epoch-1", remaining_units=1,
                                                   unit_s=0.5, claim=["t1"], plan=True)
    assert other.planned is None and other.planning_elsewhere
    assert other.claimed is not None and other.claimed.trial_id == "t1"

    # None to plan can be admitted: the survey says there is none to plan rather than asking again.
    shard_queue.plan_done(seen.planned, remaining_units=1, unit_s=0.5, plan={})
    shard_queue.set_quotas({"": 1})
    blocked = shard_queue.survey("cpu0", "epoch-1", plan=True)
    assert (blocked.planned, blocked.planning) == (None, 0)
    assert shard_queue.trial("t3").state == "planning"


def test_it_pauses_and_resumes_a_runnable_trial_at_once(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1")
    assert shard_queue.pause("t1") == "paused"
    assert survey(shard_queue).candidates == []
    assert shard_queue.pause("t1") == "paused"
    assert shard_queue.resume("t1") == "runnable"
    assert [c.trial_id for c in survey(shard_queue).candidates] == ["t1"]


def test_a_sweep_submitted_paused_is_planned_then_released_at_once(shard_queue: ShardQueue) -> None:
    for trial_id in ("t1", "t2", "t3"):
        shard_queue.submit(trial_id=trial_id, job=SPEC, export_dir="", paused=True)
    for _ in range(3):
        job = shard_queue.claim_plan("cpu0")
        assert shard_queue.plan_done(job, remaining_units=2, unit_s=0.5, plan={}) == "paused"
    assert survey(shard_queue).candidates == [] and shard_queue.states() == dict.fromkeys(("t1", "t2", "t3"),
                                                                                            "paused")
    assert shard_queue.resume_all(["t1", "t2", "t3"]) == ["runnable"] * 3
    assert {c.trial_id for c in survey(shard_queue).candidates} == {"t1", "t2", "t3"}
    with pytest.raises(TrialNotFound):
        shard_queue.resume_all(["t1", "t9"])


def test_it_pauses_a_running_trial_at_the_end_of_its_unit(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1")
    lease = shard_queue.claim("t1", "cpu0")
    assert shard_queue.pause("t1") == "running"
    assert shard_queue.trial("t1").control == "pause"
    assert shard_queue.complete(lease, remaining_units=2, unit_s=0.5) == "paused"
    assert shard_queue.trial("t1").control == ""
    assert survey(shard_queue).candidates == []


def test_it_drops_a_pending_pause_on_resume(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1")
    lease = shard_queue.claim("t1", "cpu0")
    shard_queue.pause("t1")
    assert shard_queue.resume("t1") == "running"
    assert shard_queue.complete(lease, remaining_units=2, unit_s=0.5) == "runnable"


def test_it_cancels_at_once_or_at_the_end_of_the_unit(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "idle")
    runnable(shard_queue, "busy")
    shard_queue.submit(trial_id="unplanned", job=SPEC, export_dir="")
    lease = shard_queue.claim("busy", "cpu0")

    assert shard_queue.cancel("idle") == "cancelled"
    assert shard_queue.cancel("unplanned") == "cancelled"
    assert shard_queue.cancel("busy") == "running"
    assert shard_queue.complete(lease, remaining_units=2, unit_s=0.5) == "cancelled"
    seen = survey(shard_queue)
    assert (seen.planning, seen.candidates) == (0, [])
    assert shard_queue.cancel("busy") == "cancelled"


def test_it_cancels_a_trial_being_planned_when_planning_ends(shard_queue: ShardQueue) -> None:
    shard_queue.submit(trial_id="t1", job=SPEC, export_dir="")
    job = shard_queue.claim_plan("cpu0")
    assert shard_queue.cancel("t1") == "planning"
    assert shard_queue.plan_done(job, remaining_units=3, unit_s=1.0, plan={}) == "cancelled"


def test_it_fails_one_trial_with_its_message_and_leaves_the_others(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "bad")
    runnable(shard_queue, "good", units=2)
    lease = shard_queue.claim("bad", "cpu0")
    assert shard_queue.fail("bad", lease.token, "ValueError: loss is nan at step 3") == "failed"
    record = shard_queue.trial("bad")
    assert (record.state, record.message) == ("failed", "ValueError: loss is nan at step 3")
    assert [c.trial_id for c in survey(shard_queue).candidates] == ["good"]


def test_it_refuses_transitions_that_make_no_sense(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1", units=1)
    lease = shard_queue.claim("t1", "cpu0")
    shard_queue.complete(lease, remaining_units=0, unit_s=1.0)
    with pytest.raises(InvalidTransition, match="cannot resume trial 't1': it is finished"):
        shard_queue.resume("t1")
    with pytest.raises(InvalidTransition):
        shard_queue.cancel("t1")
    with pytest.raises(TrialNotFound, match="'nope'"):
        shard_queue.pause("nope")
    with pytest.raises(TrialNotFound):
        shard_queue.trial("nope")


def test_it_refuses_duplicate_and_malformed_ids(shard_queue: ShardQueue) -> None:
    shard_queue.submit(trial_id="t1", job=SPEC, export_dir="")
    with pytest.raises(TrialExists, match="'t1'"):
        shard_queue.submit(trial_id="t1", job=SPEC, export_dir="")
    with pytest.raises(ValueError, match="trial id"):
        shard_queue.submit(trial_id="a b", job=SPEC, export_dir="")


def test_it_publishes_state_changes_but_not_the_flips_between_units(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1", units=3)
    shard_queue.complete(shard_queue.claim("t1", "cpu0"), remaining_units=2, unit_s=1.0)
    shard_queue.complete(shard_queue.claim("t1", "cpu1"), remaining_units=1, unit_s=1.0)
    shard_queue.pause("t1")
    shard_queue.resume("t1")
    shard_queue.complete(shard_queue.claim("t1", "cpu0"), remaining_units=0, unit_s=1.0)
    assert [state for state, _ in events(shard_queue)] == [
        "planning", "runnable", "running", "paused", "runnable", "running", "finished"
    ]


def test_it_swaps_the_plan_of_a_replanned_trial_and_makes_it_runnable(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "t1", units=6, unit_s=1.0)
    shard_queue.complete(shard_queue.claim("t1", "cpu0"), remaining_units=5, unit_s=1.0)
    lease = shard_queue.claim("t1", "cpu1")
    assert shard_queue.replan(lease, remaining_units=9, unit_s=0.5, plan={"shards": 3},
                              message="re-planned after out-of-memory") == "runnable"
    record = shard_queue.trial("t1")
    assert (record.state, record.plan, record.remaining_s, record.units_done, record.replans) == (
        "runnable", {"shards": 3}, 4.5, 1, 1)
    assert survey(shard_queue).candidates == [Candidate("t1", 4.5, "cpu1")]
    assert events(shard_queue)[-1] == ("runnable", "re-planned after out-of-memory")
    with pytest.raises(LeaseLost):  # its lease ended with the re-plan
        shard_queue.complete(lease, remaining_units=8, unit_s=0.5)

    lease = shard_queue.claim("t1", "cpu0")
    shard_queue.pause("t1")
    assert shard_queue.replan(lease, remaining_units=12, unit_s=0.5, plan={"shards": 4}, message="again") == "paused"
    assert shard_queue.trial("t1").replans == 2


def test_it_hands_each_ended_trial_to_one_survey_to_free_its_state(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "cancelled")
    runnable(shard_queue, "failed")
    runnable(shard_queue, "finished", units=1)
    shard_queue.cancel("cancelled")
    shard_queue.fail("failed", shard_queue.claim("failed", "cpu0").token, "boom")
    shard_queue.complete(shard_queue.claim("finished", "cpu0"), remaining_units=0, unit_s=1.0)
    assert [survey(shard_queue, "cpu0").reap, survey(shard_queue, "cpu1").reap, survey(shard_queue).reap] == [
        "cancelled", "failed", None]


def test_it_keeps_every_key_under_the_host_namespace(
    shard_queue: ShardQueue, redis_client: redis.Redis, host_id: str
) -> None:
    runnable(shard_queue, "t1")
    shard_queue.claim("t1", "cpu0")
    keys = set(redis_client.scan_iter(match=f"*{host_id}*"))
    assert keys and all(key.startswith(f"hydra:{host_id}:") for key in keys)
    assert survey(ShardQueue(redis_client, f"{host_id}-other")).candidates == []
    assert [record.trial_id for record in shard_queue.trials()] == ["t1"]


def test_it_tells_a_device_loop_to_end_when_stopped_or_superseded(shard_queue: ShardQueue) -> None:
    shard_queue.device_start("cpu0", "old")
    assert shard_queue.survey("cpu0", "old").alive
    shard_queue.device_start("cpu0", "new")
    assert not shard_queue.survey("cpu0", "old").alive
    assert shard_queue.survey("cpu0", "new").alive
    shard_queue.device_stop("cpu0")
    assert not shard_queue.survey("cpu0", "new").alive
    assert shard_queue.devices()["cpu0"]["epoch"] == "new"
