"""A DPO experiment through the API: created with ``objective`` and its space's dpo_beta and dpo_loss_type, shown
with them, refused with the form's messages where DPO cannot train, cloned with its objective; the OpenAPI
schema names the new fields."""

from __future__ import annotations

import pytest

from tests.webapp.experiments.instruction import chat_checkpoint
from tests.webapp.experiments.preference import preference_dataset

pytestmark = pytest.mark.django_db


@pytest.fixture
def checkpoint(alice):
    return chat_checkpoint(alice)


@pytest.fixture
def prefs(alice_team, checkpoint):
    return preference_dataset(alice_team, checkpoint)


def body(dataset, checkpoint, **fields):
    space = {"model": {"checkpoint": checkpoint.name}, "dpo_beta": {"kind": "logfloat", "low": 0.05, "high": 0.5},
             "dpo_loss_type": ["sigmoid", "ipo"], "lora_r": [4], "batch_size": [4], "max_seq_len": [78]}
    return {"name": "dpo sweep", "dataset": dataset.pk, "space": space, "strategy": "random", "n_trials": 3,
            "budget": 4, "eval_every": 2, "objective": "dpo"} | fields


def test_a_dpo_experiment_is_created_shown_and_cloned_with_its_objective(alice_api, prefs, checkpoint):
    created = alice_api.post("/experiments", body(prefs, checkpoint))
    assert created.status_code == 201, created.content
    experiment = created.json()
    assert experiment["objective"] == "dpo"
    assert experiment["dpo_beta"] == {"kind": "logfloat", "low": 0.05, "high": 0.5}
    assert experiment["dpo_loss_type"] == {"kind": "categorical", "values": ["sigmoid", "ipo"]}
    shown = alice_api.get(f"/experiments/{experiment['id']}").json()
    assert (shown["objective"], shown["dpo_beta"]) == ("dpo", experiment["dpo_beta"])
    trials = alice_api.get(f"/experiments/{experiment['id']}/trials").json()
    assert len(trials) == 3 and all(0.05 <= t["params"]["dpo_beta"] <= 0.5 for t in trials)
    assert all(t["final_reward_accuracy"] is None for t in trials)
    assert alice_api.get(f"/experiments/{experiment['id']}/space").json()["objective"] == "dpo"
    clone = alice_api.post(f"/experiments/{experiment['id']}/clone", {"name": "again"})
    assert clone.status_code == 201, clone.content
    assert clone.json()["objective"] == "dpo"
    refused = alice_api.post(f"/experiments/{experiment['id']}/clone", {"name": "as sft", "objective": "sft"})
    assert refused.status_code == 400 and "choose objective dpo" in " ".join(refused.json()["errors"]["objective"])


@pytest.mark.parametrize("fields, field, says", [
    ({"objective": "sft"}, "objective", "choose objective dpo"),
    ({"objective": "rlhf"}, "objective", "Select a valid choice"),
    ({"space": {"dpo_beta": [0.1], "batch_size": [4]}}, "model_kind", "a model from scratch would be compared"),
])
def test_what_dpo_cannot_train_is_refused_under_its_field(alice_api, prefs, checkpoint, fields, field, says):
    answer = alice_api.post("/experiments", body(prefs, checkpoint, **fields))
    assert answer.status_code == 400, answer.content
    assert says in " ".join(answer.json()["errors"][field]), answer.json()


def test_an_sft_experiment_shows_its_objective_and_no_dpo_settings(alice_api, alice_dataset):
    created = alice_api.post("/experiments", {"name": "lm", "dataset": alice_dataset.pk, "space": {"lr": [0.001]},
                                              "budget": 4, "eval_every": 2})
    assert created.status_code == 201, created.content
    assert (created.json()["objective"], created.json()["dpo_beta"]) == ("sft", None)
    schema = alice_api.get("/openapi.json").json()["components"]["schemas"]
    assert {"objective", "dpo_beta", "dpo_loss_type"} <= set(schema["ExperimentOut"]["properties"])
    assert "objective" in schema["ExperimentIn"]["properties"]
    assert "final_reward_accuracy" in schema["TrialOut"]["properties"]
