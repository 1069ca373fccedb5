"""Searching, filtering and sorting the experiment list and an experiment's trials, from the query string.

Everything is done by the database, in the list's own queries: an experiment's derived status and its best
value are annotations (subqueries over its trials, which an index on trial experiment and status answers),
so a page reads the same number of queries whatever it filters or sorts by, and only a page's rows.

An experiment's or a trial's best value is its bits per byte on the held-out text when a trial has one (it
compares across tokenizers), else its best validation loss; sorting by it puts the ones with bits per byte
first (lowest first), then the ones with only a validation loss (lowest first), then those with neither.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import (
    Case,
    CharField,
    Exists,
    F,
    FloatField,
    IntegerField,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Lower

from webapp.accounts.models import Team
from webapp.experiments.annotations import tag_normalize
from webapp.experiments.model_shapes import FAMILY_LABELS, PRESETS
from webapp.ground.models import Experiment, Trial
from webapp.ids import parse_id
from webapp.nul_text import refuse_nul

S = Trial.Status

# An experiment's status, from its trials' statuses: the first that holds, in this order.
EXPERIMENT_STATUSES: dict[str, tuple[str, str]] = {
    "running": ("Running", "a trial is training"),
    "queued": ("Queued", "none training; a trial is being planned or waits for a device"),
    "paused": ("Paused", "none training or waiting; a trial is paused"),
    "draft": ("Draft", "no trial launched yet"),
    "finished": ("Finished", "every trial finished (or was pruned)"),
    "failed": ("Failed", "nothing runs or waits, and a trial failed"),
    "stopped": ("Stopped", "nothing runs or waits; trials were cancelled or not launched"),
}
EXPERIMENT_SORTS = {"newest": "Newest", "name": "Name", "best": "Best value"}
TRIAL_SORTS = {"number": "Number", "best": "Best value", "status": "Status"}
# The trials table sorted by status: those at work first, then those waiting, then those ended.
TRIAL_STATUS_ORDER = (S.RUNNING, S.PLANNING, S.RUNNABLE, S.PAUSED, S.NEW, S.FINISHED, S.PRUNED, S.FAILED,
                      S.CANCELLED)
SEARCH_MAX_CHARS = 200
QUERY_FIELDS = ("q", "tag", "dataset", "model", "status", "sort")
_TAG_TERM = re.compile(r'tag:(?:"([^"]*)"|(\S+))', re.IGNORECASE)


def _has(*statuses: str) -> Exists:
    return Exists(Trial.objects.filter(experiment=OuterRef("pk"), status__in=statuses))


def _has_other_than(*statuses: str) -> Exists:
    return Exists(Trial.objects.filter(experiment=OuterRef("pk")).exclude(status__in=statuses))


def experiment_status() -> Case:
    """The expression of `EXPERIMENT_STATUSES`: one word per experiment."""
    return Case(
        When(_has(S.RUNNING), then=Value("running")),
        When(_has(S.PLANNING, S.RUNNABLE), then=Value("queued")),
        When(_has(S.PAUSED), then=Value("paused")),
        When(~_has_other_than(S.NEW), then=Value("draft")),
        When(~_has_other_than(S.FINISHED, S.PRUNED), then=Value("finished")),
        When(_has(S.FAILED), then=Value("failed")),
        default=Value("stopped"), output_field=CharField(),
    )


def _trials_min(field: str) -> Subquery:
    return Subquery(Trial.objects.filter(experiment=OuterRef("pk")).order_by().values("experiment")
                    .annotate(m=Min(field)).values("m")[:1], output_field=FloatField())


def model_key(model: Mapping[str, Any]) -> str:
    """What the model filter tells experiments apart by: ``kind:name`` (a preset, a custom model's family, a
    catalog checkpoint's name or a pretrained directory)."""
    kind = str(model.get("kind") or "")
    if kind == "preset":
        return f"preset:{model.get('preset') or ''}"
    if kind == "custom":
        return f"custom:{model.get('family') or 'gpt2'}"
    if kind == "checkpoint":
        return f"checkpoint:{model.get('checkpoint_name') or ''}"
    return f"pretrained:{model.get('pretrained_dir') or ''}"


def model_short_label(key: str) -> str:
    """A `model_key` in a few words, for the list's column and its filter."""
    kind, _, name = key.partition(":")
    if kind == "preset":
        return PRESETS[name][0].split(" (")[0] if name in PRESETS else name
    if kind == "custom":
        return f"Custom {FAMILY_LABELS.get(name, name)}"
    if kind == "checkpoint":
        return f"Checkpoint {name}"
    return f"Pretrained {name}"


def _model_q(key: str) -> Q:
    kind, _, name = key.partition(":")
    if kind == "preset":
        return Q(model__kind="preset", model__preset=name)
    if kind == "custom":
        family = Q(model__family=name)
        if name == "gpt2":  # a custom model stored without a family is a GPT-2
            family |= Q(model__family__isnull=True) | Q(model__family=None) | Q(model__family="")
        return Q(model__kind="custom") & family
    if kind == "checkpoint":
        return Q(model__kind="checkpoint", model__checkpoint_name=name)
    if kind == "pretrained":
        return Q(model__kind="pretrained", model__pretrained_dir=name)
    return Q(pk__in=[])


def tag_q(tag: str, field: str = "tags") -> Q:
    """Objects whose tags include `tag` exactly (`tag` normalized as tags are stored)."""
    if connection.features.supports_json_field_contains:  # PostgreSQL: jsonb containment
        return Q(**{f"{field}__contains": [tag]})
    # SQLite keeps the list as JSON text: a stored tag appears there exactly as JSON writes it, quoted
    return Q(**{f"{field}__icontains": json.dumps(tag)})


@dataclass(frozen=True)
class ExperimentListQuery:
    """What the experiment list's query string asks for; a value it does not know is ignored."""

    search: str = ""  # the search box as typed
    name: str = ""  # its words that are not ``tag:...``: the name contains them (any case)
    tags: tuple[str, ...] = ()  # the search box's ``tag:...`` terms and the tag filter: all of them
    tag: str = ""  # the tag filter
    dataset: int | None = None
    model: str = ""
    status: str = ""
    sort: str = "newest"

    @classmethod
    def from_get(cls, get: Mapping[str, str]) -> ExperimentListQuery:
        """The query `get` (a query string's values) asks for. Raises ValidationError, under the field, for a
        value with a null character, which no name or tag holds."""
        for field in QUERY_FIELDS:
            refuse_nul(get.get(field) or "", field=field)
        search = (get.get("q") or "").strip()[:SEARCH_MAX_CHARS]
        tags = [tag_normalize(quoted or bare) for quoted, bare in _TAG_TERM.findall(search)]
        tag = tag_normalize(get.get("tag") or "")
        status, sort = get.get("status") or "", get.get("sort") or ""
        return cls(
            search=search, name=" ".join(_TAG_TERM.sub(" ", search).split()),
            tags=tuple(dict.fromkeys(t for t in [*tags, tag] if t)), tag=tag,
            dataset=parse_id(get.get("dataset") or ""), model=(get.get("model") or "")[:300],
            status=status if status in EXPERIMENT_STATUSES else "",
            sort=sort if sort in EXPERIMENT_SORTS else "newest",
        )

    @property
    def filtered(self) -> bool:
        return bool(self.name or self.tags or self.dataset or self.model or self.status)


def experiments_listed(queryset: QuerySet[Experiment], query: ExperimentListQuery) -> QuerySet[Experiment]:
    """`queryset` (a team's experiments) as `query` filters and sorts it, each with its ``status``
    (`EXPERIMENT_STATUSES`), ``best_bpb`` and ``best_loss`` (the lowest over its trials, or None)."""
    listed = queryset.annotate(status=experiment_status(), best_bpb=_trials_min("final_bpb"),
                               best_loss=_trials_min("best_val_loss"))
    if query.name:
        listed = listed.filter(name__icontains=query.name)
    for tag in query.tags:
        listed = listed.filter(tag_q(tag))
    if query.dataset:
        listed = listed.filter(dataset_id=query.dataset)
    if query.model:
        listed = listed.filter(_model_q(query.model))
    if query.status:
        listed = listed.filter(status=query.status)
    if query.sort == "name":
        return listed.order_by(Lower("name"), "name", "-created", "-pk")
    if query.sort == "best":
        return listed.order_by(F("best_bpb").asc(nulls_last=True), F("best_loss").asc(nulls_last=True),
                               "-created", "-pk")
    return listed.order_by("-created", "-pk")


def experiment_list_choices(*, team: Team | None) -> dict[str, list[tuple[str, str]]]:
    """The tags and the models the team's experiments have, for the list's filters, in one query:
    ``{"tags": [(tag, tag)], "models": [(model_key, label)]}``, each sorted."""
    if not team:
        return {"tags": [], "models": []}
    rows = (Experiment.objects.filter(team=team).order_by()
            .values_list("tags", KT("model__kind"), KT("model__preset"), KT("model__family"),
                         KT("model__checkpoint_name"), KT("model__pretrained_dir")).distinct())
    tags: set[str] = set()
    models: set[str] = set()
    for row_tags, kind, preset, family, checkpoint_name, pretrained_dir in rows:
        tags.update(row_tags or [])
        models.add(model_key({"kind": kind, "preset": preset, "family": family,
                              "checkpoint_name": checkpoint_name, "pretrained_dir": pretrained_dir}))
    return {"tags": [(t, t) for t in sorted(tags)],
            "models": sorted(((key, model_short_label(key)) for key in models), key=lambda kv: kv[1].lower())}


def trial_sort(get: Mapping[str, str]) -> str:
    sort = get.get("sort") or ""
    return sort if sort in TRIAL_SORTS else "number"


def trials_sorted(trials: QuerySet[Trial], sort: str) -> QuerySet[Trial]:
    """An experiment's trials in the order `sort` (`TRIAL_SORTS`) asks for, by number within it."""
    if sort == "best":
        return trials.order_by(F("final_bpb").asc(nulls_last=True), F("best_val_loss").asc(nulls_last=True),
                               "number")
    if sort == "status":
        rank = Case(*(When(status=s, then=Value(i)) for i, s in enumerate(TRIAL_STATUS_ORDER)),
                    default=Value(len(TRIAL_STATUS_ORDER)), output_field=IntegerField())
        return trials.order_by(rank, "number")
    return trials.order_by("number")
