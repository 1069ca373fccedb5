"""Leaderboards: trials ranked per dataset and metric, within a team and across teams.

Every metric is the trial's final evaluation, on the dataset's declared held-out text (the whole validation
split, or the first bytes of it an experiment stated; a board shows one declaration at a time), not the best
of its evaluations. Bits per byte ranks by default: it compares across tokenizers, models and sequence
lengths; the per-token loss and perplexity stand beside it. A preference dataset's trials train with DPO and
rank by their DPO loss by default, or their preference accuracy, reward margin, or the bits per byte of their
chosen answers (`DPO_METRICS`). Every metric says whether lower or higher is better, and ranks so. Ties go to the
metric's tie-breaking metric where it has one (preference accuracy: the reward margin), then the trial that
finished first, then the older trial; trials without a final figure are not ranked. Across teams,
datasets compare when their corpus and validation split match (the same text held out, whatever the
vocabulary), and a team sees other teams' names, metrics and parameters only: never their datasets,
experiments or models.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import F, Q, QuerySet, Window
from django.db.models.functions import RowNumber

from webapp.accounts.models import Team
from webapp.datasets.models import Dataset
from webapp.ground.models import Experiment, Trial


@dataclass(frozen=True)
class Metric:
    key: str
    field: str
    label: str
    column: str  # its column's heading on a board, where every metric has one
    higher_is_better: bool = False
    # A metric that breaks its ties, for one of few values (the share of a few held-out pairs) where ties are usual
    tie_break: Metric | None = None

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    @property
    def ties(self) -> str:
        """How the board orders trials of equal value, in words."""
        if self.tie_break is None:
            return "ties go to the trial that finished first"
        better = "higher" if self.tie_break.higher_is_better else "lower"
        return f"ties go to the {better} {self.tie_break.column.lower()}, then to the trial that finished first"

    @property
    def best_first(self) -> Any:
        return F(self.field).desc() if self.higher_is_better else F(self.field).asc()


METRICS: dict[str, Metric] = {
    m.key: m
    for m in [
        Metric("bpb", "final_bpb", "Validation bits per byte", "Bits per byte"),
        Metric("val_ppl", "final_ppl", "Validation perplexity per token", "Perplexity per token"),
        Metric("val_loss", "final_loss", "Validation loss per token", "Loss per token"),
    ]
}
DEFAULT_METRIC = "bpb"
# A DPO trial's final evaluation: its loss is the mean DPO loss of the held-out pairs, its bits per byte those of
# their chosen answers, beside the share of pairs it prefers rightly and the mean reward margin. The share takes
# few values on a few held-out pairs: the margin, how far the trial prefers the chosen answers, breaks its ties.
REWARD_MARGIN = Metric("reward_margin", "final_reward_margin", "Reward margin (chosen less rejected)", "Reward margin",
                       higher_is_better=True)
DPO_METRICS: dict[str, Metric] = {
    m.key: m
    for m in [
        Metric("val_loss", "final_loss", "DPO loss on the held-out pairs", "DPO loss"),
        Metric("reward_accuracy", "final_reward_accuracy", "Preference accuracy (chosen answer rewarded higher)",
               "Preference accuracy", higher_is_better=True, tie_break=REWARD_MARGIN),
        REWARD_MARGIN,
        Metric("bpb", "final_bpb", "Bits per byte of the chosen answers", "Chosen bits per byte"),
    ]
}
DEFAULT_DPO_METRIC = "val_loss"


def metrics_of(dataset: Dataset | None) -> dict[str, Metric]:
    """The metrics a board on `dataset` ranks by: a preference dataset's DPO metrics, else `METRICS`."""
    return DPO_METRICS if dataset is not None and dataset.is_preference else METRICS


def metric_get(key: str | None, *, dataset: Dataset | None = None) -> Metric:
    """The metric called `key` on `dataset`'s board, or its default (validation bits per byte; a preference
    dataset's DPO loss) for a missing or unknown key."""
    metrics = metrics_of(dataset)
    default = DEFAULT_DPO_METRIC if metrics is DPO_METRICS else DEFAULT_METRIC
    return metrics.get(key or default, metrics[default])


def _cells(trial: Trial, metric: Metric) -> list[dict[str, Any]]:
    """The trial's value of every metric of `metric`'s board (the DPO metrics or the others), in column order."""
    family = DPO_METRICS if DPO_METRICS.get(metric.key) is metric else METRICS
    return [{"key": m.key, "value": getattr(trial, m.field)} for m in family.values()]


def _order(metric: Metric) -> list[Any]:
    """Best first by `metric`, ties to its tie-breaking metric (if it has one), then to the earlier finish, then
    the older trial."""
    ties = [metric.tie_break.best_first] if metric.tie_break else []
    return [metric.best_first, *ties, F("finished").asc(nulls_last=True), F("pk").asc()]


def holdout_get(raw: str | None) -> int | None:
    """The declared held-out size a board shows (bytes), from its query; None (the default): the whole split."""
    return int(raw) if raw and raw.isdigit() and int(raw) > 0 else None


def _declared(holdout_bytes: int | None) -> Q:
    if holdout_bytes is None:
        return Q(experiment__holdout_bytes__isnull=True)
    return Q(experiment__holdout_bytes=holdout_bytes)


def _comparable(dataset: Dataset) -> Q:
    """Datasets whose held-out text is `dataset`'s: the same corpus split at the same byte (any tokenizer); a
    dataset split by blocks of tokens compares by its fingerprint (corpus, vocabulary and split) only."""
    if dataset.corpus_sha256 and dataset.val_offset is not None:
        return Q(experiment__dataset__corpus_sha256=dataset.corpus_sha256,
                 experiment__dataset__val_offset=dataset.val_offset)
    return Q(experiment__dataset__fingerprint=dataset.fingerprint)


def measured_on(*, dataset: Dataset, holdout_bytes: int | None) -> str:
    """What a board's figures were measured on, in words."""
    split = (f"validation split, corpus sha256 {dataset.corpus_sha256[:12]}"
             if dataset.corpus_sha256 else f"validation split, fingerprint {dataset.fingerprint[:12]}")
    if dataset.is_preference:
        return (f"the {dataset.val_examples} held-out pairs of {dataset.name} (preference pairs; {split}), each "
                "scored on its chosen and rejected answers against the trial's reference model; a pair longer than "
                "a trial's max_seq_len is not scored by that trial")
    if dataset.is_instruction:
        return (f"the {dataset.val_examples} held-out examples of {dataset.name} ({dataset.get_kind_display()}, "
                f"whole examples chosen at random; {split}), scoring only the answers' tokens (the assistant's "
                "turns; every token of text rows) whatever a trial trained on; an example longer than a trial's "
                "max_seq_len is not scored by that trial")
    if dataset.val_bytes is None:
        return f"the last {dataset.val_fraction:.0%} of {dataset.name}'s token blocks ({split})"
    if holdout_bytes is not None and holdout_bytes < dataset.val_bytes:
        return f"the first {_size(holdout_bytes)} of the last {_size(dataset.val_bytes)} of {dataset.name} ({split})"
    return f"the last {_size(dataset.val_bytes)} of {dataset.name} ({split})"


def _size(n_bytes: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes} bytes"


def holdout_choices(*, dataset: Dataset) -> list[int | None]:
    """The held-out declarations of the experiments on `dataset` with a final figure (None: the whole split)."""
    declared = (Trial.objects.filter(experiment__dataset=dataset, final_bpb__isnull=False)
                .values_list("experiment__holdout_bytes", flat=True).distinct())
    return sorted(set(declared), key=lambda size: (size is not None, size or 0))


def _ranked(trials: QuerySet[Trial], metric: Metric) -> QuerySet[Trial]:
    """`trials` with a value for `metric`, best first: ties to the earlier finish, then the older trial."""
    return trials.filter(**{f"{metric.field}__isnull": False}).order_by(*_order(metric))


def team_ranked(*, team: Team, dataset: Dataset, metric: Metric, holdout_bytes: int | None = None) -> QuerySet[Trial]:
    """Every trial of `team` on `dataset` with a final value for `metric` on the held-out set `holdout_bytes`
    declares, best first, with its experiment."""
    trials = (Trial.objects.filter(_declared(holdout_bytes), experiment__team=team, experiment__dataset=dataset)
              .select_related("experiment"))
    return _ranked(trials, metric)


def template_label(experiment: Experiment) -> str:
    """Which chat template an experiment's trials were trained and scored with, in words."""
    if experiment.chat_template:
        return "its own (custom)"
    return "the model's own, else ChatML"


def board_rows(trials: Iterable[Trial], *, metric: Metric, first_rank: int = 1) -> list[dict[str, Any]]:
    """The rows of a team's board for `trials` (ranked already), numbered from `first_rank`."""
    return [
        {
            "rank": rank, "value": getattr(t, metric.field), "cells": _cells(t, metric), "trial_id": t.pk,
            "number": t.number,
            "bpb": t.final_bpb, "ppl": t.final_ppl, "step": t.final_step,
            "loss": t.final_loss, "reward_accuracy": t.final_reward_accuracy,
            "reward_margin": t.final_reward_margin, "model": t.experiment.model,
            "experiment_id": t.experiment_id, "experiment": t.experiment.name, "params": t.params,
            "status": t.get_status_display(), "finished": t.finished, "template": template_label(t.experiment),
        }
        for rank, t in enumerate(trials, start=first_rank)
    ]


def team_board(*, team: Team, dataset: Dataset, metric: Metric, limit: int = 200,
               holdout_bytes: int | None = None) -> list[dict[str, Any]]:
    """The best `limit` trials of `team` on `dataset` with a value for `metric`, best first."""
    return board_rows(team_ranked(team=team, dataset=dataset, metric=metric, holdout_bytes=holdout_bytes)[:limit],
                      metric=metric)


def cross_team_board(*, dataset: Dataset, metric: Metric, holdout_bytes: int | None = None) -> list[dict[str, Any]]:
    """The best trial of every team on datasets comparable to `dataset`, best team first.

    Rows carry only the team's name, the value, the parameters and when it finished. The database picks each
    team's best (a window over the ranked trials), so the page reads one row per team however many trials
    the teams ran.
    """
    order = _order(metric)
    best = (
        _ranked(Trial.objects.filter(_comparable(dataset), _declared(holdout_bytes)), metric)
        .annotate(team_rank=Window(RowNumber(), partition_by=[F("experiment__team_id")], order_by=order))
        .filter(team_rank=1)
        .select_related("experiment__team")
        .only("pk", "params", "finished", "final_bpb", "final_ppl", "final_loss", "final_reward_accuracy",
              "final_reward_margin", metric.field,
              "experiment__team__name", "experiment__team_id")
    )
    return [
        {"rank": rank, "team": trial.experiment.team.name, "team_id": trial.experiment.team_id,
         "value": getattr(trial, metric.field), "cells": _cells(trial, metric), "bpb": trial.final_bpb,
         "ppl": trial.final_ppl,
         "loss": trial.final_loss, "reward_accuracy": trial.final_reward_accuracy,
         "reward_margin": trial.final_reward_margin, "params": trial.params, "finished": trial.finished}
        for rank, trial in enumerate(best, start=1)
    ]


def board_default(*, team: Team | None) -> Dataset | None:
    """The board a team opens on: the dataset of its latest result (the trial that finished last with a final
    evaluation), else its newest dataset; None without datasets."""
    if not team:  # request.team is a lazy object; test its truth
        return None
    latest = (Trial.objects.filter(experiment__team=team, final_loss__isnull=False)
              .order_by(F("finished").desc(nulls_last=True), "-pk").values_list("experiment__dataset", flat=True)
              .first())
    datasets = Dataset.objects.filter(team=team)
    return datasets.filter(pk=latest).first() if latest else datasets.order_by("-created", "-pk").first()


def datasets_with_results(*, team: Team) -> set[int]:
    """The ids of the team's datasets that have a ranked trial (one with a final evaluation)."""
    return set(Trial.objects.filter(experiment__team=team, final_loss__isnull=False)
               .values_list("experiment__dataset", flat=True).distinct())


def board_datasets(*, team: Team | None) -> QuerySet[Dataset]:
    """The team's datasets, for choosing a board."""
    if not team:  # request.team is a lazy object; test its truth
        return Dataset.objects.none()
    return Dataset.objects.filter(team=team).order_by("name")
