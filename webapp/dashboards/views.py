"""Dashboard pages and their JSON polls. Thin: scope the object, read through selectors, draw with figures.

Every URL needs a login and a current team (`team_required`: a user in none is sent to the teams page), and
reaches experiments, trials and datasets only through `team_scoped_get`, so another team's id answers 404. A
page embeds its figures with ``json_script`` and a state (cursor, poll URL, whether anything runs);
``dashboards.js`` polls only while something runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import BadRequest
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from webapp.accounts.selectors import team_scoped_get
from webapp.csv_cells import csv_lines
from webapp.dashboards import figures, reward_figures, selectors
from webapp.datasets.http import team_required
from webapp.datasets.models import Dataset
from webapp.ground.models import Experiment, Trial
from webapp.ids import parse_id
from webapp.leaderboards.selectors import metric_get, team_board
from webapp.telemetry.models import EvalMetric, StepMetric

POLL_MS = 3000


def _choice(request: HttpRequest, name: str, options: tuple[Any, ...], default: Any) -> Any:
    raw = request.GET.get(name)
    if raw is None:
        return default
    for option in options:
        if str(option) == raw:
            return option
    raise BadRequest(f"{name}={raw!r}: use one of {', '.join(map(str, options))}.")


def _count(request: HttpRequest, name: str) -> int | None:
    """A cursor from the query string: an id (ASCII digits in the database's range), else BadRequest."""
    raw = request.GET.get(name)
    if raw is None:
        return None
    value = parse_id(raw)
    if value is None:
        raise BadRequest(f"{name}={raw[:40]!r} must be a non-negative integer.")
    return value


def _experiment(request: HttpRequest, experiment_id: int) -> Experiment:
    """The team's experiment, or Http404 (also for another team's)."""
    return team_scoped_get(Experiment.objects.select_related("dataset", "team"), team=request.team,
                           pk=experiment_id)


def _trial(request: HttpRequest, trial_id: int) -> Trial:
    """The team's trial, or Http404 (also for another team's)."""
    return team_scoped_get(Trial.objects.select_related("experiment__dataset"), team=request.team,
                           team_field="experiment__team", pk=trial_id)


def _compared(request: HttpRequest, experiment: Experiment) -> list[Experiment]:
    """The experiment and those picked to compare with it: the team's, on the same dataset."""
    raw = request.GET.getlist("compare")
    ids = [parse_id(i) for i in raw]
    if None in ids:
        raise BadRequest("compare= takes experiment ids.")
    others = Experiment.objects.filter(team=experiment.team, dataset=experiment.dataset, pk__in=ids)
    others = others.exclude(pk=experiment.pk)
    return [experiment, *others.order_by("created", "pk")]


@team_required
@require_GET
def experiment_curves(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    experiments = _compared(request, experiment)
    x = _choice(request, "x", figures.X_AXES, "step")
    metric = _choice(request, "metric", figures.METRICS, "loss")
    smoothing = _choice(request, "smooth", figures.SMOOTHING_CHOICES, figures.DEFAULT_SMOOTHING)
    log_y = request.GET.get("logy") == "1"
    trials = selectors.experiment_trials(experiments=experiments)
    curves = selectors.curves(trials=trials)
    query = request.GET.copy()
    query.pop("after_step", None)
    query.pop("after_eval", None)
    state = {
        "kind": "curves",
        "url": f"{reverse('dashboard_curves_data', args=[experiment.pk])}?{query.urlencode()}",
        "cursor": {"after_step": curves.cursor.step, "after_eval": curves.cursor.eval},
        "running": any(selectors.experiment_is_running(experiment=e) for e in experiments),
        "poll_ms": POLL_MS,
        "smoothing": smoothing,
    }
    siblings = Experiment.objects.filter(team=experiment.team, dataset=experiment.dataset).exclude(pk=experiment.pk)
    return render(request, "dashboards/curves.html", {
        "experiment": experiment,
        "trials": trials,
        "siblings": siblings.order_by("-created"),
        "compared": {e.pk for e in experiments},
        "x": x, "metric": metric, "smoothing": smoothing, "log_y": log_y,
        "x_axes": figures.X_AXES, "metrics": figures.METRICS, "smoothing_choices": figures.SMOOTHING_CHOICES,
        "curves_figure": figures.learning_curves(curves, x=x, metric=metric, smoothing=smoothing, log_y=log_y),
        "parallel_figure": figures.hyperparameters(trials, metric=metric),
        "scatter_figure": figures.hyperparameter_scatter(trials, metric=metric),
        "reward_figure": reward_figures.reward_curves(selectors.reward_curves(trials=trials, until=curves.cursor),
                                                      trials),
        "state": state,
    })


@team_required
@require_GET
def experiment_curves_data(request: HttpRequest, experiment_id: int) -> JsonResponse:
    """What is new since the cursor (or everything, downsampled, without one), on the page's axes:
    ``{"cursor", "running", "points", "rewards", "trials"}``."""
    experiment = _experiment(request, experiment_id)
    experiments = _compared(request, experiment)
    x = _choice(request, "x", figures.X_AXES, "step")
    metric = _choice(request, "metric", figures.METRICS, "loss")
    trials = selectors.experiment_trials(experiments=experiments)
    running = any(selectors.experiment_is_running(experiment=e) for e in experiments)
    return _curves_answer(request, trials, x=x, metric=metric, running=running)


def _curves_answer(request: HttpRequest, trials: list[selectors.TrialInfo], *, x: figures.XAxis,
                   metric: figures.Metric, running: bool) -> JsonResponse:
    """The poll's answer for `trials`: what is new since the request's cursor, on the given axes, and the new
    rewards of its DPO trials (``rewards``, always per step)."""
    after_step, after_eval = _count(request, "after_step"), _count(request, "after_eval")
    # Without a cursor: the whole history at the level of detail that fits the budget (a first load).
    after = None if after_step is None and after_eval is None else selectors.Cursor(after_step or 0, after_eval or 0)
    curves = selectors.curves(trials=trials, after=after)
    points = figures.curve_points(curves, x=x, metric=metric)
    return JsonResponse({
        "cursor": {"after_step": curves.cursor.step, "after_eval": curves.cursor.eval},
        "running": running,
        "points": {str(tid): p for tid, p in points.items() if p["x"] or p["eval_x"]},
        "rewards": reward_figures.reward_points(selectors.reward_curves(trials=trials, after=after,
                                                                        until=curves.cursor)),
        "trials": _trial_rows(trials),
    })


def _trial_rows(trials: list[selectors.TrialInfo]) -> dict[str, dict[str, Any]]:
    return {str(t.id): {"status": t.status, "step": t.step, "total_steps": t.total_steps,
                        "best_val_loss": t.best_val_loss, "best_val_ppl": t.best_val_ppl} for t in trials}


def trial_curves(trial: Trial) -> dict[str, Any]:
    """The trial page's own learning curves: the figure and the poll state ``dashboards.js`` keeps them live
    with (``figure``, ``state``), and a DPO trial's rewards (``rewards``; None for any other trial)."""
    trials = selectors.trial_infos([trial])
    curves = selectors.curves(trials=trials)
    return {
        "figure": figures.learning_curves(curves),
        "rewards": reward_figures.reward_curves(selectors.reward_curves(trials=trials, until=curves.cursor), trials),
        "state": {"kind": "curves", "url": reverse("dashboard_trial_curves_data", args=[trial.pk]),
                  "cursor": {"after_step": curves.cursor.step, "after_eval": curves.cursor.eval},
                  "running": trial.is_active, "poll_ms": POLL_MS, "smoothing": figures.DEFAULT_SMOOTHING},
    }


@team_required
@require_GET
def trial_curves_data(request: HttpRequest, trial_id: int) -> JsonResponse:
    """The trial's steps and evaluations since the cursor, as `experiment_curves_data` answers for its
    experiment (the trial page's curves)."""
    trial = _trial(request, trial_id)
    return _curves_answer(request, selectors.trial_infos([trial]), x="step", metric="loss", running=trial.is_active)


@team_required
@require_GET
def experiment_devices(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = _experiment(request, experiment_id)
    trials = selectors.experiment_trials(experiments=[experiment])
    devices = selectors.devices(experiment=experiment, trials=trials)
    state = {
        "kind": "devices",
        "url": reverse("dashboard_devices_data", args=[experiment.pk]),
        "cursor": {"after": devices.cursor, "samples_after": devices.sample_after},
        "running": selectors.experiment_is_running(experiment=experiment),
        "poll_ms": POLL_MS,
        "span_limit": selectors.SPAN_LIMIT,
    }
    return render(request, "dashboards/devices.html", {
        "experiment": experiment,
        "trials": trials,
        "timeline_figure": figures.device_timeline(devices, trials),
        "utilization_figure": figures.device_utilization(devices.samples, devices.origin),
        "memory_figure": figures.device_memory(devices.samples, devices.origin,
                                               selectors.planned_budgets(experiment=experiment)),
        "state": state,
    })


@team_required
@require_GET
def experiment_devices_data(request: HttpRequest, experiment_id: int) -> JsonResponse:
    experiment = _experiment(request, experiment_id)
    trials = selectors.experiment_trials(experiments=[experiment])
    raw_after = request.GET.get("samples_after", "")
    try:
        samples_after = float(raw_after) if raw_after else None
    except ValueError:
        samples_after = math.nan
    if samples_after is not None and not math.isfinite(samples_after):
        raise BadRequest(f"samples_after={raw_after[:40]!r} must be a number of seconds.")
    devices = selectors.devices(experiment=experiment, trials=trials, after=_count(request, "after") or 0,
                                sample_after=samples_after)
    return JsonResponse({
        "cursor": {"after": devices.cursor, "samples_after": devices.sample_after},
        "running": selectors.experiment_is_running(experiment=experiment),
        **figures.device_points(devices, trials),
        "trials": _trial_rows(trials),
    })


@team_required
@require_GET
def trial_plan(request: HttpRequest, trial_id: int) -> HttpResponse:
    trial = _trial(request, trial_id)
    return render(request, "dashboards/plan.html", {
        "trial": trial,
        "plan_figure": figures.memory_plan(trial.plan) if trial.plan else None,
        # A LoRA trial's frozen base weights, read from the host's one shared copy (0 for full training).
        "frozen_bytes": (trial.plan or {}).get("frozen_bytes") or 0,
    })


@team_required
@require_GET
def experiment_metrics_csv(request: HttpRequest, experiment_id: int) -> StreamingHttpResponse:
    """Every stored step and evaluation of the experiment's trials (current attempts), streamed."""
    experiment = _experiment(request, experiment_id)
    response = StreamingHttpResponse(csv_lines(_metric_rows(experiment)), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="experiment-{experiment.pk}-metrics.csv"'
    return response


def _metric_rows(experiment: Experiment) -> Iterator[list[object]]:
    yield ["trial", "split", "step", "tokens", "time", "loss", "perplexity", "lr"]
    trials = {t.pk: (t.number, t.attempt) for t in experiment.trials.all()}
    for pk, (number, attempt) in sorted(trials.items(), key=lambda item: item[1]):
        steps = StepMetric.objects.filter(trial_id=pk, attempt=attempt).order_by("step")
        for step, tokens, time, loss, lr in steps.values_list("step", "tokens", "time", "loss", "lr").iterator():
            yield [number, "train", step, tokens, time, loss, figures.perplexity(loss), lr]
        evals = EvalMetric.objects.filter(trial_id=pk, attempt=attempt).order_by("step")
        for step, time, loss, ppl in evals.values_list("step", "time", "loss", "perplexity").iterator():
            yield [number, "validation", step, "", time, loss, ppl, ""]


@team_required
@require_GET
def dataset_leaderboard(request: HttpRequest, dataset_id: int) -> HttpResponse:
    """The team's board on a dataset as a chart beside its table (the leaderboards app ranks, we draw)."""
    dataset = team_scoped_get(Dataset.objects.all(), team=request.team, pk=dataset_id)
    metric = metric_get(request.GET.get("metric"), dataset=dataset)
    rows = team_board(team=request.team, dataset=dataset, metric=metric, limit=50)
    chart_rows = [(f"{r['experiment']} #{r['number']}", r["value"]) for r in rows]
    return render(request, "dashboards/leaderboard.html", {
        "dataset": dataset,
        "metric": metric,
        "rows": rows,
        "leaderboard_figure": figures.leaderboard(chart_rows, metric=metric.label.lower(),
                                                  direction=metric.direction),
    })
