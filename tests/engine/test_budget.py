"""Planning under a budget: the solver's plan fits it, and a budget too small names the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.conftest import CPU, tiny_spec
from worker.engine import BudgetError, trial_create


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
