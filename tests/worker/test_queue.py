"""The Redis shard task queue: states, atomic claims, leases and control (worker/scheduling/queue/shard_queue.py)."""

from __future__ import annotations

import time

import pytest
import redis

from worker.contract import SyntheticJob
from worker.scheduling.policy import BaseShard, Candidate
from worker.scheduling.queue import (
    InvalidTransition,
    LeaseLost,
    ShardQueue,
    Survey,
    TrialExists,
    TrialNotFound,
)

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


def events(queue: ShardQueue) -> list[tuple[str, str]]:
    return [(fields["state"], fields["message"]) for _, fields in queue.client.xrange(queue.key("events"))]


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


def test_teams_are_charged_their_leased_units_and_a_late_team_arrives_at_the_least_usage(
    shard_queue: ShardQueue,
) -> None:
    runnable(shard_queue, "a1", units=4, unit_s=2.0, team="alpha")
    runnable(shard_queue, "a2", units=4, unit_s=2.0, team="alpha", priority="high")
    seen = survey(shard_queue)
    assert [c.trial_id for c in seen.candidates] == ["a2"]  # the team's highest priority with runnable trials
    assert (seen.candidates[0].team, seen.candidates[0].priority) == ("alpha", 2)
    assert seen.shares.usage == {"alpha": 0.0} and seen.shares.weights == {"alpha": 1.0}
    shard_queue.complete(shard_queue.claim("a2", "cpu0"), remaining_units=3, unit_s=2.0)
    shard_queue.claim("a2", "cpu1")
    assert survey(shard_queue).shares.usage["alpha"] == pytest.approx(4.0, rel=1e-3)  # two units leased

    runnable(shard_queue, "b1", units=2, unit_s=1.0, team="beta")
    seen = survey(shard_queue)
    assert seen.shares.usage["beta"] == pytest.approx(4.0, rel=1e-3)  # arrives at alpha's usage, not 0
    assert {c.trial_id for c in seen.candidates} == {"a1", "b1"} and "beta" not in seen.shares.served
    shard_queue.set_weights({"alpha": 4.0})
    assert survey(shard_queue).shares.weights == {"alpha": 4.0, "beta": 1.0}
    assert shard_queue.shares().weights == {"alpha": 4.0, "beta": 1.0}  # the same standing, read only
    assert shard_queue.shares().usage["beta"] == pytest.approx(4.0, rel=1e-3)

    # A team whose last trial ends no longer has work: its usage stays and counts again when it comes back.
    for _ in range(2):
        shard_queue.complete(shard_queue.claim("b1", "cpu0"), remaining_units=1 if _ == 0 else 0, unit_s=1.0)
    assert set(survey(shard_queue).shares.usage) == {"alpha"}


def test_usage_halves_every_half_life(shard_queue: ShardQueue, clock: Clock) -> None:
    shard_queue.configure(usage_half_life_s=100.0)
    runnable(shard_queue, "a1", units=4, unit_s=8.0, team="alpha")
    shard_queue.complete(shard_queue.claim("a1", "cpu0"), remaining_units=3, unit_s=8.0)
    clock.advance(200)
    assert survey(shard_queue).shares.usage["alpha"] == pytest.approx(2.0, rel=1e-3)


def test_it_refuses_bad_teams_priorities_and_weights(shard_queue: ShardQueue) -> None:
    with pytest.raises(ValueError, match="team"):
        shard_queue.submit(trial_id="t", job=SPEC, export_dir="", team="a:b")
    with pytest.raises(ValueError, match="priority"):
        shard_queue.submit(trial_id="t", job=SPEC, export_dir="", priority="urgent")
    with pytest.raises(ValueError, match="positive"):
        shard_queue.set_weights({"alpha": 0.0})
    with pytest.raises(ValueError, match="positive"):
        shard_queue.configure(usage_half_life_s=-1)


def finish(queue: ShardQueue, trial_id: str) -> None:
    """Plan `trial_id` (already claimed for planning by `job`) as one unit and run it to its end."""
    queue.complete(queue.claim(trial_id, "cpu0"), remaining_units=0, unit_s=1.0)


def test_a_team_at_its_quota_waits_to_be_planned_and_is_admitted_when_one_of_its_trials_ends(
    shard_queue: ShardQueue,
) -> None:
    shard_queue.set_quotas({"alpha": 1})
    for trial_id, team in (("a1", "alpha"), ("a2", "alpha"), ("b1", "beta")):
        shard_queue.submit(trial_id=trial_id, job=SPEC, export_dir="", team=team)
    job = shard_queue.claim_plan("cpu0")
    assert job.trial_id == "a1"
    shard_queue.plan_done(job, remaining_units=1, unit_s=1.0, plan={})
    assert shard_queue.claim_plan("cpu0").trial_id == "b1"  # a2 waits; beta has no quota
    assert shard_queue.claim_plan("cpu0") is None
    record = shard_queue.trial("a2")
    assert record.state == "planning" and "quota" in record.message
    # Until something changes that could admit a2, devices are not sent to scan for it at every unit.
    assert survey(shard_queue).planning == 0
    finish(shard_queue, "a1")
    assert survey(shard_queue).planning == 1
    assert shard_queue.claim_plan("cpu1").trial_id == "a2"
    assert shard_queue.trial("a2").message == ""
    records = {r.trial_id: r for r in shard_queue.trials()}
    assert (records["a2"].team, records["a2"].admitted, records["a1"].admitted) == ("alpha", True, False)


def test_trials_are_admitted_while_their_stores_fit_the_host_tier_and_one_that_never_fits_fails(
    shard_queue: ShardQueue,
) -> None:
    shard_queue.configure(capacity_bytes=100)
    shard_queue.submit(trial_id="big", job=SPEC, export_dir="", host_bytes=101)
    for trial_id, size in (("t1", 60), ("t2", 60), ("t3", 30)):
        shard_queue.submit(trial_id=trial_id, job=SPEC, export_dir="", host_bytes=size)
    job = shard_queue.claim_plan("cpu0")
    assert job.trial_id == "t1"
    record = shard_queue.trial("big")
    assert record.state == "failed" and "host tier" in record.message
    shard_queue.plan_done(job, remaining_units=1, unit_s=1.0, plan={})
    assert shard_queue.claim_plan("cpu0").trial_id == "t3"  # 60 + 30 fit; t2's 60 more would not
    assert "host memory" in shard_queue.trial("t2").message
    assert shard_queue.claim_plan("cpu0") is None
    finish(shard_queue, "t1")
    assert shard_queue.claim_plan("cpu0").trial_id == "t2"
    with pytest.raises(ValueError, match="host_bytes"):
        shard_queue.submit(trial_id="neg", job=SPEC, export_dir="", host_bytes=-1)
    with pytest.raises(ValueError, match="quotas"):
        shard_queue.set_quotas({"alpha": 0})


def test_admission_goes_in_fair_share_order_of_the_waiting_teams(shard_queue: ShardQueue) -> None:
    runnable(shard_queue, "a0", units=4, unit_s=5.0, team="alpha")
    shard_queue.complete(shard_queue.claim("a0", "cpu0"), remaining_units=3, unit_s=5.0)  # alpha used 5 s
    runnable(shard_queue, "b0", units=4, unit_s=1.0, team="beta")  # beta arrives at alpha's 5 s
    shard_queue.complete(shard_queue.claim("b0", "cpu0"), remaining_units=3, unit_s=1.0)  # beta: 6 s
    shard_queue.submit(trial_id="b1", job=SPEC, export_dir="", team="beta")  # the older one
    shard_queue.submit(trial_id="a1", job=SPEC, export_dir="", team="alpha")
    assert shard_queue.claim_plan("cpu0").trial_id == "a1"  # alpha has the smaller usage


def test_a_team_over_its_host_memory_quota_waits_and_an_administrator_s_capacity_takes_precedence(
    shard_queue: ShardQueue,
) -> None:
    shard_queue.set_quotas({}, {"alpha": 100})
    for trial_id, team, size in (("a1", "alpha", 70), ("a2", "alpha", 40), ("b1", "beta", 500)):
        shard_queue.submit(trial_id=trial_id, job=SPEC, export_dir="", team=team, host_bytes=size)
    assert shard_queue.claim_plan("cpu0").trial_id == "a1"
    assert shard_queue.claim_plan("cpu0").trial_id == "b1"  # a2's 40 more would take alpha past its 100
    assert "host memory of its team" in shard_queue.trial("a2").message
    # The host's workers found room for 10,000 bytes; an administrator allows 600: a1 and b1 take 570.
    shard_queue.configure(capacity_bytes=10_000)
    shard_queue.set_capacity_override(600)
    shard_queue.set_quotas({})
    assert shard_queue.claim_plan("cpu0") is None and "host memory" in shard_queue.trial("a2").message
    assert shard_queue.load().capacity_bytes == 600
    shard_queue.set_capacity_override(None)  # back to what the workers found
    assert shard_queue.claim_plan("cpu0").trial_id == "a2"
    with pytest.raises(ValueError, match="byte_quotas"):
        shard_queue.set_quotas({}, {"alpha": 0})
