"""A survey reads a bounded slice of the runnable trials, and the policy decides on it as on all of them.

The unit cycle (survey, claim, complete) must cost the same with a thousand runnable trials as with four, so
the survey reads each team's longest trials and two small affinity views (trials last run on the asking
device, trials whose next unit reads the base layers it holds) instead of the whole set. These tests build
large queues with every kind of candidate and compare the policy's choice on what the survey returns with
its choice on every runnable trial, read from the trials' records.
"""

from __future__ import annotations

import random

import redis

from tests.worker.queue_helpers import Clock
from worker.contract import SyntheticJob
from worker.scheduling.policy import BaseShard, Candidate, pick
from worker.scheduling.queue import SURVEY_HEAD, ShardQueue

JOB = SyntheticJob(units=1000)


def make_runnable(queue: ShardQueue, trial_id: str, *, units: int, unit_s: float = 1.0, team: str = "",
                  priority: str = "normal") -> None:
    queue.submit(trial_id=trial_id, job=JOB, export_dir="", team=team, priority=priority)
    job = queue.claim_plan("planner")
    assert job is not None and job.trial_id == trial_id
    assert queue.plan_done(job, remaining_units=units, unit_s=unit_s, plan={}) == "runnable"


def run_unit(queue: ShardQueue, trial_id: str, device: str, *, hold_s: float = 0.0,
             next_base: BaseShard | None = None) -> None:
    lease = queue.claim(trial_id, device)
    assert lease is not None
    queue.complete(lease, remaining_units=lease.remaining_units - 1, unit_s=lease.unit_s, hold_s=hold_s,
                   next_base=next_base)


def every_candidate(queue: ShardQueue, now_s: float) -> list[Candidate]:
    """Every runnable trial as the policy sees it at `now_s`, from the trials' own records (what a survey that
    read the whole runnable set would return)."""
    now_ms = now_s * 1000
    candidates = []
    for record in queue.trials():
        if record.state != "runnable":
            continue
        fields = queue.client.hgetall(queue.key(f"trial:{record.trial_id}"))
        held = float(fields.get("held_until", 0)) > now_ms
        candidates.append(Candidate(record.trial_id, record.remaining_s, record.last_device or None,
                                    record.last_device if held else None, BaseShard.parse(fields.get("next_base", "")),
                                    record.team, record.priority))
    return candidates


def test_a_survey_of_a_thousand_runnable_trials_reads_a_handful_and_the_policy_picks_as_over_all(
        redis_client: redis.Redis, host_id: str) -> None:
    clock = Clock()
    shard_queue = ShardQueue(redis_client, host_id, clock=clock)
    rng = random.Random(7)
    for i in range(1000):
        make_runnable(shard_queue, f"t{i:04d}", units=rng.choice([40, 41, 42, 60]), team=rng.choice(["a", "b"]))
    base = [BaseShard("base", 0, 4), BaseShard("base", 4, 8)]
    for i in rng.sample(range(1000), 60):  # units on the three devices, some leaving base reads and holds
        run_unit(shard_queue, f"t{i:04d}", rng.choice(["cpu0", "cpu1", "cpu2"]), next_base=rng.choice([None, *base]),
                 hold_s=rng.choice([0.0, 0.0, 600.0]))
    picks = set()
    for lapse_s in (0, 700):  # with the holds, then after they lapsed
        if lapse_s:
            clock.advance(lapse_s)
        for device in ("cpu0", "cpu1", "cpu2", "cpu3"):
            shard_queue.device_start(device, "e")
            for holding in (None, *base):
                seen = shard_queue.survey(device, "e", holding=holding)
                everything = every_candidate(shard_queue, clock())
                held_here = sum(c.held_by == device for c in everything)
                # Per team: the head, at most one trial held by each other device, two affinity candidates.
                assert len(seen.candidates) <= held_here + 2 * (SURVEY_HEAD + 3 + 2)
                chosen = pick(seen.candidates, device, holding, seen.shares)
                assert chosen is not None and chosen == pick(everything, device, holding, seen.shares)
                picks.add((chosen.trial_id, chosen.held_by == device, chosen.last_device == device,
                           chosen.next_base is not None and chosen.next_base.overlaps(holding)))
    # The comparison covered each rule: a held trial, affinity by last device, by base layers, and none.
    assert {p[1:] for p in picks} >= {(True, True, False), (False, True, False), (False, False, False)}
    assert any(p[3] for p in picks)


def test_trials_with_the_same_remaining_time_come_smallest_id_first(shard_queue: ShardQueue) -> None:
    for trial_id in ("t3", "t10", "t2", "t1"):
        make_runnable(shard_queue, trial_id, units=5)
    shard_queue.device_start("cpu0", "e")
    assert [c.trial_id for c in shard_queue.survey("cpu0", "e").candidates] == ["t1", "t10", "t2", "t3"][:SURVEY_HEAD]


def test_a_device_sees_the_trial_it_holds_and_the_trials_it_has_affinity_with_beyond_the_head(
        shard_queue: ShardQueue) -> None:
    for i in range(20):
        make_runnable(shard_queue, f"long{i:02d}", units=100)
    make_runnable(shard_queue, "held", units=3)  # far from the head: only the holder needs to see it
    run_unit(shard_queue, "held", "cpu0", hold_s=600.0)
    make_runnable(shard_queue, "mine", units=96)  # within the tie of the longest, last run on cpu1
    run_unit(shard_queue, "mine", "cpu1")
    make_runnable(shard_queue, "reads", units=97)  # within the tie, its next unit reads layers cpu2 holds
    run_unit(shard_queue, "reads", "cpu3", next_base=BaseShard("x", 2, 6))
    for device in ("cpu0", "cpu1", "cpu2"):
        shard_queue.device_start(device, "e")

    held = shard_queue.survey("cpu0", "e")
    assert "held" in {c.trial_id for c in held.candidates}
    assert pick(held.candidates, "cpu0", None, held.shares).trial_id == "held"
    mine = shard_queue.survey("cpu1", "e")
    assert pick(mine.candidates, "cpu1", None, mine.shares).trial_id == "mine"
    reads = shard_queue.survey("cpu2", "e", holding=BaseShard("x", 0, 3))
    assert pick(reads.candidates, "cpu2", BaseShard("x", 0, 3), reads.shares).trial_id == "reads"
    other_layers = shard_queue.survey("cpu2", "e", holding=BaseShard("x", 6, 9))
    assert pick(other_layers.candidates, "cpu2", BaseShard("x", 6, 9), other_layers.shares).trial_id == "long00"
    assert len(reads.candidates) <= SURVEY_HEAD + 1  # the head, and the one trial of the base view it needed


def test_one_device_at_a_time_leaves_training_to_plan_and_an_idle_one_plans_too(shard_queue: ShardQueue) -> None:
    for i in range(3):
        shard_queue.submit(trial_id=f"p{i}", job=JOB, export_dir="")
    first = shard_queue.claim_plan("cpu0", idle=False)
    assert first is not None
    assert shard_queue.claim_plan("cpu1", idle=False) is None  # cpu0 plans: cpu1 goes on training
    assert shard_queue.claim_plan("cpu0", idle=False) is not None  # the planner itself plans on
    second = shard_queue.claim_plan("cpu1", idle=True)  # nothing to train: it plans as well
    assert second is not None
    shard_queue.plan_done(second, remaining_units=3, unit_s=1.0, plan={})
    assert shard_queue.claim_plan("cpu1", idle=False) is None  # cpu0's planning goes on


def test_a_device_holding_a_trial_goes_on_with_it_while_another_device_plans(shard_queue: ShardQueue) -> None:
    make_runnable(shard_queue, "t", units=10)
    shard_queue.device_start("cpu0", "e")
    lease = shard_queue.claim("t", "cpu0")
    shard_queue.submit(trial_id="waiting", job=JOB, export_dir="")
    shard_queue.submit(trial_id="waiting2", job=JOB, export_dir="")
    # No device plans yet: the holder leaves the trial to plan (it is free when its unit ends).
    state, _, after = shard_queue.complete_then_survey(lease, "e", remaining_units=9, unit_s=1.0, hold_s=60.0)
    assert (state, after) == ("runnable", None)
    assert shard_queue.claim_plan("cpu1", idle=False) is not None  # cpu1 plans
    lease = shard_queue.claim("t", "cpu0")
    state, _, after = shard_queue.complete_then_survey(lease, "e", remaining_units=8, unit_s=1.0, hold_s=60.0)
    assert state == "running" and after is not None  # cpu0 goes on training meanwhile
