"""The engine runner in this process: engine jobs as the queue carries them, and planning on the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.test_engine_trials import tiny_trial
from worker.contract import EngineJob, JobError, job_from_dict
from worker.scheduling.engine_runner import EngineRunner, device_budget_bytes

CPU = torch.device("cpu")


def test_it_accepts_an_auto_budget_and_refuses_unknown_ones(tokens: str) -> None:
    trial = tiny_trial(tokens, seed=0, lr=1e-3)
    assert job_from_dict(EngineJob(trial=trial, budget="auto").to_dict()).budget == "auto"
    assert job_from_dict({**EngineJob(trial=trial).to_dict(), "budget": "explicit"}) == EngineJob(trial=trial)
    with pytest.raises(JobError, match="budget 'lots' is unknown"):
        job_from_dict({**EngineJob(trial=trial).to_dict(), "budget": "lots"})
    with pytest.raises(JobError, match="engine job is invalid"):
        job_from_dict({"kind": "engine", "trial": {**trial.to_dict(), "early_stop_patience": 0}})


def test_a_cpu_device_plans_an_auto_budget_trial_under_the_budget_it_came_with(tokens: str, tmp_path: Path) -> None:
    assert device_budget_bytes(CPU, 123_456) == 123_456
    trial = tiny_trial(tokens, seed=0, lr=1e-3, budget_bytes=450_000)
    runner = EngineRunner(spill_dir=tmp_path, device=CPU)
    planned = runner.plan(trial_id="t", job=EngineJob(trial=trial, budget="auto"))
    assert planned.plan["budget_bytes"] == 450_000
    assert planned.remaining_units > 0


@pytest.mark.parametrize("prefetch", [True, False])
def test_it_loads_the_next_trials_shard_while_a_unit_runs_unless_told_not_to(
    tokens: str, tmp_path: Path, prefetch: bool
) -> None:
    runner = EngineRunner(spill_dir=tmp_path, device=CPU, prefetch=prefetch)
    jobs = {t: EngineJob(trial=tiny_trial(tokens, seed=i, lr=1e-3)) for i, t in enumerate("ab")}
    for trial_id, job in jobs.items():
        runner.plan(trial_id=trial_id, job=job)
    runner.run_unit(trial_id="a", job=jobs["a"], units_done=0, next_trial="b", token=1)
    assert runner._sessions["b"].prefetching() == (["p0"] if prefetch else [])  # b's first unit: shard 0
    runner.run_unit(trial_id="b", job=jobs["b"], units_done=0, next_trial="b", token=2)
    assert runner._sessions["b"].prefetching() == (["p1"] if prefetch else [])  # b's own next unit


def test_it_says_which_units_leave_activations_for_a_later_unit_in_this_process(tokens: str, tmp_path: Path) -> None:
    runner = EngineRunner(spill_dir=tmp_path, device=CPU)
    job = EngineJob(trial=tiny_trial(tokens, seed=0, lr=1e-3, steps=1))
    assert len(runner.plan(trial_id="t", job=job).plan["shards"]) == 2
    units = [runner.run_unit(trial_id="t", job=job, units_done=i, next_trial=None, token=1) for i in range(6)]
    # Each micro-batch: F0 keeps its graph for B0, FB1 leaves F0's, B0 uses it up.
    assert [(u.phase, u.keeps_activations) for u in units] == [
        ("F", True), ("FB", True), ("B", False), ("F", True), ("FB", True), ("B", False)]
