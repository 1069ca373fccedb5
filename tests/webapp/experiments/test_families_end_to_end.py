"""Experiments of other families run to their end on real device workers: a Llama preset trained from scratch
with gradient accumulation, and a catalog checkpoint trained on the dataset tokenized with its own tokenizer;
each exported model loads with its tokenizer through transformers."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from tests.webapp.experiments.checkpoints import ready_checkpoint
from tests.webapp.experiments.factories import make_experiment
from tests.worker.conftest import device_workers  # noqa: F401 -- a fixture
from webapp.catalog.selectors import checkpoint_dir
from webapp.datasets.models import DatasetTokens
from webapp.datasets.services import dataset_tokens_build
from webapp.experiments import services
from webapp.experiments.ingest import telemetry_ingest
from webapp.experiments.model_shapes import PRESETS, checkpoint_shape
from webapp.experiments.reconcile import trials_reconcile
from webapp.ground.models import Trial

pytestmark = pytest.mark.processes
SPACE = {"lr": {"values": [0.003]}, "batch_size": {"values": [4]}, "micro_batches": {"values": [2]},
         "seq_len": {"values": [16]}}


def _run_to_the_end(experiment, workers, capture) -> list[Trial]:
    deadline = time.monotonic() + 240
    while True:
        with capture(execute=True):
            telemetry_ingest(host_id=workers.host_id)
            trials_reconcile()  # as the ingest's pass does after its own: sends the trials whose data is ready
        trials = list(experiment.trials.order_by("number"))
        if all(t.status in Trial.ENDED for t in trials):
            return trials
        assert time.monotonic() < deadline, f"{[(t.status, t.message) for t in trials]}\n{workers.logs()}"
        time.sleep(0.2)


def _on(settings, workers) -> None:
    settings.HYDRA = dataclasses.replace(settings.HYDRA,
                                         worker=dataclasses.replace(settings.HYDRA.worker, host_id=workers.host_id))


def _launched_on_checkpoint(alice, team, dataset, capture, *, space: dict, budget: int, eval_every: int):
    """An experiment of `team` on `dataset` with `space` and a ready catalog checkpoint, launched; and that
    checkpoint."""
    checkpoint = ready_checkpoint(alice)
    experiment = make_experiment(
        team, dataset, space=space, budget=budget, eval_every=eval_every,
        shape=checkpoint_shape(checkpoint.pk),
        model={"kind": "checkpoint", "checkpoint": checkpoint.pk, "checkpoint_name": checkpoint.name})
    with capture(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    return experiment, checkpoint


def _exported(trial: Trial) -> tuple[dict, object]:
    from transformers import AutoTokenizer

    assert trial.export_path, trial.message
    config = json.loads((Path(trial.export_path) / "config.json").read_text())
    return config, AutoTokenizer.from_pretrained(trial.export_path)


def test_a_llama_preset_experiment_trains_on_real_workers_and_exports_with_its_tokenizer(
        alice, alice_team, alice_dataset, settings, device_workers,  # noqa: F811
        django_capture_on_commit_callbacks):
    workers = device_workers("cpu0")
    _on(settings, workers)
    experiment = make_experiment(alice_team, alice_dataset, model={"kind": "preset", "preset": "llama-micro"},
                                 shape=PRESETS["llama-micro"][1], space=SPACE, budget=4, eval_every=2)
    with django_capture_on_commit_callbacks(execute=True):
        services.experiment_launch(experiment=experiment, actor=alice)
    (trial,) = _run_to_the_end(experiment, workers, django_capture_on_commit_callbacks)
    assert trial.status == "finished", trial.message
    assert trial.step == 4 and trial.best_val_loss is not None and trial.plan["source"] == "measured"
    assert (trial.spec["micro_batches"], trial.spec["model"]["family"]) == (2, "llama")
    config, tokenizer = _exported(trial)
    assert (config["model_type"], config["num_key_value_heads"], config["vocab_size"]) == (
        "llama", 2, alice_dataset.vocab_size)
    assert tokenizer.decode(tokenizer("The quick brown fox")["input_ids"]) == "The quick brown fox"


def test_a_checkpoint_experiment_trains_on_its_own_tokenizers_ids(
        alice, alice_team, alice_dataset, settings, device_workers,  # noqa: F811
        django_capture_on_commit_callbacks):
    workers = device_workers("cpu0")
    _on(settings, workers)
    experiment, checkpoint = _launched_on_checkpoint(alice, alice_team, alice_dataset,
                                                     django_capture_on_commit_callbacks, space=SPACE, budget=4,
                                                     eval_every=2)
    assert experiment.trials.get().submitted is False  # its tokens are not made yet
    dataset_tokens_build(tokens_id=DatasetTokens.objects.get().pk)  # as the web worker does
    (trial,) = _run_to_the_end(experiment, workers, django_capture_on_commit_callbacks)
    assert trial.status == "finished", trial.message
    assert trial.spec["model"]["pretrained_dir"] == str(checkpoint_dir(checkpoint))
    config, tokenizer = _exported(trial)
    assert (config["model_type"], config["vocab_size"]) == ("llama", checkpoint.vocab_size)
    original = json.loads((checkpoint_dir(checkpoint) / "tokenizer.json").read_text())["model"]["vocab"]
    assert tokenizer.get_vocab() == original  # the checkpoint's own tokenizer travels with the model


def test_a_lora_sweep_on_a_checkpoint_trains_adapters_on_one_shared_base(
        alice, alice_team, alice_dataset, settings, device_workers,  # noqa: F811
        django_capture_on_commit_callbacks):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from worker.engine.lora import ADAPTER_DIR
    from worker.engine.shared_base import bases

    workers = device_workers("cpu0")
    _on(settings, workers)
    space = SPACE | {"lora_r": {"values": [2, 4]}, "lora_alpha": {"values": [8]},
                     "lora_targets": {"values": ["q_proj, v_proj"]}}
    experiment, checkpoint = _launched_on_checkpoint(alice, alice_team, alice_dataset,
                                                     django_capture_on_commit_callbacks, space=space, budget=3,
                                                     eval_every=0)
    dataset_tokens_build(tokens_id=DatasetTokens.objects.get().pk)
    trials = _run_to_the_end(experiment, workers, django_capture_on_commit_callbacks)
    assert [t.status for t in trials] == ["finished", "finished"], [t.message for t in trials]
    assert sorted(t.spec["lora"]["r"] for t in trials) == [2, 4]
    assert all(t.spec["lora"]["target_modules"] == ["q_proj", "v_proj"] for t in trials)
    assert bases(workers.spill_dir) == []  # the last trial to end let the shared base go
    for trial in trials:  # a standard PEFT adapter on the checkpoint, beside the merged model
        base = AutoModelForCausalLM.from_pretrained(checkpoint_dir(checkpoint))
        adapted = PeftModel.from_pretrained(base, Path(trial.export_path) / ADAPTER_DIR)
        assert adapted.peft_config["default"].r == trial.spec["lora"]["r"]
        config, _ = _exported(trial)
        assert config["model_type"] == "llama"


def test_lora_needs_a_pretrained_model(alice_dataset) -> None:
    from webapp.experiments.planning import trial_spec
    from webapp.worker_door import SpecError

    with pytest.raises(SpecError, match="LoRA trains adapters on a pretrained checkpoint"):
        trial_spec(params={"lora_r": 4}, shape=PRESETS["llama-micro"][1], dataset=alice_dataset, data=None,
                   steps=2, eval_every=0, seed=0, budget_bytes=1 << 30)
