"""The pure solver: exact plans for hand-computed costs, and the error for a layer that cannot fit."""

from __future__ import annotations

import pytest

from worker.engine.errors import BudgetError
from worker.engine.partition import LayerCost, MemoryPlan, choose_kept, plan_with_shards, solve


def costs(states: list[int], activations: list[int]) -> list[LayerCost]:
    return [
        LayerCost(name=f"l{i}", param_bytes=s, grad_bytes=0, optim_bytes=0, activation_bytes=a)
        for i, (s, a) in enumerate(zip(states, activations, strict=True))
    ]


def test_it_packs_pairs_when_the_reserve_allows() -> None:
    # reserve 8: two layers per shard, 8 + 8 <= 16; reserve 4 would need 4 shards, 12 leaves room for 1 layer.
    plan = solve(costs([4, 4, 4, 4], [0, 0, 0, 0]), 16)
    assert [(s.first, s.stop) for s in plan.shards] == [(0, 2), (2, 4)]
    assert plan.reserve_bytes == 8
    assert plan.peak_bytes == 16


def test_it_counts_activations_against_the_budget() -> None:
    # k layers per shard need 2k state + k activations + reserve <= 10 with 2k <= reserve: k = 2, reserve 4.
    plan = solve(costs([2] * 5, [1] * 5), 10)
    assert [(s.first, s.stop) for s in plan.shards] == [(0, 2), (2, 4), (4, 5)]
    assert plan.reserve_bytes == 4
    assert [s.activation_bytes for s in plan.shards] == [2, 2, 1]


def test_it_keeps_everything_in_one_shard_when_it_fits() -> None:
    plan = solve(costs([1, 2, 3], [1, 1, 1]), 100)
    assert [(s.first, s.stop) for s in plan.shards] == [(0, 3)]
    assert plan.shards[0].layers == ("l0", "l1", "l2")


def test_it_balances_uneven_layers() -> None:
    # The big middle layer forces reserve >= 6; 1 + 6 + 6 > 12 so it stands alone; the small ones pair up.
    plan = solve(costs([1, 1, 6, 1, 1], [0] * 5), 12)
    assert [(s.first, s.stop) for s in plan.shards] == [(0, 2), (2, 3), (3, 5)]


def test_it_names_the_layer_that_cannot_fit() -> None:
    with pytest.raises(BudgetError, match=r"layer 'l1' needs 101 bytes .*gradients 50 .*activations 1 .*budget is 60"):
        solve(costs([2, 50, 2], [1, 1, 1]), 60)


def test_it_round_trips_the_plan_as_data() -> None:
    plan = plan_with_shards(costs([1, 2, 3], [4, 5, 6]), [0, 2], 100)
    raw = plan.to_dict()
    assert raw["shards"][1]["state_bytes"] == 3
    assert raw["peak_bytes"] == plan.peak_bytes == 3 + 9 + 3
    assert MemoryPlan.from_dict(raw) == plan


def test_it_keeps_activations_only_where_copying_beats_recomputing() -> None:
    layers = [
        LayerCost(name=f"l{i}", param_bytes=1, grad_bytes=0, optim_bytes=0, activation_bytes=a, forward_s=f)
        for i, (a, f) in enumerate([(100, 1.0), (1000, 1.0), (100, 1.0)])
    ]
    plan = plan_with_shards(layers, [0, 1, 2], 10_000)
    # 2 x 100 bytes at 1000 B/s = 0.2 s < 1 s forward: keep; 2 x 1000 bytes = 2 s > 1 s: recompute;
    # the last shard's unit is forward+backward, so it never needs either.
    assert [s.keep_activations for s in choose_kept(plan, 1000.0).shards] == [True, False, False]
    assert [s.keep_activations for s in choose_kept(plan, None).shards] == [True, True, False]
