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

from webapp.experiments.search_space import PRUNER_KEY, SearchSpaceError
from webapp.ground.models import Experiment, Trial
from webapp.worker_door import JobError, PrunerSpec, PruningJob

FIELDS = ("kind", "min_resource", "reduction_factor", "min_early_stopping_rate", "n_startup_trials",
          "n_warmup_steps")
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
    for name, value in raw.items():
        if name != "kind" and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEPS):
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
    if pruner["kind"] == "median":
        return (f"median rule: a trial stops when worse than the finished trials' median at the same step, after "
                f"{pruner['n_startup_trials']} finished trials and {pruner['n_warmup_steps']} steps of its own")
    factor = pruner["reduction_factor"]
    first = pruner["min_resource"] * factor ** pruner.get("min_early_stopping_rate", 0)
    rungs = f"first rung at step {first}, each next one {factor}x further; the best 1/{factor} go on"
    name = "ASHA (asynchronous successive halving)" if pruner["kind"] == "asha" else "Hyperband"
    return f"{name}: {rungs}"


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
