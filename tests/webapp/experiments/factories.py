"""Experiments for the web tests: built through the real services, on tiny datasets and the micro preset."""

from __future__ import annotations

from typing import Any

from webapp.accounts.models import Team
from webapp.datasets.models import Dataset
from webapp.experiments.model_shapes import PRESETS
from webapp.experiments.planning import ExperimentDraft
from webapp.experiments.search_space import parse_search_space
from webapp.experiments.services import experiment_create
from webapp.ground.models import Experiment

SPACE = {"lr": {"kind": "categorical", "values": [0.001, 0.003]}, "batch_size": {"values": [2]}}


def draft(dataset: Dataset, *, space: dict[str, Any] | None = None, **fields: Any) -> ExperimentDraft:
    values: dict[str, Any] = {
        "name": "sweep", "dataset": dataset, "model": {"kind": "preset", "preset": "gpt2-micro"},
        "shape": PRESETS["gpt2-micro"][1], "space": parse_search_space(space or SPACE), "strategy": "grid",
        "n_trials": 4, "budget_unit": "steps", "budget": 10, "eval_every": 5, "seed": 0,
        "memory_budget_bytes": 256 << 20,
    }
    values.update(fields)
    return ExperimentDraft(**values)


def make_experiment(team: Team, dataset: Dataset, **fields: Any) -> Experiment:
    return experiment_create(team=team, user=None, draft=draft(dataset, **fields))
