"""Upgrading moves stored steps and evaluations from the workers' 0-based numbering to the steps done."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("telemetry", "0004_eval_bpb")]
AFTER = [("telemetry", "0005_steps_counted_from_one")]


@pytest.mark.django_db(transaction=True)
def test_upgrading_counts_every_stored_step_from_one(alice_team):
    from tests.webapp.telemetry.factories import make_experiment

    trial = make_experiment(alice_team, total_steps=20).trials.get()
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        _upgrade_and_check(executor, trial)
    finally:  # the tests after this one find the database as every migration leaves it
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


def _upgrade_and_check(executor: MigrationExecutor, trial) -> None:
    old = executor.loader.project_state(BEFORE).apps
    for step in range(20):  # consecutive steps: moving each up by one meets its neighbour's on the way
        old.get_model("telemetry", "StepMetric").objects.create(trial_id=trial.pk, attempt=1, step=step, loss=1.0,
                                                                  lr=0.1, tokens=step + 1, time=0.0)
    for step in (9, 19):
        old.get_model("telemetry", "EvalMetric").objects.create(trial_id=trial.pk, attempt=1, step=step, loss=1.0,
                                                                  perplexity=2.7, time=0.0)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(AFTER)
    new = executor.loader.project_state(AFTER).apps
    steps = new.get_model("telemetry", "StepMetric").objects.order_by("step").values_list("step", flat=True)
    assert list(steps) == list(range(1, 21))
    evals = new.get_model("telemetry", "EvalMetric").objects.order_by("step").values_list("step", flat=True)
    assert list(evals) == [10, 20]
