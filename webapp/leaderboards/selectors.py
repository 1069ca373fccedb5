"""Leaderboards: trials ranked per dataset and metric, within a team and across teams.

Lower is better for every metric. Ties go to the trial that finished first, then the older trial. Across
teams, datasets compare when their fingerprints match (same corpus, vocabulary and split; the built-in
sample corpus is the common case), and a team sees other teams' names, metrics and parameters only: never
their datasets, experiments or models.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import F, QuerySet, Window
from django.db.models.functions import RowNumber

from webapp.accounts.models import Team
from webapp.datasets.models import Dataset
from webapp.experiments.models import Trial


@dataclass(frozen=True)
class Metric:
    key: str
    field: str
    label: str


METRICS: dict[str, Metric] = {
    m.key: m
    for m in [
        Metric("val_ppl", "best_val_ppl", "Validation perplexity"),
        Metric("val_loss", "best_val_loss", "Validation loss"),
    ]
}
DEFAULT_METRIC = "val_ppl"


def metric_get(key: str | None) -> Metric:
    """The metric called `key`, or the default (validation perplexity) for a missing or unknown key."""
    return METRICS.get(key or DEFAULT_METRIC, METRICS[DEFAULT_METRIC])


def _ranked(trials: QuerySet[Trial], metric: Metric) -> QuerySet[Trial]:
    """`trials` with a value for `metric`, best first: ties to the earlier finish, then the older trial."""
    return trials.filter(**{f"{metric.field}__isnull": False}).order_by(
        F(metric.field).asc(), F("finished").asc(nulls_last=True), "pk"
    )


def team_ranked(*, team: Team, dataset: Dataset, metric: Metric) -> QuerySet[Trial]:
    """Every trial of `team` on `dataset` with a value for `metric`, best first, with its experiment."""
    trials = Trial.objects.filter(experiment__team=team, experiment__dataset=dataset).select_related("experiment")
    return _ranked(trials, metric)


def board_rows(trials: Iterable[Trial], *, metric: Metric, first_rank: int = 1) -> list[dict[str, Any]]:
    """The rows of a team's board for `trials` (ranked already), numbered from `first_rank`."""
    return [
        {
            "rank": rank, "value": getattr(t, metric.field), "trial_id": t.pk, "number": t.number,
            "experiment_id": t.experiment_id, "experiment": t.experiment.name, "params": t.params,
            "status": t.get_status_display(), "finished": t.finished,
        }
        for rank, t in enumerate(trials, start=first_rank)
    ]


def team_board(*, team: Team, dataset: Dataset, metric: Metric, limit: int = 200) -> list[dict[str, Any]]:
    """The best `limit` trials of `team` on `dataset` with a value for `metric`, best first."""
    return board_rows(team_ranked(team=team, dataset=dataset, metric=metric)[:limit], metric=metric)


def cross_team_board(*, dataset: Dataset, metric: Metric) -> list[dict[str, Any]]:
    """The best trial of every team on datasets comparable to `dataset`, best team first.

    Rows carry only the team's name, the value, the parameters and when it finished. The database picks each
    team's best (a window over the ranked trials), so the page reads one row per team however many trials
    the teams ran.
    """
    order = [F(metric.field).asc(), F("finished").asc(nulls_last=True), F("pk").asc()]
    best = (
        _ranked(Trial.objects.filter(experiment__dataset__fingerprint=dataset.fingerprint), metric)
        .annotate(team_rank=Window(RowNumber(), partition_by=[F("experiment__team_id")], order_by=order))
        .filter(team_rank=1)
        .select_related("experiment__team")
        .only("pk", "params", "finished", metric.field, "experiment__team__name", "experiment__team_id")
    )
    return [
        {"rank": rank, "team": trial.experiment.team.name, "team_id": trial.experiment.team_id,
         "value": getattr(trial, metric.field), "params": trial.params, "finished": trial.finished}
        for rank, trial in enumerate(best, start=1)
    ]


def board_datasets(*, team: Team | None) -> QuerySet[Dataset]:
    """The team's datasets, for choosing a board."""
    if not team:  # request.team is a lazy object; test its truth
        return Dataset.objects.none()
    return Dataset.objects.filter(team=team).order_by("name")
