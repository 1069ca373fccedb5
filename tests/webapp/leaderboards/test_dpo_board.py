"""The board of a preference dataset ranks DPO trials by DPO loss (its default), preference accuracy, reward margin
or the chosen answers' bits per byte, each the right way (accuracy and margin: higher is better), and says which
metric and which way, on the page, in the API and on the chart."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.webapp.api.conftest import api_for
from tests.webapp.experiments.instruction import chat_checkpoint
from tests.webapp.experiments.preference import dpo_experiment, preference_dataset
from webapp.ground.models import Trial
from webapp.leaderboards.selectors import DPO_METRICS, cross_team_board, metric_get, team_board

pytestmark = pytest.mark.django_db

# (DPO loss, preference accuracy, reward margin, chosen bits per byte) of three trials
FIGURES = {"steady": (0.50, 0.75, 0.40, 1.30), "sharp": (0.40, 0.50, 0.90, 1.50), "gentle": (0.60, 1.00, 0.20, 1.10)}


@pytest.fixture
def board(alice, alice_team):
    dataset = preference_dataset(alice_team, chat_checkpoint(alice))
    experiment = dpo_experiment(alice_team, dataset, chat_checkpoint(alice, name="other llama"),
                                space={"dpo_beta": {"values": [0.1, 0.2, 0.3]}, "lora_r": {"values": [4]},
                                       "batch_size": {"values": [4]}, "seq_len": {"values": [78]}})
    for minutes, (trial, name) in enumerate(zip(experiment.trials.order_by("number"), FIGURES, strict=True)):
        trial.tags = [name]
        trial.status = "finished"
        (trial.final_loss, trial.final_reward_accuracy, trial.final_reward_margin, trial.final_bpb) = FIGURES[name]
        trial.finished = timezone.now() - timedelta(minutes=10 - minutes)
        trial.save()
    return dataset


def ranked(dataset, team, key):
    rows = team_board(team=team, dataset=dataset, metric=metric_get(key, dataset=dataset))
    return [FIGURES_BY_LOSS[row["loss"]] for row in rows]


FIGURES_BY_LOSS = {figures[0]: name for name, figures in FIGURES.items()}


@pytest.mark.parametrize("key, order", [
    ("val_loss", ["sharp", "steady", "gentle"]), ("reward_accuracy", ["gentle", "steady", "sharp"]),
    ("reward_margin", ["sharp", "steady", "gentle"]), ("bpb", ["gentle", "steady", "sharp"]),
    (None, ["sharp", "steady", "gentle"]), ("val_ppl", ["sharp", "steady", "gentle"])])  # default: the DPO loss
def test_each_dpo_metric_ranks_its_own_way(alice_team, board, key, order):
    assert ranked(board, alice_team, key) == order
    best = cross_team_board(dataset=board, metric=metric_get(key, dataset=board))
    assert FIGURES_BY_LOSS[best[0]["loss"]] == order[0]


def test_equal_preference_accuracies_rank_by_reward_margin(alice_team, board):
    """On a few held-out pairs the accuracy takes few values: of two trials that prefer every pair rightly, the
    one that prefers them by more ranks first, though it finished last."""
    sharp = FIGURES["sharp"][0]
    Trial.objects.filter(experiment__dataset=board, final_loss=sharp).update(final_reward_accuracy=1.0,
                                                                             finished=timezone.now())
    assert ranked(board, alice_team, "reward_accuracy") == ["sharp", "gentle", "steady"]
    best = cross_team_board(dataset=board, metric=metric_get("reward_accuracy", dataset=board))
    assert FIGURES_BY_LOSS[best[0]["loss"]] == "sharp"


def test_the_page_and_the_api_say_which_metric_ranks_and_which_way(alice, alice_client, board):
    page = alice_client.get(reverse("leaderboard", args=[board.pk]), {"metric": "reward_accuracy"}).content.decode()
    assert ("Ranked by <strong>Preference accuracy (chosen answer rewarded higher)</strong>: higher is better; ties go "
            "to the higher reward margin, then to the trial that finished first.") in page
    assert ('aria-sort="descending" title="Ranked by this: higher is better" data-metric="reward_accuracy">'
            'Preference accuracy') in page
    assert [m.column for m in DPO_METRICS.values()] == ["DPO loss", "Preference accuracy", "Reward margin",
                                                       "Chosen bits per byte"]
    assert '<td data-field="reward_accuracy" class="ranked">1.0000</td>' in page
    assert "held-out pairs of prefs" in page
    page = alice_client.get(reverse("leaderboard", args=[board.pk])).content.decode()
    assert ("Ranked by <strong>DPO loss on the held-out pairs</strong>: lower is better; ties go to the trial that "
            "finished first.") in page
    answer = api_for(alice).get(f"/leaderboards/{board.pk}", metric="reward_margin").json()
    assert (answer["metric"], answer["direction"]) == ("reward_margin", "higher is better")
    assert [row["reward_margin"] for row in answer["team"]] == [0.9, 0.4, 0.2]
    chart = alice_client.get(reverse("dashboard_leaderboard", args=[board.pk]), {"metric": "reward_margin"})
    assert "Best reward margin (chosen less rejected) (higher is better)" in chart.content.decode()
