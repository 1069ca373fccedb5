"""The memory preview decides "does it fit" with the engine's own solver: one rule, one set of numbers."""

from __future__ import annotations

import pytest

from webapp.experiments.memory_preview import FitError, layer_costs, memory_plan
from webapp.experiments.model_shapes import PRESETS
from worker.engine.errors import BudgetError
from worker.engine.partition import solve
from worker.engine.sizes import optimizer_slots

SHAPE = PRESETS["gpt2-micro"][1]


def _smallest_fitting_budget(costs) -> int:
    low, high = 1, 1 << 34
    while low < high:  # the solver's own threshold, found by bisection
        middle = (low + high) // 2
        try:
            solve(costs, middle)
            high = middle
        except BudgetError:
            low = middle + 1
    return low


@pytest.mark.parametrize(("optimizer", "momentum"), [("adamw", 0.9), ("sgd", 0.9), ("sgd", 0.0)])
def test_it_refuses_exactly_what_the_engine_solver_refuses(optimizer: str, momentum: float) -> None:
    costs = layer_costs(SHAPE, batch=4, seq_len=64, slots=optimizer_slots(optimizer, momentum))
    threshold = _smallest_fitting_budget(costs)
    plan = memory_plan(SHAPE, batch=4, seq_len=64, optimizer=optimizer, momentum=momentum, budget_bytes=threshold)
    assert plan["shards"] == solve(costs, threshold).to_dict()["shards"]
    with pytest.raises(FitError) as refused:
        memory_plan(SHAPE, batch=4, seq_len=64, optimizer=optimizer, momentum=momentum,
                    budget_bytes=threshold - 1)
    with pytest.raises(BudgetError) as solver:
        solve(costs, threshold - 1)
    assert (refused.value.layer, refused.value.needed_bytes) == (solver.value.layer, solver.value.needed_bytes)
    assert refused.value.needed_bytes > threshold - 1


def test_the_optimizer_state_streams_so_it_does_not_decide_the_fit() -> None:
    adamw = layer_costs(SHAPE, batch=4, seq_len=64, slots=2)
    plain = layer_costs(SHAPE, batch=4, seq_len=64, slots=0)
    assert _smallest_fitting_budget(adamw) == _smallest_fitting_budget(plain)
    assert sum(c.state_bytes for c in adamw) > sum(c.state_bytes for c in plain)
