"""Pages that organize a team's experiments: tags and notes of an experiment or a trial, saved comparisons.

As everywhere, an experiment, trial or comparison is reached only through the team-scoped getters, so another
team's id answers 404; a write the user's role does not allow answers 403 (`webapp.accounts.roles`).
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from webapp.accounts.roles import can_change
from webapp.datasets.http import form_add_errors, team_required
from webapp.experiments import comparisons, selectors, services
from webapp.experiments.annotations import AnnotationsForm, annotations_set
from webapp.ground.models import Experiment, Trial
from webapp.ids import parse_id
from webapp.paging import page_get


def _annotations(request: HttpRequest, obj: Experiment | Trial, *, back: str) -> HttpResponse:
    """Show (GET) or save (POST) the tags and notes of `obj`; saved, back to `back`, its page."""
    experiment = obj if isinstance(obj, Experiment) else obj.experiment
    services.experiment_require_change(actor=request.user, experiment=experiment)
    form = AnnotationsForm(request.POST) if request.method == "POST" else AnnotationsForm.of(obj)
    if request.method == "POST" and form.is_valid():
        try:
            annotations_set(obj=obj, actor=request.user, tags=form.cleaned_data["tags"],
                            notes=form.cleaned_data["notes"])
        except ValidationError as error:
            form_add_errors(form, error)
        else:
            messages.success(request, "Tags and notes saved.")
            return redirect(back + "#notes")
    return render(request, "experiments/annotations_form.html", {
        "form": form, "experiment": experiment, "trial": obj if isinstance(obj, Trial) else None, "back": back,
    }, status=400 if form.errors else 200)


@team_required
@require_http_methods(["GET", "POST"])
def experiment_annotations(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = selectors.experiment_get(team=request.team, experiment_id=experiment_id)
    return _annotations(request, experiment, back=reverse("experiment_detail", args=[experiment.pk]))


@team_required
@require_http_methods(["GET", "POST"])
def trial_annotations(request: HttpRequest, trial_id: int) -> HttpResponse:
    trial = selectors.trial_get(team=request.team, trial_id=trial_id)
    return _annotations(request, trial, back=reverse("trial_detail", args=[trial.pk]))


@team_required
@require_GET
def comparison_list(request: HttpRequest) -> HttpResponse:
    """The team's saved comparisons, newest first, a page at a time."""
    page = page_get(comparisons.comparison_list(team=request.team), request.GET.get("page"))
    owner = can_change(user=request.user, team=request.team, created_by_id=None)  # an owner deletes any
    return render(request, "experiments/comparison_list.html", {
        "page": page,
        "rows": [{"comparison": c, "can_delete": owner or c.created_by_id == request.user.pk} for c in page],
    })


@team_required
@require_POST
def comparison_create(request: HttpRequest) -> HttpResponse:
    """Save the posted experiments (``experiments``, the curves page's) as a named comparison, with the curves
    page's settings; back to that page either way, saying what happened."""
    raw_ids = request.POST.getlist("experiments")
    ids = [parse_id(raw) for raw in raw_ids]
    view = {key: request.POST.get(key, "") for key in ("x", "metric", "smooth", "logy")}
    try:
        if None in ids:
            raise ValidationError("Choose the experiments to compare.")
        comparison = comparisons.comparison_create(team=request.team, actor=request.user,
                                                   name=request.POST.get("name", ""),
                                                   experiment_ids=[i for i in ids if i is not None], view=view)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        own = list(selectors.experiment_list(team=request.team).filter(pk__in=[i for i in ids if i is not None])
                   .order_by("created", "pk"))
        return redirect(comparisons.curves_url(own, view) if own else reverse("experiment_list"))
    messages.success(request, f"Comparison {comparison.name!r} saved.")
    return redirect(comparisons.comparison_url(comparison) or reverse("comparison_list"))


@team_required
@require_GET
def comparison_open(request: HttpRequest, comparison_id: int) -> HttpResponse:
    """The comparison's curves page, with the experiments it still has."""
    comparison = comparisons.comparison_get(team=request.team, comparison_id=comparison_id)
    url = comparisons.comparison_url(comparison)
    if url is None:
        messages.warning(request, f"Every experiment of comparison {comparison.name!r} was deleted.")
        return redirect("comparison_list")
    return redirect(url)


@team_required
@require_POST
def comparison_delete(request: HttpRequest, comparison_id: int) -> HttpResponse:
    comparison = comparisons.comparison_get(team=request.team, comparison_id=comparison_id)
    comparisons.comparison_delete(comparison=comparison, actor=request.user)
    messages.success(request, f"Comparison {comparison.name!r} deleted; its experiments stay.")
    return redirect("comparison_list")
