"""The shard task queue's teams: usage charged per leased unit and halving over time, weights, quotas of
trials and of host memory, and admission in fair-share order while the stores fit the host."""

from __future__ import annotations

import pytest

from tests.worker.queue_helpers import SPEC, Clock, runnable, survey
from tests.worker.queue_helpers import clock as clock
from tests.worker.queue_helpers import shard_queue as shard_queue
from worker.scheduling.queue import ShardQueue


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
