"""Experiments: create one from a search space (the form's own YAML/JSON schema, checked by the form itself),
preview its memory plan, launch, cancel, retry, clone with changes, list with the page's filters, read one
and its trials."""

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.dateparse import parse_datetime
from ninja import Query, Router, Schema, Status
from ninja.pagination import paginate

from webapp.api.auth import audit, team_of
from webapp.api.pagination import BoundedLimitOffset
from webapp.api.schemas import CountOut, ExperimentOut, PreviewOut, TrialOut
from webapp.api.trials import trial_out
from webapp.experiments import previews, selectors, services
from webapp.experiments.events import trial_events_sync_quietly
from webapp.experiments.forms import ExperimentForm
from webapp.experiments.listing import ExperimentListQuery, experiments_listed, trials_sorted
from webapp.experiments.objective import DPO_PARAMETERS
from webapp.experiments.search_space import OBJECTIVE_KEY, PARAMETERS
from webapp.experiments.space_rows import ParameterRowFormSet
from webapp.ground.models import Experiment, ExperimentPreview

router = Router(tags=["experiments"])

# The API's names for the form's fields, where they differ.
FIELD_NAMES = {"space_text": "space", "__all__": "__all__"}


class ExperimentIn(Schema):
    """What the new-experiment form takes. ``space`` is the search space as the form's text box takes it (and
    as an experiment's search-space download gives it): YAML or JSON text, or the same as an object, with
    the parameters and optionally ``model``, ``pruner``, ``checkpoint_minutes``, ``holdout_bytes``,
    ``max_devices_per_trial`` and ``chat_template``. Without a ``model`` entry the model is the preset
    gpt2-micro. ``objective`` is ``sft`` (the language-modelling loss) or ``dpo`` (preference tuning of a
    checkpoint on a preference dataset, searching the space's ``dpo_beta`` and ``dpo_loss_type``)."""

    name: str
    dataset: int
    space: str | dict[str, Any]
    strategy: str = "grid"
    n_trials: int = 8
    budget_unit: str = "steps"
    budget: float = 200
    eval_every: int = 20
    seed: int = 0
    memory_budget_mib: int | None = None  # empty: auto, from the devices
    early_stop_patience: int | None = None
    priority: str = "normal"
    holdout_bytes: int | None = None
    chat_template: str = ""
    objective: str = "sft"
    launch: bool = False


class ExperimentChanges(Schema):
    """A clone's changes: any field of `ExperimentIn`; the rest is the source experiment's."""

    name: str | None = None
    dataset: int | None = None
    space: str | dict[str, Any] | None = None
    strategy: str | None = None
    n_trials: int | None = None
    budget_unit: str | None = None
    budget: float | None = None
    eval_every: int | None = None
    seed: int | None = None
    memory_budget_mib: int | None = None
    early_stop_patience: int | None = None
    priority: str | None = None
    holdout_bytes: int | None = None
    chat_template: str | None = None
    objective: str | None = None
    launch: bool = False


class ExperimentFilters(Schema):
    q: str = ""  # the search box: words of the name, tag:... terms
    tag: str = ""
    dataset: str = ""
    model: str = ""
    status: str = ""
    sort: str = "newest"


def _form(request: HttpRequest, body: dict[str, Any]) -> ExperimentForm:
    """The experiment form bound to `body`, as the page would post it."""
    space = body["space"]
    text = space if isinstance(space, str) else json.dumps(space)
    mib = body.get("memory_budget_mib")
    data = {
        "name": body["name"], "dataset": str(body["dataset"]), "model_kind": "preset", "preset": "gpt2-micro",
        "space_text": text, "strategy": body["strategy"], "n_trials": body["n_trials"],
        "budget_unit": body["budget_unit"], "budget": body["budget"], "eval_every": body["eval_every"],
        "seed": body["seed"], "memory_budget": "auto" if mib is None else "explicit",
        "memory_budget_mib": mib, "early_stop_patience": body.get("early_stop_patience"), "pruner": "none",
        "priority": body["priority"], "holdout_bytes": body.get("holdout_bytes"),
        "chat_template": body.get("chat_template") or "", "objective": body.get("objective") or "sft",
        "space-TOTAL_FORMS": "0", "space-INITIAL_FORMS": "0",
    }
    data = {key: "" if value is None else str(value) for key, value in data.items()}
    return ExperimentForm(data, team=team_of(request), rows=ParameterRowFormSet(data, prefix="space"))


def _form_errors(form: ExperimentForm) -> ValidationError:
    errors: dict[str, list[str]] = {}
    for field, messages in form.errors.items():
        errors.setdefault(FIELD_NAMES.get(field, field), []).extend(messages)
    for message in form.rows.non_form_errors():
        errors.setdefault("space", []).append(message)
    return ValidationError(errors or {"__all__": ["The experiment is not valid."]})


def _draft(form: ExperimentForm) -> Any:
    if not form.is_valid():
        raise _form_errors(form)
    return form.cleaned_data["draft"]


def _plan_error(form: ExperimentForm, error: Exception) -> ValidationError:
    """A planning error placed as the form places it, under the API's field names."""
    form.add_draft_error(error)
    return _form_errors(form)


def experiments_out(experiments: list[Experiment]) -> list[dict[str, Any]]:
    """`ExperimentOut` of experiments annotated by `experiments_listed`, their trials counted in one query."""
    counts = selectors.experiment_trial_counts(experiments=experiments)
    return [_experiment_out(e, counts[e.pk]) for e in experiments]


def _experiment_out(experiment: Experiment, counts: dict[str, int]) -> dict[str, Any]:
    return {
        "id": experiment.pk, "name": experiment.name, "dataset": experiment.dataset_id,
        "dataset_name": experiment.dataset.name, "status": experiment.status, "model": experiment.model,
        "strategy": experiment.strategy, "n_trials": experiment.n_trials, "budget_unit": experiment.budget_unit,
        "budget": experiment.budget, "eval_every": experiment.eval_every, "seed": experiment.seed,
        "priority": experiment.priority, "max_devices_per_trial": experiment.max_devices_per_trial,
        "objective": experiment.objective, **_dpo_out(experiment), "trials": counts, "created": experiment.created,
        "launched": experiment.launched, "cloned_from": experiment.cloned_from_id, "tags": experiment.tags,
    }


def _dpo_out(experiment: Experiment) -> dict[str, Any]:
    """A DPO experiment's searched ``dpo_beta`` and ``dpo_loss_type`` (each its search-space dimension, or the
    default as a one-value dimension); nothing for any other objective."""
    if experiment.objective != Experiment.Objective.DPO:
        return {}
    return {name: experiment.search_space.get(name) or {"kind": "categorical", "values": [PARAMETERS[name].default]}
            for name in DPO_PARAMETERS}


def _listed(request: HttpRequest, experiment_id: int) -> Experiment:
    team = team_of(request)
    selectors.experiment_get(team=team, experiment_id=experiment_id)  # 404 for another team's
    return experiments_listed(Experiment.objects.filter(pk=experiment_id).select_related("dataset"),
                              ExperimentListQuery()).get()


def _create(request: HttpRequest, body: dict[str, Any], *, source: Experiment | None = None) -> dict[str, Any]:
    form = _form(request, body)
    draft = _draft(form)
    team = team_of(request)
    try:
        experiment = services.experiment_create(team=team, user=request.user, draft=draft, cloned_from=source)
    except previews.PreviewPending as pending:
        raise ValidationError({"space": [f"{pending} Preview: /api/v1/experiments/previews/"
                                         f"{pending.preview.pk}"]}) from None
    except services.PLAN_ERRORS as error:
        raise _plan_error(form, error) from None
    audit(request, "experiment.clone" if source else "experiment.create", f"experiment {experiment.pk}")
    if body.get("launch"):
        services.experiment_launch(experiment=experiment, actor=request.user)
        audit(request, "experiment.launch", f"experiment {experiment.pk}")
    return experiments_out([_listed(request, experiment.pk)])[0]


class _Page:
    """The list as the paginator slices it, each experiment turned into `ExperimentOut` only once sliced."""

    def __init__(self, queryset: QuerySet[Experiment]) -> None:
        self.queryset = queryset

    def count(self) -> int:
        return self.queryset.count()

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, index: slice) -> list[dict[str, Any]]:
        return experiments_out(list(self.queryset[index]))


@router.get("", response=list[ExperimentOut], summary="The team's experiments, filtered and sorted as on the page")
@paginate(BoundedLimitOffset)
def experiment_list(request: HttpRequest, filters: ExperimentFilters = Query(...)) -> _Page:
    query = ExperimentListQuery.from_get(filters.dict())
    listed = experiments_listed(selectors.experiment_list(team=team_of(request)), query)
    return _Page(listed)


@router.post("", response={201: ExperimentOut}, summary="Create an experiment (and launch it with launch: true)")
def experiment_create(request: HttpRequest, body: ExperimentIn) -> Status:
    """Checked by the new-experiment form: the same rules and the same messages, under the field that caused
    them (``space`` for the search-space text)."""
    return Status(201, _create(request, body.dict()))


@router.post("/preview", response=PreviewOut, summary="The trials an experiment would start with, and their memory")
def experiment_preview(request: HttpRequest, body: ExperimentIn) -> dict[str, Any]:
    """A small sweep is planned in the request (``status`` ready). A large one is planned by the web worker:
    ``status`` preparing and an ``id`` to poll at /experiments/previews/{id}."""
    form = _form(request, body.dict())
    draft = _draft(form)
    try:
        if previews.plans_in_background(draft):
            return _stored(previews.experiment_preview_request(team=team_of(request), draft=draft))
        budget, _ = services.memory_budget(explicit_bytes=draft.memory_budget_bytes)
        trials = services.experiment_plan(draft=draft)
    except services.PLAN_ERRORS as error:
        raise _plan_error(form, error) from None
    return {"status": ExperimentPreview.Status.READY, "budget_bytes": budget,
            "trials": [_preview_trial(t) for t in trials]}


def _preview_trial(trial: Any) -> dict[str, Any]:
    return {"number": trial.number, "params": trial.params, "total_steps": trial.total_steps,
            "plan": selectors.plan_summary(trial.plan)}


def _stored(preview: ExperimentPreview) -> dict[str, Any]:
    return {"status": preview.status, "id": preview.pk, "message": preview.message,
            "budget_bytes": preview.budget_bytes,
            "trials": [_preview_trial(t) for t in previews.preview_trials(preview)]}


@router.get("/previews/{id:preview_id}", response=PreviewOut, summary="A large sweep's preview, as far as it got")
def experiment_preview_get(request: HttpRequest, preview_id: int) -> dict[str, Any]:
    return _stored(previews.experiment_preview_get(team=team_of(request), preview_id=preview_id))


@router.get("/{id:experiment_id}", response=ExperimentOut, summary="One experiment")
def experiment_detail(request: HttpRequest, experiment_id: int) -> dict[str, Any]:
    return experiments_out([_listed(request, experiment_id)])[0]


@router.get("/{id:experiment_id}/space", summary="The search space with its model: what create takes back")
def experiment_space(request: HttpRequest, experiment_id: int) -> dict[str, Any]:
    return selectors.experiment_spec(selectors.experiment_get(team=team_of(request), experiment_id=experiment_id))


@router.get("/{id:experiment_id}/trials", response=list[TrialOut], summary="The experiment's trials")
def experiment_trials(request: HttpRequest, experiment_id: int, sort: str = "number",
                      updated_since: str | None = None) -> list[dict[str, Any]]:
    """``sort``: number, best or status. ``updated_since``: only trials changed after this time (ISO 8601),
    for cheap polling: pass the largest ``updated`` seen so far."""
    trial_events_sync_quietly()  # statuses as the scheduler has them, as the pages show them
    experiment = selectors.experiment_get(team=team_of(request), experiment_id=experiment_id)
    trials = trials_sorted(selectors.experiment_trials(experiment=experiment), sort)
    if updated_since:
        try:
            since = parse_datetime(updated_since)
        except ValueError:
            since = None
        if since is None:
            raise ValidationError({"updated_since": ["Give a time in ISO 8601, e.g. 2026-01-31T12:00:00Z."]})
        trials = trials.filter(updated__gt=since)
    return [trial_out(t) for t in trials]


@router.post("/{id:experiment_id}/clone", response={201: ExperimentOut}, summary="A new experiment like this one")
def experiment_clone(request: HttpRequest, experiment_id: int, changes: ExperimentChanges) -> Status:
    """Everything of the source experiment, with the fields given changed; checked as a new experiment."""
    source = selectors.experiment_get(team=team_of(request), experiment_id=experiment_id)
    body: dict[str, Any] = {
        "name": f"{source.name} (copy)"[:120], "dataset": source.dataset_id,
        "space": {key: value for key, value in selectors.experiment_spec(source).items() if key != OBJECTIVE_KEY},
        "objective": source.objective, "strategy": source.strategy, "n_trials": source.n_trials,
        "budget_unit": source.budget_unit, "budget": source.budget, "eval_every": source.eval_every,
        "seed": source.seed, "priority": source.priority, "early_stop_patience": source.early_stop_patience,
        "memory_budget_mib": None if source.memory_budget_bytes is None else source.memory_budget_bytes >> 20,
        "holdout_bytes": None, "chat_template": "",  # both are in the space already
    }
    body |= {key: value for key, value in changes.dict(exclude_unset=True).items()}
    return Status(201, _create(request, body, source=source))


def _act(request: HttpRequest, experiment_id: int, action: str) -> dict[str, Any]:
    experiment = selectors.experiment_get(team=team_of(request), experiment_id=experiment_id)
    if action == "launch":
        count = services.experiment_launch(experiment=experiment, actor=request.user)
        detail = f"{count} trial(s) sent to the scheduler." if count else "Nothing to launch."
    elif action == "cancel":
        count = services.experiment_cancel(experiment=experiment, actor=request.user)
        detail = f"{count} trial(s) asked to stop."
    else:
        count = services.experiment_retry_failed(experiment=experiment, actor=request.user)
        detail = f"{count} failed trial(s) sent again."
    audit(request, f"experiment.{action}", f"experiment {experiment.pk}")
    return {"count": count, "detail": detail}


def _act_endpoint(action: str, summary: str) -> None:
    """Register ``POST /experiments/{id}/<action>``: one path per control, so that the schema lists each."""

    def endpoint(request: HttpRequest, experiment_id: int) -> dict[str, Any]:
        return _act(request, experiment_id, action)

    endpoint.__name__ = f"experiment_{action.replace('-', '_')}"  # the schema's operation id
    router.post(f"/{{id:experiment_id}}/{action}", response=CountOut, summary=summary)(endpoint)


for _action, _summary in (("launch", "Send every trial not yet launched"),
                          ("cancel", "Stop every trial that runs or waits"),
                          ("retry-failed", "Run every failed trial again")):
    _act_endpoint(_action, _summary)
