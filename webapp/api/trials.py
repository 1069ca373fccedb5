"""Trials: read one, control it (pause, resume, cancel, retry, continue), poll its metrics with a cursor,
download its model, and ask it to continue a prompt."""

from typing import Any

from django.core.exceptions import ValidationError
from django.http import FileResponse, HttpRequest
from ninja import Query, Router, Schema, Status
from ninja.errors import HttpError

from webapp.api.auth import audit, team_of
from webapp.api.schemas import ArchiveOut, DownloadOut, GenerationOut, MetricsOut, TrialOut
from webapp.experiments import archives, continuing, generations, selectors, services
from webapp.experiments.continue_form import ContinueForm
from webapp.experiments.events import trial_events_sync_quietly
from webapp.experiments.generation_form import DEFAULTS, GenerationForm
from webapp.ground.models import Generation, Trial, TrialArchive
from webapp.telemetry.models import EvalMetric, StepMetric

router = Router(tags=["trials"])
MAX_STEPS_PER_POLL = 1000
MAX_STEP = 2**31 - 1  # the steps' column


def trial_out(trial: Trial) -> dict[str, Any]:
    fields = ("number", "status", "message", "params", "attempt", "step", "total_steps", "remaining_s",
              "best_val_loss", "best_val_ppl", "final_bpb", "final_loss", "final_reward_accuracy",
              "final_reward_margin", "created", "updated", "started", "finished")
    return {"id": trial.pk, "experiment": trial.experiment_id, **{f: getattr(trial, f) for f in fields},
            "actions": selectors.trial_actions(trial), "plan": selectors.plan_summary(trial.plan)}


def _trial(request: HttpRequest, trial_id: int) -> Trial:
    return selectors.trial_get(team=team_of(request), trial_id=trial_id)


def _form_error(form: Any) -> ValidationError:
    return ValidationError({field: list(messages) for field, messages in form.errors.items()})


@router.get("/{id:trial_id}", response=TrialOut, summary="One trial")
def trial_detail(request: HttpRequest, trial_id: int) -> dict[str, Any]:
    trial_events_sync_quietly()  # statuses as the scheduler has them, as the pages show them
    return trial_out(_trial(request, trial_id))


@router.get("/{id:trial_id}/metrics", response=MetricsOut, summary="The trial's steps and evaluations after a cursor")
def trial_metrics(request: HttpRequest, trial_id: int, since: int = Query(-1, ge=-1, le=MAX_STEP)) -> dict[str, Any]:
    """The current attempt's training steps (at most 1,000 per call) and evaluations after step ``since``,
    with the trial. Poll with ``since`` = the ``next`` of the last answer: an unchanged trial answers with
    empty lists."""
    trial_events_sync_quietly()
    trial = _trial(request, trial_id)
    steps = list(StepMetric.objects.filter(trial=trial, attempt=trial.attempt, step__gt=since)
                 .order_by("step")[:MAX_STEPS_PER_POLL])
    last = steps[-1].step if len(steps) == MAX_STEPS_PER_POLL else None
    evals = EvalMetric.objects.filter(trial=trial, attempt=trial.attempt, step__gt=since).order_by("step")
    if last is not None:
        evals = evals.filter(step__lte=last)
    evals = list(evals)
    seen = [m.step for m in steps] + [m.step for m in evals]
    return {"trial": trial_out(trial), "steps": steps, "evals": evals, "next": max(seen, default=since)}


class ContinueIn(Schema):
    steps: int
    lr: float
    warmup_steps: int = 0
    decay: str = "cosine"


@router.post("/{id:trial_id}/continue", response=TrialOut, summary="Train a finished trial further")
def trial_continue(request: HttpRequest, trial_id: int, body: ContinueIn) -> dict[str, Any]:
    """From its last checkpoint, for ``steps`` more steps at peak learning rate ``lr``: as the trial's page."""
    trial = _trial(request, trial_id)
    form = ContinueForm({f"{ContinueForm.prefix}-{key}": str(value) for key, value in body.dict().items()})
    if not form.is_valid():
        raise _form_error(form)
    continuing.trial_continue(trial=trial, actor=request.user, **form.values())
    audit(request, "trial.continue", f"trial {trial.pk}")
    trial.refresh_from_db()
    return trial_out(trial)


def _archive_out(archive: TrialArchive | None, trial: Trial, kind: str) -> dict[str, Any]:
    if archive is None:
        return {"kind": kind, "status": "none",
                "message": f"Not packed yet: POST to /trials/{{id}}/archive?kind={kind} first."}
    ready = archive.status == TrialArchive.Status.READY and archive.path.is_file()
    return {"kind": archive.kind, "status": archive.status, "message": archive.message or archive.send_error,
            "size_bytes": archive.size_bytes, "total_bytes": archive.total_bytes,
            "packed_bytes": archive.packed_bytes,
            "download": f"/api/v1/trials/{trial.pk}/export?kind={archive.kind}" if ready else None}


def _kind(kind: str) -> str:
    if kind not in TrialArchive.Kind.values:
        raise HttpError(400, f"kind={kind!r}: ask for the model or the adapter.")
    return kind


@router.get("/{id:trial_id}/downloads", response=list[DownloadOut], summary="What the trial's model downloads are")
def trial_downloads(request: HttpRequest, trial_id: int) -> list[dict[str, Any]]:
    """One entry per download: the model (for a LoRA trial, the merged model) and, for a LoRA trial, the adapter
    alone, each with the bytes it packs (``content_bytes``) and its archive's state; [] without an exported
    model."""
    trial = _trial(request, trial_id)
    return [{**_archive_out(d.archive, trial, d.kind), "title": d.title, "about": d.about,
             "content_bytes": d.content_bytes} for d in archives.trial_downloads(trial=trial)]


@router.post("/{id:trial_id}/archive", response=ArchiveOut, summary="Pack the trial's model for download")
def trial_archive(request: HttpRequest, trial_id: int, kind: str = "model") -> dict[str, Any]:
    """The web worker packs the exported model (``kind=model``: weights, config, tokenizer; a LoRA trial's merged
    model) or a LoRA trial's adapter alone (``kind=adapter``) into a .tar.gz; poll GET on the same path (its
    ``packed_bytes`` of ``total_bytes`` say how far it is) until ``status`` is ready, then download
    ``download``."""
    trial = _trial(request, trial_id)
    archive = archives.trial_archive_request(trial=trial, kind=_kind(kind))
    audit(request, "trial.archive", f"trial {trial.pk} {kind}")
    return _archive_out(archive, trial, kind)


@router.get("/{id:trial_id}/archive", response=ArchiveOut, summary="Whether the trial's model is packed")
def trial_archive_status(request: HttpRequest, trial_id: int, kind: str = "model") -> dict[str, Any]:
    trial = _trial(request, trial_id)
    return _archive_out(archives.trial_archive_get(trial=trial, kind=_kind(kind)), trial, kind)


@router.get("/{id:trial_id}/export", summary="Download the trial's packed model or adapter (.tar.gz)",
            response={200: bytes, 409: Any})
def trial_export(request: HttpRequest, trial_id: int, kind: str = "model") -> FileResponse:
    trial = _trial(request, trial_id)
    archive = archives.trial_archive_get(trial=trial, kind=_kind(kind))
    if archive is None or archive.status != TrialArchive.Status.READY or not archive.path.is_file():
        raise HttpError(409, f"This trial's {kind} is not packed for download: POST to its archive first, and "
                             "wait until it is ready.")
    return FileResponse(archive.path.open("rb"), as_attachment=True, filename=archives.archive_filename(trial, kind),
                        content_type="application/gzip")


class GenerateIn(Schema):
    prompt: str
    max_new_tokens: int = DEFAULTS["max_new_tokens"]
    temperature: float = DEFAULTS["temperature"]
    top_p: float = DEFAULTS["top_p"]
    seed: int = DEFAULTS["seed"]


def _generation_out(generation: Generation) -> dict[str, Any]:
    return {"id": generation.pk, "status": generation.status, "prompt": generation.prompt,
            "text": generation.text, "message": generation.message or generation.send_error}


@router.post("/{id:trial_id}/generate", response={202: GenerationOut}, summary="Continue a prompt with the model")
def trial_generate(request: HttpRequest, trial_id: int, body: GenerateIn) -> Status:
    """The web worker generates in the background: poll /trials/{id}/generations/{id:generation_id}."""
    trial = _trial(request, trial_id)
    form = GenerationForm({key: str(value) for key, value in body.dict().items()})
    if not form.is_valid():
        raise _form_error(form)
    generation = generations.generation_request(trial=trial, actor=request.user, settings=form.settings())
    audit(request, "trial.generate", f"trial {trial.pk}")
    return Status(202, _generation_out(generation))


@router.get("/{id:trial_id}/generations/{id:generation_id}", response=GenerationOut, summary="One generation")
def trial_generation(request: HttpRequest, trial_id: int, generation_id: int) -> dict[str, Any]:
    trial = _trial(request, trial_id)
    return _generation_out(generations.generation_get(trial=trial, generation_id=generation_id))


def _control(request: HttpRequest, trial_id: int, action: str) -> dict[str, Any]:
    """The same controls as the trial's page, with the same roles: the team's owners, and the member who created
    the experiment. A control its status does not allow answers 400 saying why."""
    trial = _trial(request, trial_id)
    if action == "retry":
        services.trial_retry(trial=trial, actor=request.user)
    else:
        services.trial_control(trial=trial, action=action, actor=request.user)
    audit(request, f"trial.{action}", f"trial {trial.pk}")
    trial.refresh_from_db()
    return trial_out(trial)


def _control_endpoint(action: str, summary: str) -> None:
    """Register ``POST /trials/{id}/<action>``: one path per control, so that the schema lists each."""

    def endpoint(request: HttpRequest, trial_id: int) -> dict[str, Any]:
        return _control(request, trial_id, action)

    endpoint.__name__ = f"trial_{action}"  # the schema's operation id
    router.post(f"/{{id:trial_id}}/{action}", response=TrialOut, summary=summary)(endpoint)


for _action, _summary in (("pause", "Pause the trial at its next unit boundary"),
                          ("resume", "Resume a paused trial"), ("cancel", "Stop the trial for good"),
                          ("retry", "Run a failed or cancelled trial again")):
    _control_endpoint(_action, _summary)
