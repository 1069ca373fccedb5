"""An experiment's pruner: how the form and pasted YAML/JSON write it, and what its trials' jobs carry.

The pruner itself runs on the devices (`worker.scheduling.pruning`, Optuna's pruners): each trial of a pruned
experiment reports every evaluation to its experiment's study, and ends *pruned* at the evaluation where the
pruner stops it. Stored on the experiment as `PrunerSpec.to_dict` writes it, without ``max_resource``: for
Hyperband that is the experiment's longest trial, known once its trials are planned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import Max

from webapp.experiments.search_space import PRUNER_KEY, SearchSpaceError, quote
from webapp.ground.models import Experiment, Trial
from webapp.worker_door import PRUNER_METRICS, JobError, PrunerSpec, PruningJob

FIELDS = ("kind", "metric", "min_resource", "reduction_factor", "min_early_stopping_rate", "n_startup_trials",
          "n_warmup_steps")
# The evaluation figures a pruner may compare trials by (`worker.contract.PRUNER_METRICS`), in words; the last two
# are a DPO trial's (`webapp.experiments.objective`).
METRIC_LABELS = {"loss": "validation loss (lower is better; a DPO trial's DPO loss)",
                 "bpb": "bits per byte (lower is better; a DPO trial's of its chosen answers)",
                 "reward_accuracy": "preference accuracy (DPO; higher is better)",
                 "reward_margin": "reward margin (DPO; higher is better)"}
assert set(METRIC_LABELS) == set(PRUNER_METRICS), "a label for each metric the workers know"
MAX_STEPS = 10_000_000


def pruner_spec(raw: object, *, field: str = "space_text") -> dict[str, Any] | None:
    """The stored form of a pruner given as a mapping (``{kind: asha, min_resource: 20, ...}``), or None for
    none (``kind`` empty or ``none``); a SearchSpaceError naming `field` says what is wrong."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SearchSpaceError(f"{PRUNER_KEY}: give a mapping such as {{kind: asha, min_resource: 20, "
                               "reduction_factor: 3}.", field=field)
    unknown = sorted(set(map(str, raw)) - set(FIELDS))
    if unknown:
        raise SearchSpaceError(f"{PRUNER_KEY}: unknown setting {', '.join(unknown)}; the settings are "
                               f"{', '.join(FIELDS)}.", field=field)
    if raw.get("kind") in (None, "", "none"):
        return None
    metric = raw.get("metric", "loss")
    if not isinstance(metric, str) or metric not in METRIC_LABELS:
        raise SearchSpaceError(f"{PRUNER_KEY}: metric {quote(metric)} is not one of {', '.join(METRIC_LABELS)}.",
                               field=field)
    for name, value in raw.items():
        if name not in ("kind", "metric") and (isinstance(value, bool) or not isinstance(value, int)
                                               or not 0 <= value <= MAX_STEPS):
            raise SearchSpaceError(f"{PRUNER_KEY}: {name} must be a whole number from 0 to {MAX_STEPS:,}.",
                                   field=field)
    try:
        spec = PrunerSpec(**{str(k): v for k, v in raw.items()})
    except JobError as error:
        raise SearchSpaceError(f"{PRUNER_KEY}: {error}", field=field) from None
    stored = spec.to_dict()
    stored.pop("max_resource")
    return stored


def describe(pruner: Mapping[str, Any] | None) -> str:
    """One line for the experiment's page."""
    if not pruner:
        return "off: every trial trains its whole budget"
    by = f"; trials compared by {METRIC_LABELS[pruner.get('metric', 'loss')]}"
    if pruner["kind"] == "median":
        return (f"median rule: a trial stops when worse than the finished trials' median at the same step, after "
                f"{pruner['n_startup_trials']} finished trials and {pruner['n_warmup_steps']} steps of its own{by}")
    factor = pruner["reduction_factor"]
    first = pruner["min_resource"] * factor ** pruner.get("min_early_stopping_rate", 0)
    rungs = f"first rung at step {first}, each next one {factor}x further; the best 1/{factor} go on"
    name = "ASHA (asynchronous successive halving)" if pruner["kind"] == "asha" else "Hyperband"
    return f"{name}: {rungs}{by}"


def trial_pruning(*, trial: Trial) -> PruningJob | None:
    """What the trial's job carries for its experiment's pruner (None when the experiment has none)."""
    experiment: Experiment = trial.experiment
    if not experiment.pruner:
        return None
    settings = dict(experiment.pruner)
    if settings["kind"] == "hyperband":  # brackets span the experiment's longest trial
        longest = experiment.trials.aggregate(longest=Max("total_steps"))["longest"] or trial.total_steps
        settings["max_resource"] = max(longest, settings["min_resource"])
    return PruningJob(study=f"experiment-{experiment.pk}", trial_number=trial.number, pruner=PrunerSpec(**settings))
