"""Previews of large sweeps: a draft's trials and memory plans, planned by the web worker, not the request.

Planning a draft costs about its trials times their layers (`planning.plan_cost`). A draft over
`INLINE_PREVIEW_COST` is planned by the web worker: `experiment_preview_request` records an
`ExperimentPreview` under the team and the draft's key (`preview_key`, a hash of what the plans depend on)
and sends `experiment_preview_plan`, which stores the trials or the planning error. The form shows
"Preparing preview…" and polls the preview's page until it is ready.

Creating a large experiment takes the trials of its draft's ready preview (`experiment_preview_trials`)
instead of planning them again; without one it is refused with `PreviewPending`, and the preview it needs
is asked for, so that pressing Create again once the preview shows creates it. Each planning task deletes
the previews older than `PREVIEW_TTL`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from webapp.accounts.models import Team
from webapp.accounts.selectors import team_scoped_get
from webapp.background.outbox import work_enqueue
from webapp.config import Caps
from webapp.experiments.launching import memory_budget
from webapp.experiments.planning import (
    PLAN_ERRORS,
    ExperimentDraft,
    TrialDraft,
    plan_cost,
    plan_trials,
)
from webapp.ground.models import ExperimentPreview

# A layer plan takes up to about 0.6 ms on one core (the solver's work per layer grows with depth; that is
# a 256-layer model, the deepest the form allows), so an inline preview stays under about a second.
INLINE_PREVIEW_COST = 1024
PREVIEW_TTL = timedelta(days=1)
Status = ExperimentPreview.Status
log = logging.getLogger(__name__)


class PreviewPending(Exception):
    """A large draft cannot be created before its preview is ready; ``preview`` is the one it waits for."""

    def __init__(self, preview: ExperimentPreview, *, cost: int) -> None:
        super().__init__(preview, cost)
        self.preview, self.cost = preview, cost

    def __str__(self) -> str:
        if self.preview.status == Status.FAILED:
            return f"This sweep cannot be created: {self.preview.message}"
        return (
            f"This sweep is large ({self.cost:,} layer plans, over the {INLINE_PREVIEW_COST:,} planned during a "
            "request), so the web worker plans its trials first. Press Create again once the preview below "
            "shows them."
        )


def plans_in_background(draft: ExperimentDraft) -> bool:
    """Whether the draft's trials are planned by the web worker rather than in the request."""
    return plan_cost(draft) > INLINE_PREVIEW_COST


def preview_key(draft: ExperimentDraft, *, budget_bytes: int, caps: Caps) -> str:
    """A hash of everything the draft's trials and plans depend on: the same key, the same trials.

    The name, the evaluation interval and early stopping change no plan, so they are left out, and a renamed
    draft keeps its preview. The space's parameters stay in their order, which orders the grid.
    """
    data = draft.to_dict()
    inputs = {name: data[name] for name in ("dataset", "shape", "strategy", "n_trials", "budget_unit", "budget",
                                            "seed")}
    inputs.update(space=list(data["space"].items()), budget_bytes=budget_bytes, caps=dataclasses.asdict(caps))
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _key(draft: ExperimentDraft) -> tuple[str, int, str]:
    budget, note = memory_budget(explicit_bytes=draft.memory_budget_bytes)
    return preview_key(draft, budget_bytes=budget, caps=settings.HYDRA.caps), budget, note


def experiment_preview_get(*, team: Team, preview_id: int) -> ExperimentPreview:
    """The team's preview `preview_id`; Http404 for another team's or none."""
    return team_scoped_get(ExperimentPreview.objects.all(), team=team, pk=preview_id)


def experiment_preview_request(*, team: Team, draft: ExperimentDraft) -> ExperimentPreview:
    """The team's preview of `draft`, sending the web worker to plan it when there is none, the last try
    failed, or the last send could not reach Redis (``send_error`` says why; the ingest's pass also sends it
    later). It never plans in the calling process."""
    key, budget, note = _key(draft)
    preview, created = ExperimentPreview.objects.get_or_create(team=team, key=key, defaults={
        "dataset": draft.dataset, "draft": draft.to_dict(), "budget_bytes": budget, "budget_note": note,
    })
    unsent = preview.status == Status.PREPARING and bool(preview.send_error)
    if not (created or unsent or preview.status == Status.FAILED):
        return preview
    if preview.status == Status.FAILED:
        preview.status, preview.message, preview.trials = Status.PREPARING, "", None
        preview.save(update_fields=["status", "message", "trials"])
    work_enqueue(row=preview)
    return preview


def experiment_preview_trials(*, team: Team, draft: ExperimentDraft) -> list[TrialDraft]:
    """The trials of the team's ready preview of `draft`, without planning anything.

    Raises PreviewPending when it is not ready: still preparing, failed (its message says why), or missing,
    in which case it is asked for.
    """
    key, _, _ = _key(draft)
    preview = ExperimentPreview.objects.filter(team=team, key=key).first()
    if preview is None:
        preview = experiment_preview_request(team=team, draft=draft)
    if preview.status != Status.READY:
        raise PreviewPending(preview, cost=plan_cost(draft))
    return preview_trials(preview)


def preview_trials(preview: ExperimentPreview) -> list[TrialDraft]:
    """The stored trials of a ready preview (none otherwise)."""
    return [TrialDraft(**trial) for trial in preview.trials or []]


def experiment_preview_plan(*, preview_id: int) -> None:
    """Plan a preparing preview's trials (the web worker's task): it becomes ready with them, or failed with the
    planning error. Previews older than `PREVIEW_TTL` are deleted first."""
    ExperimentPreview.objects.filter(created__lt=timezone.now() - PREVIEW_TTL).delete()
    preview = ExperimentPreview.objects.filter(pk=preview_id, status=Status.PREPARING).select_related(
        "dataset").first()
    if preview is None:
        return
    pending = ExperimentPreview.objects.filter(pk=preview_id, status=Status.PREPARING)
    draft = ExperimentDraft.from_dict(preview.draft, dataset=preview.dataset)
    try:
        trials = plan_trials(draft, budget_bytes=preview.budget_bytes, caps=settings.HYDRA.caps)
    except PLAN_ERRORS as error:
        pending.update(status=Status.FAILED, message=str(error))
        return
    except Exception as error:  # the page must not show "preparing" for ever; the worker's log has the trace
        log.exception("planning preview %s failed", preview_id)
        pending.update(status=Status.FAILED, message=f"Planning stopped on an unexpected error ({error}). "
                                                     "Preview again to retry.")
        raise
    pending.update(status=Status.READY, trials=[dataclasses.asdict(trial) for trial in trials])
