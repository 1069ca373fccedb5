"""Planning a sweep's trials takes one device at a time from training (real device workers).

Two trials keep both devices training; eight more arrive, each taking a while to plan. They are planned one
after another, by one device at a time, while the other goes on training, instead of both devices stopping
to plan.
"""

from __future__ import annotations

import itertools

import pytest

from worker.contract import SyntheticJob

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def test_a_sweep_arriving_at_once_is_planned_by_one_device_while_the_other_trains(device_workers) -> None:
    workers = device_workers("cpu0", "cpu1")
    for trial_id in ("a", "b"):
        workers.queue.submit(trial_id=trial_id, job=SyntheticJob(units=200, unit_ms=10), export_dir="")
    workers.wait(lambda: sum(s["phase"] != "plan" for s in workers.entries("spans")) >= 20, 60,
                 "both long trials to train")
    sweep = [f"s{i}" for i in range(8)]
    for trial_id in sweep:
        workers.queue.submit(trial_id=trial_id, job=SyntheticJob(units=1, plan_ms=100), export_dir="")
    records = workers.wait_for_states(sweep, {"finished", "failed"}, 60)
    assert {r.state for r in records.values()} == {"finished"}

    spans = workers.entries("spans")
    plans = sorted((s for s in spans if s["phase"] == "plan" and s["trial"] in sweep), key=lambda s: float(s["start"]))
    assert len(plans) == 8
    # Never two plans at once: each starts after the one before it ended.
    for before, after in itertools.pairwise(plans):
        assert float(after["start"]) >= float(before["end"]), (before, after)
    # Meanwhile the device that was not planning trained: units fill the planning window.
    start, end = float(plans[0]["start"]), float(plans[-1]["end"])
    training = [s for s in spans if s["trial"] in ("a", "b") and start <= float(s["start"]) <= end]
    assert len(training) >= 0.5 * (end - start) / 0.010  # at least half the window in 10 ms units
    assert any(float(s["start"]) > end for s in spans if s["trial"] in ("a", "b"))  # they had work throughout
