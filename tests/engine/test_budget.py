"""Planning under a budget: the solver's plan fits it, a budget too small names the culprit, and of layers alike only
the first two are profiled."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.engine.conftest import CPU, tiny_spec
from worker.engine import BudgetError, profile, trial_create
from worker.engine.layers import build_layer_stack


def test_it_splits_the_model_to_fit_the_budget(tokens_path: Path, tmp_path: Path) -> None:
    spec = tiny_spec(tokens_path, budget_bytes=1_000_000)
    plan = trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU)
    assert len(plan.shards) > 1
    assert plan.peak_bytes <= spec.budget_bytes
    assert plan.state_bytes > spec.budget_bytes / 2


def test_it_names_the_layer_its_bytes_and_the_budget(tokens_path: Path, tmp_path: Path) -> None:
    with pytest.raises(BudgetError, match=r"layer 'embedding' needs \d+ bytes .* but the budget is 1000 bytes"):
        trial_create(spec=tiny_spec(tokens_path, budget_bytes=1000), spill_dir=tmp_path, trial_id="t", device=CPU)
    assert not (tmp_path / "t").exists()


def test_layers_alike_are_measured_twice_and_the_others_take_their_costs(tokens_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tiny_spec(tokens_path)
    stack = build_layer_stack(spec.model, spec.lora)
    ran: list[int] = []
    real = profile.init_layer
    monkeypatch.setattr(profile, "init_layer", lambda s, index, seed: ran.append(index) or real(s, index, seed))
    costs = profile.profile_layers(stack, spec, CPU)
    assert ran == [0, 1, 2, 5]  # the embedding, two of the four blocks, the head
    assert [c.name for c in costs] == stack.names
    assert costs[3] == dataclasses.replace(costs[2], name="block.2") and costs[4].name == "block.3"
    monkeypatch.setattr(profile, "MEASURED_ALIKE", len(stack))
    every = profile.profile_layers(stack, spec, CPU)
    bytes_of = [(c.param_bytes, c.grad_bytes, c.optim_bytes, c.lent_bytes, c.activation_bytes) for c in costs]
    assert bytes_of == [(c.param_bytes, c.grad_bytes, c.optim_bytes, c.lent_bytes, c.activation_bytes) for c in every]
