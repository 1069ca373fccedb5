"""The engine runner in this process: engine jobs as the queue carries them, planning on the device, and
trials whose units take turns on one runner training exactly like plain PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.plain_pytorch import assert_bit_identical, exported_weights, one_thread, plain_reference
from tests.worker.test_engine_trials import tiny_trial
from worker.contract import EngineJob, JobError, job_from_dict
from worker.engine.partition import MemoryPlan, plan_with_shards
from worker.scheduling.engine_runner import EngineRunner, device_budget_bytes
from worker.scheduling.runner import UnitDone

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


def planned_in_shards(runner: EngineRunner, trial_id: str, job: EngineJob) -> int:
    """Plan the trial; its shard count, which must be 2 or more by the sizes of its weights alone.

    One shard would hold every weight and both gradients, and the prefetch reserve is as large again: a
    budget below twice that forces a cut, whatever profiling measures of the activations.
    """
    plan = MemoryPlan.from_dict(runner.plan(trial_id=trial_id, job=job).plan)
    assert 2 * plan_with_shards(plan.layers, [0], plan.budget_bytes).shards[0].device_bytes > job.trial.budget_bytes
    assert len(plan.shards) >= 2
    return len(plan.shards)


@pytest.mark.parametrize("prefetch", [True, False])
def test_it_loads_the_next_trials_shard_while_a_unit_runs_unless_told_not_to(
    tokens: str, tmp_path: Path, prefetch: bool
) -> None:
    runner = EngineRunner(spill_dir=tmp_path, device=CPU, prefetch=prefetch)
    jobs = {t: EngineJob(trial=tiny_trial(tokens, seed=i, lr=1e-3)) for i, t in enumerate("ab")}
    for trial_id, job in jobs.items():
        planned_in_shards(runner, trial_id, job)
    runner.run_unit(trial_id="a", job=jobs["a"], units_done=0, next_trial="b", token=1)
    assert runner._sessions["b"].prefetching() == (["p0"] if prefetch else [])  # b's first unit: shard 0
    runner.run_unit(trial_id="b", job=jobs["b"], units_done=0, next_trial="b", token=2)
    assert runner._sessions["b"].prefetching() == (["p1"] if prefetch else [])  # b's own next unit


def test_it_says_which_units_leave_activations_for_a_later_unit_in_this_process(tokens: str, tmp_path: Path) -> None:
    runner = EngineRunner(spill_dir=tmp_path, device=CPU)
    job = EngineJob(trial=tiny_trial(tokens, seed=0, lr=1e-3, steps=1))
    n = planned_in_shards(runner, "t", job)
    units = [runner.run_unit(trial_id="t", job=job, units_done=i, next_trial=None, token=1)
             for i in range(2 * (2 * n - 1))]
    # Each micro-batch: F0..F(n-2) keep their graphs for the backward, FB(n-1) and B(n-2)..B1 leave the
    # lower shards' graphs, B0 uses the last up.
    micro_batch = [("F", True)] * (n - 1) + [("FB", True)] + [("B", True)] * (n - 2) + [("B", False)]
    assert [(u.phase, u.keeps_activations) for u in units] == micro_batch * 2


def test_trials_taking_turns_on_one_runner_train_exactly_like_plain_pytorch(tokens: str, tmp_path: Path) -> None:
    """Units of two trials alternate on one runner, each prefetching the other's next shard, with the
    sessions kept between units: each trial's losses, evaluations and weights are plain PyTorch's, bit for bit."""
    jobs = {t: EngineJob(trial=tiny_trial(tokens, seed=i, lr=2e-3 * (i + 1), steps=4)) for i, t in enumerate("ab")}
    runner = EngineRunner(spill_dir=tmp_path / "spill", device=CPU)
    done = {t: 0 for t in jobs}
    outs: dict[str, list[UnitDone]] = {t: [] for t in jobs}
    with one_thread():
        for trial_id, job in jobs.items():
            planned_in_shards(runner, trial_id, job)
        while any(not o or o[-1].remaining_units for o in outs.values()):
            for trial_id, other in (("a", "b"), ("b", "a")):
                if outs[trial_id] and not outs[trial_id][-1].remaining_units:
                    continue
                out = runner.run_unit(trial_id=trial_id, job=jobs[trial_id], units_done=done[trial_id],
                                      next_trial=other, token=1)
                assert isinstance(out, UnitDone)
                outs[trial_id].append(out)
                done[trial_id] += 1
        for trial_id, job in jobs.items():
            runner.export(trial_id=trial_id, job=job, export_dir=str(tmp_path / "exports" / trial_id))

    for trial_id, job in jobs.items():
        reference = plain_reference(job.trial, tmp_path / f"plain-{trial_id}")
        assert [s.loss for o in outs[trial_id] for s in o.steps] == reference.losses
        assert [e.loss for o in outs[trial_id] for e in o.evals] == reference.eval_losses
        assert_bit_identical(exported_weights(tmp_path / "exports" / trial_id), reference.weights)
