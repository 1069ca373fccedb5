"""Experiment pages: overview, the new-experiment form with preview, the experiment and its trials, controls."""

from __future__ import annotations

import json

import yaml
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from webapp.dashboards import selectors as dashboard_selectors
from webapp.dashboards import views as dashboard_views
from webapp.datasets.http import form_add_errors, team_required
from webapp.datasets.models import DatasetTokens
from webapp.datasets.selectors import dataset_list
from webapp.experiments import (
    archives,
    continuing,
    generations,
    memory_preview,
    previews,
    pruning,
    selectors,
    services,
)
from webapp.experiments.comparisons import comparison_list
from webapp.experiments.continue_form import ContinueForm
from webapp.experiments.events import SCHEDULER_DOWN, trial_events_sync_quietly
from webapp.experiments.forms import ExperimentForm
from webapp.experiments.generation_form import GenerationForm, generation_initial
from webapp.experiments.listing import (
    EXPERIMENT_SORTS,
    EXPERIMENT_STATUSES,
    TRIAL_SORTS,
    ExperimentListQuery,
    experiment_list_choices,
    experiments_listed,
    model_key,
    model_short_label,
    trial_sort,
    trials_sorted,
)
from webapp.experiments.planning import ExperimentDraft, TrialDraft
from webapp.experiments.search_space import (
    KINDS,
    PARAMETERS,
    parse_search_space,
)
from webapp.experiments.space_rows import ParameterRowFormSet, experiment_initial
from webapp.experiments.trial_data import experiment_tokens
from webapp.experiments.trial_settings import trial_settings
from webapp.ground.models import ChatTemplateCheck, Experiment, ExperimentPreview, Trial, TrialArchive
from webapp.ids import parse_id
from webapp.labqueue.selectors import trial_end_estimates
from webapp.paging import page_get

DEFAULT_ROWS = [
    {"name": "lr", "kind": "categorical", "values": "0.001, 0.003"},
    {"name": "batch_size", "kind": "categorical", "values": "8"},
]
TRIAL_ACTIONS = ("pause", "resume", "cancel", "retry")


def _statuses_synced(request: HttpRequest) -> None:
    """Apply the scheduler's news before a page shows statuses; without Redis, warn that they may be stale."""
    if not trial_events_sync_quietly():
        messages.warning(request, SCHEDULER_DOWN)


@team_required
def experiment_list(request: HttpRequest) -> HttpResponse:
    _statuses_synced(request)  # statuses as the scheduler has them, whether or not the ingest runs
    refused = False
    try:
        query = ExperimentListQuery.from_get(request.GET)  # search, filters and sort; kept by the page links
    except ValidationError as error:
        messages.error(request, f"The search and filters were not applied: {' '.join(error.messages)}")
        query, refused = ExperimentListQuery(), True
    page = page_get(experiments_listed(selectors.experiment_list(team=request.team), query), request.GET.get("page"))
    counts = selectors.experiment_trial_counts(experiments=page)
    return render(request, "experiments/experiment_list.html", {
        "page": page, "experiments": [
            {"experiment": e, "trials": counts[e.pk], "status": EXPERIMENT_STATUSES[e.status][0],
             "model": model_short_label(model_key(e.model))} for e in page],
        "datasets": list(dataset_list(team=request.team).order_by("name").values_list("pk", "name")),
        "query": query, "choices": experiment_list_choices(team=request.team), "statuses": EXPERIMENT_STATUSES,
        "sorts": EXPERIMENT_SORTS, "comparisons": comparison_list(team=request.team)[:5],
    }, status=400 if refused else 200)


def _forms(request: HttpRequest) -> tuple[ExperimentForm, Experiment | None]:
    """The bound form (POST) or one filled from ``?clone=<id>`` / ``?dataset=<id>``, and the clone source."""
    source_id = request.POST.get("cloned_from") or request.GET.get("clone")
    source = None
    if source_id:
        experiment_id = parse_id(source_id)
        if experiment_id is None:
            raise Http404("No such experiment.")
        source = selectors.experiment_get(team=request.team, experiment_id=experiment_id)
    if request.method == "POST":
        rows = ParameterRowFormSet(request.POST, prefix="space")
        return ExperimentForm(request.POST, team=request.team, rows=rows), source
    if source is not None:
        initial, row_initial = experiment_initial(source)
    else:
        initial, row_initial = {"dataset": request.GET.get("dataset")}, DEFAULT_ROWS
    rows = ParameterRowFormSet(initial=row_initial, prefix="space")
    return ExperimentForm(initial=initial, team=request.team, rows=rows), source


@team_required
@require_http_methods(["GET", "POST"])
def experiment_create(request: HttpRequest) -> HttpResponse:
    form, source = _forms(request)
    preview = None
    if request.method == "POST" and form.is_valid():
        draft = form.cleaned_data["draft"]
        try:
            if request.POST.get("action") == "create":
                experiment = services.experiment_create(team=request.team, user=request.user, draft=draft,
                                                        cloned_from=source)
                if request.POST.get("launch"):
                    services.experiment_launch(experiment=experiment, actor=request.user)
                messages.success(request, f"Experiment {experiment.name} created with "
                                          f"{experiment.trials.count()} trials.")
                return redirect("experiment_detail", experiment_id=experiment.pk)
            if previews.plans_in_background(draft):
                preview = _stored_preview(previews.experiment_preview_request(team=request.team, draft=draft))
            else:
                preview = _inline_preview(draft)
        except previews.PreviewPending as pending:
            form.add_error(None, str(pending))
            preview = _stored_preview(pending.preview)
        except services.PLAN_ERRORS as error:
            form.add_draft_error(error)
        except ValidationError as error:
            form_add_errors(form, error)
    row_errors = not form.pasted_text() and form.rows.total_error_count()
    status = 400 if request.method == "POST" and (form.errors or row_errors) else 200
    return render(request, "experiments/experiment_form.html", {
        "form": form, "rows": form.rows, "preview": preview, "source": source,
        "parameters": PARAMETERS, "kinds": KINDS,
        "models_root": settings.HYDRA.models_root,
    }, status=status)


@team_required
@require_GET
def chat_template_check(request: HttpRequest, digest: str) -> JsonResponse:
    """How the web worker's check of the chat template of SHA-256 `digest` stands, for the experiment form to
    poll: ``{"status": checking|ok|refused|failed, "message"}``. A verdict tells only whether that exact text
    renders, which only someone who has the text can ask."""
    check = get_object_or_404(ChatTemplateCheck, digest=digest)
    message = check.message or check.send_error
    if check.status == ChatTemplateCheck.Status.OK:
        message = "The chat template passed its check: submit the form again."
    return JsonResponse({"status": check.status, "message": message})


def _preview(*, status: str, trials: list[TrialDraft], message: str, budget_bytes: int, budget_note: str,
             draft: dict[str, object], stored: ExperimentPreview | None) -> dict[str, object]:
    """What the preview section shows: the trials with their plans, or that they are preparing, or why not;
    and what its LoRA trials cost the host with their one shared base and without it."""
    return {
        "status": status, "message": message, "stored": stored,
        "trials": [{"draft": t, "plan": selectors.plan_summary(t.plan)} for t in trials],
        "shared_base": memory_preview.shared_base_costs([t.plan for t in trials]),
        "model_name": draft["shape"].get("model_name", ""),  # type: ignore[attr-defined]
        "budget_bytes": budget_bytes, "budget_note": budget_note, "strategy": draft["strategy"],
        "n_trials": draft["n_trials"], "space_yaml": yaml.safe_dump(draft["space"], sort_keys=False),
    }


def _inline_preview(draft: ExperimentDraft) -> dict[str, object]:
    """A small draft's preview, planned in the request. Raises one of `services.PLAN_ERRORS`."""
    budget, budget_note = services.memory_budget(explicit_bytes=draft.memory_budget_bytes)
    return _preview(status=ExperimentPreview.Status.READY, trials=services.experiment_plan(draft=draft), message="",
                    budget_bytes=budget, budget_note=budget_note, draft=draft.to_dict(), stored=None)


def _stored_preview(stored: ExperimentPreview) -> dict[str, object]:
    """A large draft's preview, as far as the web worker has planned it."""
    return _preview(status=stored.status, trials=previews.preview_trials(stored), message=stored.message,
                    budget_bytes=stored.budget_bytes, budget_note=stored.budget_note, draft=stored.draft,
                    stored=stored)


@team_required
def experiment_preview(request: HttpRequest, preview_id: int) -> HttpResponse:
    """A large draft's preview: preparing (the page refreshes; the form polls it), then its trials or why not."""
    stored = previews.experiment_preview_get(team=request.team, preview_id=preview_id)
    return render(request, "experiments/experiment_preview.html", {"preview": _stored_preview(stored)})


@team_required
def experiment_detail(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = selectors.experiment_get(team=request.team, experiment_id=experiment_id)
    _statuses_synced(request)
    sort = trial_sort(request.GET)  # number, best value or status; kept by the page links
    page = page_get(trials_sorted(selectors.experiment_trials(experiment=experiment), sort), request.GET.get("page"))
    listed = list(page)
    etas = _etas(listed)
    trials = [
        {"trial": t, "actions": selectors.trial_actions(t), "plan": selectors.plan_summary(t.plan),
         "eta": etas.get(t.pk)}
        for t in listed
    ]
    state = selectors.experiment_state(experiment=experiment)
    tokens = experiment_tokens(experiment=experiment)
    return render(request, "experiments/experiment_detail.html", {
        "experiment": experiment, "trials": trials, "page": page, "sort": sort, "sorts": TRIAL_SORTS,
        "state": state,
        # The page refreshes its live parts while something moves: a trial, or the tokens its trials wait for.
        "live": bool(state["active"]) or (tokens is not None and tokens.status == DatasetTokens.Status.TOKENIZING),
        "can_change": selectors.experiment_can_change(user=request.user, experiment=experiment),
        "space_yaml": yaml.safe_dump(experiment.search_space, sort_keys=False),
        "tokens": tokens,
        "pruner_text": pruning.describe(experiment.pruner),
        "examples": _examples_setup(experiment),
    })


def _examples_setup(experiment: Experiment) -> list[tuple[str, object]] | None:
    """How an experiment on instruction data lays out and trains its examples: max_seq_len (the ``seq_len``
    parameter), packing and loss_on (a DPO experiment's: dpo_beta and dpo_loss_type), each with its value for
    every trial (its default, or the one value the space lists), or None where the trials search several (their
    parameters show them). None on a text corpus."""
    if not experiment.dataset.is_instruction:
        return None
    space = parse_search_space(experiment.search_space)
    setup: list[tuple[str, object]] = []
    names = [("max_seq_len", "seq_len"), ("packing", "packing"), ("loss_on", "loss_on")]
    if experiment.objective == Experiment.Objective.DPO:  # the loss is on the answers; beta and the loss searched
        names[-1:] = [("dpo_beta", "dpo_beta"), ("dpo_loss_type", "dpo_loss_type")]
    for label, name in names:
        dimension = space.get(name)
        if dimension is None:
            setup.append((label, PARAMETERS[name].default))
        else:
            single = dimension.kind == "categorical" and len(dimension.values) == 1
            setup.append((label, dimension.values[0] if single else None))
    return setup


@team_required
@require_POST
def experiment_action(request: HttpRequest, experiment_id: int, action: str) -> HttpResponse:
    experiment = selectors.experiment_get(team=request.team, experiment_id=experiment_id)
    try:
        if action == "launch":
            count = services.experiment_launch(experiment=experiment, actor=request.user)
            messages.success(request, f"{count} trial(s) sent to the scheduler." if count else "Nothing to launch.")
        elif action == "cancel":
            count = services.experiment_cancel(experiment=experiment, actor=request.user)
            messages.success(request, f"{count} trial(s) asked to stop.")
        elif action == "retry-failed":
            count = services.experiment_retry_failed(experiment=experiment, actor=request.user)
            messages.success(request, f"{count} failed trial(s) sent again.")
        else:
            raise Http404("No such action.")
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    return redirect("experiment_detail", experiment_id=experiment.pk)


@team_required
@require_http_methods(["GET", "POST"])
def experiment_delete(request: HttpRequest, experiment_id: int) -> HttpResponse:
    experiment = selectors.experiment_get(team=request.team, experiment_id=experiment_id)
    services.experiment_require_change(actor=request.user, experiment=experiment)
    if request.method == "POST":
        try:
            services.experiment_delete(experiment=experiment, actor=request.user)
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
            return redirect("experiment_detail", experiment_id=experiment.pk)
        messages.success(request, f"Experiment {experiment.name} deleted, with its trials' files.")
        return redirect("experiment_list")
    return render(request, "experiments/confirm_delete.html", {
        "experiment": experiment, "count": experiment.trials.count(),
    })


@team_required
def experiment_space(request: HttpRequest, experiment_id: int, fmt: str) -> HttpResponse:
    """The search space as a YAML or JSON download, with the model and the checkpoint interval beside it:
    pasted into the form again, it gives the same experiment."""
    experiment = selectors.experiment_get(team=request.team, experiment_id=experiment_id)
    if fmt not in ("yaml", "json"):
        raise Http404("Download the search space as .yaml or .json.")
    spec = selectors.experiment_spec(experiment)
    if fmt == "yaml":
        body, content_type = yaml.safe_dump(spec, sort_keys=False), "application/yaml"
    else:
        body, content_type = json.dumps(spec, indent=2), "application/json"
    response = HttpResponse(body, content_type=f"{content_type}; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="experiment-{experiment.pk}-search-space.{fmt}"'
    return response


@team_required
def trial_detail(request: HttpRequest, trial_id: int) -> HttpResponse:
    trial = selectors.trial_get(team=request.team, trial_id=trial_id)
    return _trial_page(request, trial)


def _etas(trials: list[Trial]) -> dict[int, dict[str, object]]:
    """When each running or queued trial is expected to end, by trial id, as the lab queue estimates it
    (`webapp.labqueue`): ``seconds`` from now, and ``at_least`` when the estimate left trials out, so it may
    end later. None when no trial is active, the scheduler cannot be reached or no device serves."""
    active = {t.queue_id: t.pk for t in trials if t.is_active and t.queue_id}
    if not active:
        return {}
    etas: dict[str, dict[str, object]] = {}
    for host in {t.queue_host for t in trials if t.is_active and t.queue_id}:  # each host's queue estimates its own
        ends = trial_end_estimates(host_id=host)
        if ends is not None:
            etas |= {queue_id: {"seconds": s, "at_least": ends.at_least} for queue_id, s in ends.seconds.items()}
    return {pk: etas[queue_id] for queue_id, pk in active.items() if queue_id in etas}


def _trial_page(request: HttpRequest, trial: Trial, *, form: GenerationForm | None = None,
                continue_form: ContinueForm | None = None, status: int = 200) -> HttpResponse:
    """The trial's page; `form` is the prompt box as posted (with its errors), else one with the last settings;
    `continue_form` the continue form as posted, else one with the trial's learning rate."""
    _statuses_synced(request)
    trial.refresh_from_db()
    if continue_form is None:
        lr = (trial.continued[-1]["lr"] if trial.continued else (trial.spec or {}).get("optimizer", {}).get("lr"))
        continue_form = ContinueForm(initial={"lr": lr})
    shown = list(generations.generation_list(trial=trial)[:generations.SHOWN])
    downloads = archives.trial_downloads(trial=trial)
    held_out = generations.held_out_list(trial=trial)
    held_out_pending = any(a.generation.status == a.generation.Status.PENDING for a in held_out)
    return render(request, "experiments/trial_detail.html", {
        "trial": trial, "experiment": trial.experiment, "actions": selectors.trial_actions(trial),
        "eta": _etas([trial]).get(trial.pk),
        "can_change": selectors.experiment_can_change(user=request.user, experiment=trial.experiment),
        "plan": selectors.plan_summary(trial.plan), "shards": selectors.plan_shard_rows(trial.plan),
        "settings": trial_settings(trial), "curves": dashboard_views.trial_curves(trial),
        "device_time": dashboard_selectors.trial_device_time(trial=trial),
        "downloads": downloads, "packing": any(d.archive is not None and d.archive.status == d.archive.Status.PREPARING
                                               and not d.archive.send_error for d in downloads),
        "generations": shown, "held_out": held_out, "held_out_pending": held_out_pending,
        "generating": held_out_pending or any(g.status == g.Status.PENDING for g in shown),
        "generation_unavailable": generations.generation_unavailable(trial),
        "generation_form": form or GenerationForm(initial=generation_initial(shown[0] if shown else None)),
        "continue_form": continue_form, "continue_blocker": continuing.continue_blocker(trial),
        "kept_state": continuing.kept_state(trial) if trial.status in Trial.ENDED else None,
    }, status=status)


@team_required
@require_POST
def trial_continue(request: HttpRequest, trial_id: int) -> HttpResponse:
    """Continue a finished or pruned trial for the posted steps from its last checkpoint (`continuing`)."""
    trial = selectors.trial_get(team=request.team, trial_id=trial_id)
    form = ContinueForm(request.POST)
    if form.is_valid():
        try:
            continuing.trial_continue(trial=trial, actor=request.user, **form.values())
        except ValidationError as error:
            form_add_errors(form, error)
        else:
            messages.success(request, f"Trial #{trial.number}: continuing for {form.values()['steps']} more steps.")
            return redirect("trial_detail", trial_id=trial.pk)
    return _trial_page(request, trial, continue_form=form, status=400)


@team_required
@require_POST
def trial_generate(request: HttpRequest, trial_id: int) -> HttpResponse:
    """Ask the web worker to continue the posted prompt with the trial's model; the page polls the result."""
    trial = selectors.trial_get(team=request.team, trial_id=trial_id)
    form = GenerationForm(request.POST)
    if form.is_valid():
        try:
            generation = generations.generation_request(trial=trial, actor=request.user, settings=form.settings())
        except ValidationError as error:
            form_add_errors(form, error)
        else:
            return redirect(reverse("trial_detail", args=[trial.pk]) + f"#generation-{generation.pk}")
    return _trial_page(request, trial, form=form, status=400)


@team_required
def trial_generation(request: HttpRequest, trial_id: int, generation_id: int) -> HttpResponse:
    """One generation of the trial, as far as the web worker got (the trial's page polls it while pending)."""
    trial = selectors.trial_get(team=request.team, trial_id=trial_id)
    generation = generations.generation_get(trial=trial, generation_id=generation_id)
    return render(request, "experiments/generation.html", {"trial": trial, "experiment": trial.experiment,
                                                           "generation": generation})


@team_required
@require_POST
def trial_action(request: HttpRequest, trial_id: int, action: str) -> HttpResponse:
    trial = selectors.trial_get(team=request.team, trial_id=trial_id)
    if action not in TRIAL_ACTIONS:
        raise Http404("No such action.")
    try:
        if action == "retry":
            services.trial_retry(trial=trial, actor=request.user)
        else:
            services.trial_control(trial=trial, action=action, actor=request.user)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"Trial #{trial.number}: {action} requested.")
    if request.POST.get("next") == "trial":
        return redirect("trial_detail", trial_id=trial.pk)
    return redirect("experiment_detail", experiment_id=trial.experiment_id)


@team_required
@require_http_methods(["GET", "POST"])
def trial_delete(request: HttpRequest, trial_id: int) -> HttpResponse:
    trial = selectors.trial_get(team=request.team, trial_id=trial_id)
    services.experiment_require_change(actor=request.user, experiment=trial.experiment)
    if request.method == "POST":
        try:
            services.trial_delete(trial=trial, actor=request.user)
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
            return redirect("trial_detail", trial_id=trial.pk)
        messages.success(request, f"Trial #{trial.number} deleted, with its spill files.")
        return redirect("experiment_detail", experiment_id=trial.experiment_id)
    return render(request, "experiments/confirm_delete.html", {
        "trial": trial, "experiment": trial.experiment,
    })


@team_required
@require_POST
def trial_archive(request: HttpRequest, trial_id: int) -> HttpResponse:
    """Ask the web worker to pack the trial's model or adapter (the posted ``kind``) for download; the trial's
    page shows its progress, then links it."""
    trial = selectors.trial_get(team=request.team, trial_id=trial_id)
    try:
        archives.trial_archive_request(trial=trial, kind=_download_kind(request.POST.get("kind")))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    return redirect(f"{reverse('trial_detail', args=[trial.pk])}#downloads")


def _download_kind(raw: str | None) -> str:
    """A download's kind as posted or asked for (the model when none is said); Http404 for another word."""
    try:
        return TrialArchive.Kind(raw or TrialArchive.Kind.MODEL)
    except ValueError:
        raise Http404(f"No download is called {raw!r}: ask for the model or the adapter.") from None


@team_required
def trial_export(request: HttpRequest, trial_id: int) -> FileResponse:
    """The packed model or adapter (``?kind=``) of the trial's current attempt, streamed from disk (see
    `archives`)."""
    trial = selectors.trial_get(team=request.team, trial_id=trial_id)
    kind = _download_kind(request.GET.get("kind"))
    archive = archives.trial_archive_get(trial=trial, kind=kind)
    if archive is None or archive.status != archive.Status.READY or not archive.path.is_file():
        raise Http404("This trial's download is not packed; ask for it on the trial's page.")
    return FileResponse(archive.path.open("rb"), as_attachment=True, filename=archives.archive_filename(trial, kind),
                        content_type="application/gzip")
