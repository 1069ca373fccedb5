"""A trial's page lists its parameters as its space gave them, then only the defaults it trained with."""

from __future__ import annotations

import pytest

from webapp.experiments.trial_settings import applied_defaults


def test_a_model_from_scratch_trains_with_dropout_and_no_lora_or_instruction_settings():
    assert applied_defaults({"lr": 0.001}, pretrained=False, instruction=False) == [
        "batch_size", "weight_decay", "warmup_steps", "lr_decay", "dropout", "optimizer", "clip_norm", "seq_len",
        "micro_batches", "precision"]


def test_a_lora_trial_on_a_checkpoint_keeps_its_own_dropout_and_takes_the_lora_defaults():
    defaults = applied_defaults({"lr": 0.001, "lora_r": 8}, pretrained=True, instruction=True)
    assert "dropout" not in defaults and "momentum" not in defaults and "lora_r" not in defaults
    assert {"lora_alpha", "lora_dropout", "lora_targets", "packing", "loss_on"} <= set(defaults)


@pytest.mark.parametrize(("params", "shown", "hidden"), [
    ({"optimizer": "sgd"}, {"momentum"}, set()),
    ({"optimizer": "adamw"}, set(), {"momentum"}),
    ({}, {"lora_r"}, {"lora_alpha", "lora_dropout", "lora_targets"}),  # full training of a checkpoint
])
def test_a_default_shows_only_where_it_applied(params, shown, hidden):
    defaults = set(applied_defaults(params, pretrained=True, instruction=False))
    assert shown <= defaults and not hidden & defaults
