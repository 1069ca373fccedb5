"""Planning a sweep's trials takes one device at a time from training (real device workers).

Two trials keep both devices training; eight more arrive, each taking a while to plan. They are planned one
after another, by one device at a time, while the other goes on training, instead of both devices stopping
to plan. A device learns that another is planning from its survey, so it goes on training without asking.
"""

from __future__ import annotations

import itertools

import pytest

from worker.contract import SyntheticJob
from worker.scheduling.queue import ShardQueue

pytestmark = pytest.mark.timeout(120)


def test_a_survey_says_whether_another_device_is_planning(shard_queue: ShardQueue) -> None:
    for device in ("cpu0", "cpu1"):
        shard_queue.device_start(device, "e1")
    for trial_id in ("a", "b"):
        shard_queue.submit(trial_id=trial_id, job=SyntheticJob(units=1), export_dir="")
    job = shard_queue.claim_plan("cpu0")
    assert job is not None

    other, planner = shard_queue.survey("cpu1", "e1"), shard_queue.survey("cpu0", "e1")
    assert (other.planning, other.planning_elsewhere) == (1, True)
    assert (planner.planning, planner.planning_elsewhere) == (1, False)  # its own planning is not elsewhere
    assert shard_queue.claim_plan("cpu1", idle=False) is None  # what the survey foretold

    shard_queue.plan_done(job, remaining_units=1, unit_s=0.01, plan={})
    after = shard_queue.survey("cpu1", "e1")
    assert (after.planning, after.planning_elsewhere) == (1, False)
    assert shard_queue.claim_plan("cpu1", idle=False) is not None


@pytest.mark.processes
def test_a_sweep_arriving_at_once_is_planned_by_one_device_while_the_other_trains(device_workers) -> None:
    workers = device_workers("cpu0", "cpu1")
    for trial_id in ("a", "b"):
        workers.queue.submit(trial_id=trial_id, job=SyntheticJob(units=200, unit_ms=10), export_dir="")
    workers.wait(lambda: sum(s["phase"] != "plan" for s in workers.entries("spans")) >= 20, 60,
                 "both long trials to train")
    sweep = [f"s{i}" for i in range(8)]
    for trial_id in sweep:
        workers.queue.submit(trial_id=trial_id, job=SyntheticJob(units=1, plan_ms=100), export_dir="")
    records = workers.wait_for_records(sweep, {"finished", "failed"}, 60)
    assert {r.state for r in records.values()} == {"finished"}

    spans = workers.entries("spans")
    plans = sorted((s for s in spans if s["phase"] == "plan" and s["trial"] in sweep), key=lambda s: float(s["start"]))
    assert len(plans) == 8
    # Never two plans at once: each starts after the one before it ended.
    for before, after in itertools.pairwise(plans):
        assert float(after["start"]) >= float(before["end"]), (before, after)
    # Meanwhile the device that was not planning trained: during every plan, the other device ran a unit of
    # the long trials from start to end (a plan takes ten units' time).
    training = [s for s in spans if s["trial"] in ("a", "b") and s["phase"] != "plan"]
    for plan in plans:
        assert any(s["device"] != plan["device"] and float(plan["start"]) <= float(s["start"])
                   and float(s["end"]) <= float(plan["end"]) for s in training), plan
    assert any(float(s["start"]) > float(plans[-1]["end"]) for s in training)  # they had work throughout
