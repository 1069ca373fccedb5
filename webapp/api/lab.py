"""Who the caller is, the model catalog, the leaderboards and the lab queue."""

import dataclasses
import time
from typing import Any

from django.http import HttpRequest
from ninja import Query, Router

from webapp.accounts.models import Membership
from webapp.api.auth import team_of
from webapp.api.schemas import CheckpointOut, MeOut
from webapp.catalog.models import Checkpoint
from webapp.catalog.selectors import checkpoint_get, checkpoint_list
from webapp.datasets.selectors import dataset_get
from webapp.labqueue import selectors as queue_selectors
from webapp.leaderboards import selectors as boards

router = Router(tags=["lab"])
MAX_BOARD = 200  # a leaderboard's rows
MAX_PAGE = 1_000_000  # the lab queue's pages: far past any queue's last


@router.get("/me", response=MeOut, summary="The caller, their teams and the token's scope")
def me(request: HttpRequest) -> dict[str, Any]:
    memberships = Membership.objects.filter(user=request.user).select_related("team").order_by("team__name")
    teams = [{"id": m.team_id, "name": m.team.name, "role": m.role} for m in memberships]
    team = getattr(request, "team", None)
    token = request.token  # type: ignore[attr-defined]
    return {"username": request.user.get_username(), "teams": teams,
            "team": next((t for t in teams if team is not None and t["id"] == team.pk), None),
            "token": token.name, "scope": token.scope, "token_expires": token.expires}


@router.get("/models", response=list[CheckpointOut], summary="The model catalog's checkpoints")
def models(request: HttpRequest) -> list[Checkpoint]:
    return list(checkpoint_list())


@router.get("/models/{id:checkpoint_id}", response=CheckpointOut, summary="One checkpoint of the catalog")
def model(request: HttpRequest, checkpoint_id: int) -> Checkpoint:
    return checkpoint_get(checkpoint_id=checkpoint_id)


@router.get("/leaderboards/{id:dataset_id}", summary="The team's best trials on a dataset, and each team's best")
def leaderboard(request: HttpRequest, dataset_id: int, metric: str | None = None, holdout: str | None = None,
                limit: int = Query(50, ge=1, le=MAX_BOARD)) -> dict[str, Any]:
    """``metric`` and ``holdout`` as on the leaderboard page; ``limit``: the team's best this many (1 to 200)."""
    team = team_of(request)
    dataset = dataset_get(team=team, dataset_id=dataset_id)
    chosen, held = boards.metric_get(metric, dataset=dataset), boards.holdout_get(holdout)
    return {
        "dataset": dataset.pk, "metric": chosen.key, "metric_label": chosen.label, "direction": chosen.direction,
        "holdout_bytes": held,
        "measured_on": boards.measured_on(dataset=dataset, holdout_bytes=held),
        "team": boards.team_board(team=team, dataset=dataset, metric=chosen, limit=limit, holdout_bytes=held),
        "teams": boards.cross_team_board(dataset=dataset, metric=chosen, holdout_bytes=held),
    }


@router.get("/queue", summary="The lab queue: what the devices run and why the other trials wait")
def queue(request: HttpRequest, page: int = Query(1, ge=1, le=MAX_PAGE)) -> dict[str, Any]:
    """Other teams' trials appear without name or id, as on the lab queue page. 503 without Redis."""
    now = time.time()
    found = queue_selectors.lab_queue(team=getattr(request, "team", None), now=now, page=page)
    return {
        "devices": [dataclasses.asdict(d) for d in found.devices],
        "waiting": [dataclasses.asdict(w) for w in found.waiting],
        "running": found.running, "page": found.page.number, "pages": found.page.paginator.num_pages,
        "shares": [dataclasses.asdict(s) for s in queue_selectors.team_shares(now=now)],
    }
