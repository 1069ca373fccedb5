"""A pruner compares trials by the figure its experiment chose: a DPO study by preference accuracy prunes the trial
whose accuracy is lower (higher is better), one by validation loss the trial whose loss is higher; its message
names the figure. Optuna's pruners decide, on the study's records in Redis."""

from __future__ import annotations

import uuid

import pytest

from worker.contract import JobError, PrunerSpec, PruningJob
from worker.scheduling import pruning


def job(study: str, number: int, metric: str) -> PruningJob:
    return PruningJob(study=study, trial_number=number,
                      pruner=PrunerSpec(kind="asha", min_resource=2, reduction_factor=2, metric=metric))


@pytest.mark.parametrize("metric, first, second, direction", [
    ("reward_accuracy", 0.75, 0.25, "maximize"), ("reward_margin", 0.5, -0.1, "maximize"),
    ("loss", 0.6, 0.9, "minimize"), ("bpb", 1.1, 1.4, "minimize")])
def test_the_second_trial_up_a_rung_goes_on_only_if_better_by_the_chosen_metric(
        redis_client, metric, first, second, direction):
    study = f"test-{uuid.uuid4().hex[:10]}"
    try:
        assert job(study, 1, metric).pruner.direction == direction
        assert not pruning.report(redis_client, job(study, 1, metric), step=2, loss=first).prune
        verdict = pruning.report(redis_client, job(study, 2, metric), step=2, loss=second)
        assert verdict.prune and verdict.rung == 0
        assert f"its {pruning.METRIC_WORDS[metric]} {second:.4f} was not in the best 1/2" in verdict.reason
        # the better one, third up the rung, goes on
        assert not pruning.report(redis_client, job(study, 3, metric), step=2, loss=first).prune
    finally:
        pruning.forget(redis_client, study)


def test_a_pruner_takes_its_metric_s_figure_of_an_evaluation_and_refuses_an_unknown_metric():
    figures = {"eval_loss": 0.7, "eval_bpb": None, "eval_reward_accuracy": 0.5, "eval_reward_margin": 0.2}
    assert [PrunerSpec(kind="median", metric=m).value(figures) for m in ("loss", "bpb", "reward_accuracy",
                                                                        "reward_margin")] == [0.7, None, 0.5, 0.2]
    assert "metric" not in PrunerSpec(kind="median").to_dict()  # a pruner by loss keeps its stored form
    assert PrunerSpec(**PrunerSpec(kind="median", metric="reward_margin").to_dict()).metric == "reward_margin"
    with pytest.raises(JobError, match="pruner metric 'accuracy' is unknown"):
        PrunerSpec(kind="asha", metric="accuracy")
