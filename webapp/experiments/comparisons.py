"""Saved comparisons: a team's named sets of its experiments whose learning curves it compares.

One is saved from the curves page with that page's settings and opens it again as it was. Only the team's
own experiments are ever in one; an experiment deleted since leaves the comparison, which opens with the
ones left. Any member saves one; its creator and the team's owners delete it (`webapp.accounts.roles`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import urlencode

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, QuerySet
from django.urls import reverse

from webapp.accounts.models import Team
from webapp.accounts.roles import require_creator_or_owner
from webapp.accounts.selectors import team_scoped_get
from webapp.dashboards import figures
from webapp.ground.models import Experiment, SavedComparison
from webapp.nul_text import refuse_nul

MAX_EXPERIMENTS = 50


def _view_choices() -> dict[str, tuple[str, ...]]:
    """The curves page's settings a comparison keeps, with the values that page takes."""
    return {"x": tuple(figures.X_AXES), "metric": tuple(figures.METRICS),
            "smooth": tuple(str(s) for s in figures.SMOOTHING_CHOICES), "logy": ("1",)}


def view_clean(view: Mapping[str, str]) -> dict[str, str]:
    """The curves page's settings in `view` that it takes; others are dropped (the page's defaults)."""
    return {key: view[key] for key, options in _view_choices().items() if view.get(key) in options}


def comparison_list(*, team: Team | None) -> QuerySet[SavedComparison]:
    """The team's saved comparisons, newest first, each with ``n_experiments`` (those not deleted)."""
    if not team:
        return SavedComparison.objects.none()
    return (SavedComparison.objects.filter(team=team).select_related("created_by")
            .annotate(n_experiments=Count("experiments")).order_by("-created", "-pk"))


def comparison_get(*, team: Team | None, comparison_id: int) -> SavedComparison:
    """The team's saved comparison, or Http404 (also for another team's)."""
    return team_scoped_get(SavedComparison.objects.all(), team=team, pk=comparison_id)


def comparison_experiments(comparison: SavedComparison) -> list[Experiment]:
    """The comparison's experiments still there, oldest first (the curves page's order)."""
    return list(comparison.experiments.filter(team_id=comparison.team_id).order_by("created", "pk"))


def curves_url(experiments: list[Experiment], view: Mapping[str, str]) -> str:
    """The curves page of the first of `experiments`, comparing the others, with the settings `view`."""
    first, *others = experiments
    query = [("compare", str(e.pk)) for e in others] + sorted(view_clean(view).items())
    return reverse("dashboard_curves", args=[first.pk]) + ("?" + urlencode(query) if query else "")


def comparison_url(comparison: SavedComparison) -> str | None:
    """The curves page that shows the comparison: its oldest experiment's, comparing the others, with the
    saved settings; None when all its experiments were deleted."""
    experiments = comparison_experiments(comparison)
    return curves_url(experiments, comparison.view) if experiments else None


def comparison_create(*, team: Team, actor: AbstractBaseUser, name: str, experiment_ids: Iterable[int],
                      view: Mapping[str, str] | None = None) -> SavedComparison:
    """Save the team's experiments `experiment_ids` as the comparison `name`. ValidationError when the name is
    empty, too long, taken in the team or holds a null character, or when an id is not one of the team's
    experiments (nothing is saved then)."""
    refuse_nul(name, field="name")
    name = " ".join(name.split())
    ids = list(dict.fromkeys(experiment_ids))
    if not name:
        raise ValidationError({"name": "Name the comparison."})
    if len(name) > SavedComparison.NAME_MAX_CHARS:
        raise ValidationError({"name": f"A name is at most {SavedComparison.NAME_MAX_CHARS} characters."})
    if not ids:
        raise ValidationError("Choose the experiments to compare.")
    if len(ids) > MAX_EXPERIMENTS:
        raise ValidationError(f"A comparison holds at most {MAX_EXPERIMENTS} experiments.")
    experiments = list(Experiment.objects.filter(team=team, pk__in=ids))
    if len(experiments) != len(ids):
        raise ValidationError("Only your team's experiments can be compared.")
    try:
        with transaction.atomic():
            comparison = SavedComparison.objects.create(team=team, name=name, view=view_clean(view or {}),
                                                        created_by=actor if actor.is_authenticated else None)
            comparison.experiments.set(experiments)
    except IntegrityError:
        raise ValidationError({"name": f"The team already has a comparison named {name!r}."}) from None
    return comparison


def comparison_delete(*, comparison: SavedComparison, actor: AbstractBaseUser) -> None:
    """Delete the comparison (its experiments stay). PermissionDenied unless `actor` created it or owns the
    team."""
    require_creator_or_owner(user=actor, team=comparison.team, created_by_id=comparison.created_by_id,
                             what=f"comparison {comparison.name!r}")
    comparison.delete()
