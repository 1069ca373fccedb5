"""``hydra`` and DPO: an experiment created with --objective dpo shows its beta and loss type and its trials' DPO
columns, a trial its preference accuracy, and the leaderboard of a preference dataset ranks by preference
accuracy saying that higher is better."""

from __future__ import annotations

import json
from pathlib import Path

from tests.client.conftest import Shell
from tests.webapp.experiments.instruction import chat_checkpoint
from tests.webapp.experiments.preference import preference_dataset
from webapp.ground.models import Trial

SPACE = """\
model: {checkpoint: chat llama}
dpo_beta: {kind: logfloat, low: 0.05, high: 0.5}
dpo_loss_type: [sigmoid]
lora_r: [4]
batch_size: [4]
max_seq_len: [78]
"""


def test_a_dpo_experiment_is_made_shown_and_ranked(alice, alice_hydra: Shell, alice_team, db_lock,
                                                     tmp_path: Path) -> None:
    with db_lock:
        dataset = preference_dataset(alice_team, chat_checkpoint(alice))
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    result = alice_hydra("experiments", "create", str(space), "--name", "prefs sweep", "--dataset", "prefs",
                         "--strategy", "random", "--trials", "2", "--budget", "4", "--objective", "dpo", "--json")
    assert result.exit_code == 0, result.output
    made = json.loads(result.stdout)
    assert (made["objective"], made["dpo_beta"]["kind"]) == ("dpo", "logfloat")
    with db_lock:
        first, second = Trial.objects.filter(experiment_id=made["id"]).order_by("number")
        Trial.objects.filter(pk=first.pk).update(status="finished", final_loss=0.6, final_reward_accuracy=0.5,
                                                 final_reward_margin=0.1, final_bpb=1.4)
        Trial.objects.filter(pk=second.pk).update(status="finished", final_loss=0.7, final_reward_accuracy=0.75,
                                                  final_reward_margin=0.3, final_bpb=1.5)
    shown = alice_hydra("experiments", "show", str(made["id"]))
    assert shown.exit_code == 0, shown.output
    assert "(DPO: dpo_beta 0.05..0.5 (log), dpo_loss_type sigmoid)" in shown.stdout
    assert "DPO LOSS" in shown.stdout and "PREF ACC" in shown.stdout and "CHOSEN BPB" in shown.stdout
    trial = alice_hydra("trials", "show", str(second.pk))
    assert "DPO loss 0.7, preference accuracy 0.75, margin 0.3" in trial.stdout, trial.output
    board = alice_hydra("leaderboard", "prefs", "--metric", "reward_accuracy")
    assert board.exit_code == 0, board.output
    assert board.stdout.startswith(f"Dataset {dataset.pk}, best by Preference accuracy (chosen answer rewarded "
                                   "higher) (higher is better):")
    ranked = json.loads(alice_hydra("leaderboard", "prefs", "--metric", "reward_accuracy", "--json").stdout)
    assert [row["trial_id"] for row in ranked["team"]] == [second.pk, first.pk]
    refused = alice_hydra("experiments", "create", str(space), "--name", "wrong", "--dataset", "prefs",
                          "--strategy", "random", "--objective", "sft")
    assert refused.exit_code == 1 and "choose objective dpo" in refused.output
