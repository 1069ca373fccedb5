"""Leaderboard pages: pick a dataset and a metric; see the team's board (a page at a time) and the cross-team
board."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from webapp.datasets.http import team_required
from webapp.datasets.selectors import dataset_get
from webapp.leaderboards import selectors
from webapp.paging import page_get


@team_required
def leaderboard_index(request: HttpRequest) -> HttpResponse:
    opened = selectors.board_default(team=request.team)
    if opened is not None:
        return redirect("leaderboard", dataset_id=opened.pk)
    return render(request, "leaderboards/leaderboard.html", {"datasets": [], "dataset": None})


@team_required
def leaderboard(request: HttpRequest, dataset_id: int) -> HttpResponse:
    dataset = dataset_get(team=request.team, dataset_id=dataset_id)
    metric = selectors.metric_get(request.GET.get("metric"), dataset=dataset)
    holdout = selectors.holdout_get(request.GET.get("holdout"))
    page = page_get(selectors.team_ranked(team=request.team, dataset=dataset, metric=metric, holdout_bytes=holdout),
                    request.GET.get("page"))
    return render(request, "leaderboards/leaderboard.html", {
        "dataset": dataset,
        "datasets": selectors.board_datasets(team=request.team),
        "with_results": selectors.datasets_with_results(team=request.team),
        "metric": metric,
        "metrics": selectors.metrics_of(dataset).values(),
        "holdout": holdout,
        "holdouts": [h for h in selectors.holdout_choices(dataset=dataset) if h != holdout],
        "measured_on": selectors.measured_on(dataset=dataset, holdout_bytes=holdout),
        "page": page,
        "team_rows": selectors.board_rows(page, metric=metric, first_rank=page.start_index()),
        "cross_rows": selectors.cross_team_board(dataset=dataset, metric=metric, holdout_bytes=holdout),
    })
