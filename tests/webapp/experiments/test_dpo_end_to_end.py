"""A DPO LoRA experiment end to end: made and launched through the web app's services on a tiny preference
dataset and catalog checkpoint, trained by real device workers, its rewards reaching the telemetry through the
ingest, its final evaluation ranked on the dataset's board, its adapter exported on the checkpoint, and text
generated from it on its page as from any chat trial."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from django.urls import reverse

from tests.webapp.experiments.instruction import chat_checkpoint
from tests.webapp.experiments.preference import N_TRAIN, dpo_experiment, preference_dataset
from tests.webapp.experiments.test_generations import SETTINGS
from tests.worker.conftest import device_workers  # noqa: F401 -- a fixture
from webapp.catalog.selectors import checkpoint_dir
from webapp.experiments import generations, services
from webapp.experiments.ingest import telemetry_ingest
from webapp.experiments.reconcile import trials_reconcile
from webapp.ground.models import Generation, Trial
from webapp.leaderboards.selectors import metric_get, team_board
from webapp.telemetry.models import EvalMetric, StepMetric

pytestmark = pytest.mark.processes
STEPS = 4
SPACE = {"dpo_beta": {"values": [0.1, 0.5]}, "lora_r": {"values": [4]}, "lora_alpha": {"values": [8]},
         "lr": {"values": [0.01]}, "batch_size": {"values": [4]}, "micro_batches": {"values": [2]},
         "seq_len": {"values": [78]}}


def _run_to_the_end(experiment, workers, capture) -> list[Trial]:
    """Ingest until every trial has ended and its final evaluation is stored: a worker's telemetry and its trial's
    end are separate streams, so the last evaluation may reach the ingest a pass after the end does."""
    deadline = time.monotonic() + 240
    while True:
        with capture(execute=True):
            telemetry_ingest(host_id=workers.host_id)
            trials_reconcile()
        trials = list(experiment.trials.order_by("number"))
        if all(t.status in Trial.ENDED for t in trials) and all(
                EvalMetric.objects.filter(trial=t, step=STEPS).exists() for t in trials if t.status == "finished"):
            return trials
        assert time.monotonic() < deadline, f"{[(t.status, t.message) for t in trials]}\n{workers.logs()}"
        time.sleep(0.2)


def test_a_dpo_lora_sweep_trains_on_real_workers_reports_its_rewards_and_is_ranked(
        alice, alice_client, alice_team, settings, device_workers,  # noqa: F811
        django_capture_on_commit_callbacks):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from worker.engine.lora import ADAPTER_DIR

    workers = device_workers("cpu0")
    settings.HYDRA = dataclasses.replace(settings.HYDRA,
                                         worker=dataclasses.replace(settings.HYDRA.worker, host_id=workers.host_id))
    checkpoint = chat_checkpoint(alice)
    dataset = preference_dataset(alice_team, checkpoint)
    experiment = dpo_experiment(alice_team, dataset, checkpoint, space=SPACE, budget=STEPS, eval_every=2)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)

    trials = _run_to_the_end(experiment, workers, django_capture_on_commit_callbacks)

    assert [t.status for t in trials] == ["finished", "finished"], [t.message for t in trials]
    for trial in trials:
        assert trial.spec["dpo"] == {"beta": trial.params["dpo_beta"], "loss_type": "sigmoid"}
        assert trial.spec["data"]["pairs"] and trial.spec["data"]["train_examples"] == N_TRAIN
        steps = list(StepMetric.objects.filter(trial=trial).order_by("step"))
        assert [s.step for s in steps] == list(range(1, STEPS + 1))
        assert all(s.rewards_chosen is not None and 0 <= s.reward_accuracy <= 1 for s in steps)
        evals = EvalMetric.objects.filter(trial=trial).exclude(reward_accuracy=None)
        assert {e.step for e in evals} >= {2, STEPS}
        assert trial.final_reward_accuracy is not None and trial.final_reward_margin is not None
        assert trial.final_loss is not None and trial.final_bpb is not None and trial.final_step == STEPS
        base = AutoModelForCausalLM.from_pretrained(checkpoint_dir(checkpoint))
        adapted = PeftModel.from_pretrained(base, Path(trial.export_path) / ADAPTER_DIR)
        assert adapted.peft_config["default"].r == 4

    for key in ("val_loss", "reward_accuracy", "reward_margin", "bpb"):
        metric = metric_get(key, dataset=dataset)
        values = [row["value"] for row in team_board(team=alice_team, dataset=dataset, metric=metric)]
        assert len(values) == 2 and values == sorted(values, reverse=metric.higher_is_better), key

    page = alice_client.get(reverse("trial_detail", args=[trials[0].pk])).content.decode()
    assert 'id="rewards-figure"' in page and "DPO rewards" in page
    response = alice_client.post(reverse("trial_generate", args=[trials[0].pk]),
                                 {**SETTINGS, "prompt": "Which animal is number 3?", "max_new_tokens": "4"})
    assert response.status_code == 302
    generation = Generation.objects.get()
    generations.trial_generate(generation_id=generation.pk)  # as the web worker does
    generation.refresh_from_db()
    assert generation.status == Generation.Status.DONE, generation.message
