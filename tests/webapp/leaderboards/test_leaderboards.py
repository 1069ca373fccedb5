"""Leaderboards: best first, ties to the earlier finish, teams see only names, metrics and parameters."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.factories import make_experiment
from webapp.leaderboards.selectors import METRICS, cross_team_board, team_board

pytestmark = pytest.mark.django_db


def finish(trial, *, loss, minutes_ago):
    import math

    trial.status = "finished"
    trial.best_val_loss = trial.final_loss = loss
    trial.best_val_ppl = trial.final_ppl = math.exp(loss)
    trial.final_bpb = loss / math.log(2) / 4
    trial.finished = timezone.now() - timedelta(minutes=minutes_ago)
    trial.save()


@pytest.fixture
def boards(alice_team, bob_team):
    alice_data = make_dataset(alice_team, name="alice secret corpus")
    bob_data = make_dataset(bob_team, name="bob secret corpus")  # same text: comparable
    alice_exp = make_experiment(alice_team, alice_data, name="alice sweep")
    bob_exp = make_experiment(bob_team, bob_data, name="bob private sweep")
    a1, a2 = alice_exp.trials.order_by("number")
    b1, b2 = bob_exp.trials.order_by("number")
    finish(a1, loss=2.0, minutes_ago=5)
    finish(a2, loss=2.0, minutes_ago=10)  # same loss, finished earlier: ranks first
    finish(b1, loss=1.5, minutes_ago=1)
    finish(b2, loss=3.0, minutes_ago=2)
    return {"alice_data": alice_data, "bob_data": bob_data, "a1": a1, "a2": a2, "b1": b1, "b2": b2}


def test_it_ranks_the_teams_trials_best_first_with_ties_to_the_earlier_finish(alice_team, boards):
    rows = team_board(team=alice_team, dataset=boards["alice_data"], metric=METRICS["val_ppl"])
    assert [r["trial_id"] for r in rows] == [boards["a2"].pk, boards["a1"].pk]
    assert [r["rank"] for r in rows] == [1, 2]


def test_it_ranks_each_teams_best_across_teams(boards):
    rows = cross_team_board(dataset=boards["alice_data"], metric=METRICS["val_loss"])
    assert [(r["team"], r["value"]) for r in rows] == [("Bob lab", 1.5), ("Alice lab", 2.0)]
    assert set(rows[0]) == {"rank", "team", "team_id", "value", "cells", "bpb", "ppl", "loss", "reward_accuracy",
                            "reward_margin", "params", "finished"}


def test_it_leaves_out_unfinished_trials_and_other_corpora(alice_team, boards):
    other = make_dataset(alice_team, name="other", text="A different corpus entirely. " * 40)
    make_experiment(alice_team, other, name="elsewhere")
    assert cross_team_board(dataset=other, metric=METRICS["val_ppl"]) == []
    assert team_board(team=alice_team, dataset=other, metric=METRICS["val_ppl"]) == []


def test_it_shows_other_teams_results_but_not_their_datasets_or_experiments(alice_client, boards):
    page = alice_client.get(reverse("leaderboard", args=[boards["alice_data"].pk])).content.decode()
    assert "Bob lab" in page and "alice sweep" in page
    assert "bob secret corpus" not in page and "bob private sweep" not in page
    assert reverse("trial_detail", args=[boards["b1"].pk]) not in page


def test_it_answers_404_for_another_teams_dataset_board(alice_client, boards):
    assert alice_client.get(reverse("leaderboard", args=[boards["bob_data"].pk])).status_code == 404


def test_it_requires_login(client, boards):
    for url in [reverse("leaderboard_index"), reverse("leaderboard", args=[boards["alice_data"].pk])]:
        assert client.get(url)["Location"].startswith(reverse("login"))


def test_it_switches_metric_and_falls_back_to_bits_per_byte(alice_client, boards):
    url = reverse("leaderboard", args=[boards["alice_data"].pk])
    assert "Validation loss per token" in alice_client.get(url + "?metric=val_loss").content.decode()
    fallback = alice_client.get(url + "?metric=bogus")
    assert fallback.status_code == 200 and "Validation bits per byte" in fallback.content.decode()


def test_it_opens_on_the_dataset_of_the_latest_result_not_the_newest_dataset(alice_client, alice_team, boards):
    make_dataset(alice_team, name="newer, nothing trained yet")
    response = alice_client.get(reverse("leaderboard_index"))
    assert response["Location"] == reverse("leaderboard", args=[boards["alice_data"].pk])
    page = alice_client.get(response["Location"]).content.decode()
    assert "newer, nothing trained yet (no results yet)</option>" in page
    assert ">alice secret corpus</option>" in page


def test_a_team_without_results_opens_on_its_newest_dataset(alice_client, alice_team):
    make_dataset(alice_team, name="first")
    newest = make_dataset(alice_team, name="second")
    assert alice_client.get(reverse("leaderboard_index"))["Location"] == reverse("leaderboard", args=[newest.pk])


def _header(page: str, table: str) -> list[str]:
    """The column headings of `table`, their text before any marker."""
    head = page.split(f'id="{table}"')[1].split("</thead>")[0]
    return [text.strip() for text in re.findall(r"<th(?:\s[^>]*)?>([^<]*)", head)]


def test_each_metric_has_one_column_the_ranked_one_marked_and_the_team_board_names_the_model(alice_client,
                                                                                            boards):
    url = reverse("leaderboard", args=[boards["alice_data"].pk])
    page = alice_client.get(url).content.decode()
    assert _header(page, "team-board") == ["Rank", "Bits per byte", "Perplexity per token", "Loss per token",
                                           "Model", "Experiment", "Trial", "Parameters", "Status", "Finished"]
    assert _header(page, "cross-board") == ["Rank", "Team", "Bits per byte", "Perplexity per token",
                                            "Loss per token", "Parameters", "Finished"]  # no other team's model
    assert page.count('class="ranked" aria-sort="ascending" title="Ranked by this: lower is better" '
                      'data-metric="bpb"') == 2
    assert page.count('<td data-field="model">GPT-2 micro</td>') == 2
    by_loss = alice_client.get(url + "?metric=val_loss").content.decode()
    assert 'data-metric="val_loss">Loss per token <span class="muted">▲</span>' in by_loss
    assert '<td data-field="val_loss" class="ranked">2.0000</td>' in by_loss
