"""The engine runner in this process: trial specs as the queue carries them, and planning on the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.worker.test_engine_trials import tiny_trial
from worker.api import spec_validate
from worker.scheduling.engine_runner import EngineRunner, device_budget_bytes, engine_spec

CPU = torch.device("cpu")


def test_it_accepts_an_auto_budget_and_refuses_unknown_ones(tokens: str) -> None:
    trial = tiny_trial(tokens, seed=0, lr=1e-3)
    assert spec_validate(engine_spec(trial, auto_budget=True))["budget"] == "auto"
    assert "budget" not in spec_validate({**engine_spec(trial), "budget": "explicit"})
    with pytest.raises(ValueError, match="budget 'lots' is unknown"):
        spec_validate({**engine_spec(trial), "budget": "lots"})
    with pytest.raises(ValueError, match="engine trial spec is invalid"):
        spec_validate({"kind": "engine", "trial": {**trial.to_dict(), "early_stop_patience": 0}})


def test_a_cpu_device_plans_an_auto_budget_trial_under_the_budget_it_came_with(tokens: str, tmp_path: Path) -> None:
    assert device_budget_bytes(CPU, 123_456) == 123_456
    trial = tiny_trial(tokens, seed=0, lr=1e-3, budget_bytes=450_000)
    runner = EngineRunner(spill_dir=tmp_path, device=CPU)
    planned = runner.plan(trial_id="t", spec=spec_validate(engine_spec(trial, auto_budget=True)))
    assert planned.plan["budget_bytes"] == 450_000
    assert planned.remaining_units > 0


@pytest.mark.parametrize("prefetch", [True, False])
def test_it_loads_the_next_trials_shard_while_a_unit_runs_unless_told_not_to(
    tokens: str, tmp_path: Path, prefetch: bool
) -> None:
    runner = EngineRunner(spill_dir=tmp_path, device=CPU, prefetch=prefetch)
    specs = {t: engine_spec(tiny_trial(tokens, seed=i, lr=1e-3)) for i, t in enumerate("ab")}
    for trial_id, spec in specs.items():
        runner.plan(trial_id=trial_id, spec=spec)
    runner.run_unit(trial_id="a", spec=specs["a"], units_done=0, next_trial="b", token=1)
    assert runner._sessions["b"].prefetching() == (["p0"] if prefetch else [])  # b's first unit: shard 0
    runner.run_unit(trial_id="b", spec=specs["b"], units_done=0, next_trial="b", token=2)
    assert runner._sessions["b"].prefetching() == (["p1"] if prefetch else [])  # b's own next unit


def test_it_says_which_units_leave_activations_for_a_later_unit_in_this_process(tokens: str, tmp_path: Path) -> None:
    runner = EngineRunner(spill_dir=tmp_path, device=CPU)
    spec = engine_spec(tiny_trial(tokens, seed=0, lr=1e-3, steps=1))
    assert len(runner.plan(trial_id="t", spec=spec).plan["shards"]) == 2
    units = [runner.run_unit(trial_id="t", spec=spec, units_done=i, next_trial=None, token=1) for i in range(6)]
    # Each micro-batch: F0 keeps its graph for B0, FB1 leaves F0's, B0 uses it up.
    assert [(u.phase, u.keeps_activations) for u in units] == [
        ("F", True), ("FB", True), ("B", False), ("F", True), ("FB", True), ("B", False)]
