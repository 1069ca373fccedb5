"""The experiment form's search-space rows, one `ParameterRowForm` per parameter in a formset beside
`forms.ExperimentForm`, and the initial data, form and rows, that reproduce an experiment for a clone: the
form's input, apart from the form's checks."""

from __future__ import annotations

from typing import Any

from django import forms

from webapp.experiments.search_space import ALIASES, KINDS, PARAMETERS, parse_search_space, rows_from_space
from webapp.ground.models import Experiment

KIND_LABELS = {"categorical": "categorical (values)", "int": "int range", "float": "float range",
               "logfloat": "log-float range"}


class ParameterRowForm(forms.Form):
    """One row of the search space: a parameter, its kind, and its values or range."""

    name = forms.ChoiceField(choices=[(n, f"{n} — {p.label}") for n, p in PARAMETERS.items()]
                             + [(alias, f"{alias} — {name} on instruction data") for alias, name in ALIASES.items()])
    kind = forms.ChoiceField(choices=[(k, KIND_LABELS[k]) for k in KINDS])
    values = forms.CharField(required=False, max_length=1000, help_text="Comma-separated (categorical).")
    low = forms.CharField(required=False, max_length=40)
    high = forms.CharField(required=False, max_length=40)
    step = forms.CharField(required=False, max_length=20)


ParameterRowFormSet = forms.formset_factory(ParameterRowForm, extra=0, can_delete=True, max_num=len(PARAMETERS),
                                            validate_max=True)


def experiment_initial(experiment: Experiment) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Form and row initial data that reproduce `experiment` (for cloning)."""
    model = experiment.model
    initial: dict[str, Any] = {
        "name": f"{experiment.name} (copy)"[:120],
        "dataset": experiment.dataset_id,
        "model_kind": model["kind"],
        "strategy": experiment.strategy,
        "n_trials": experiment.n_trials,
        "budget_unit": experiment.budget_unit,
        "budget": experiment.budget,
        "eval_every": experiment.eval_every,
        "seed": experiment.seed,
        "memory_budget": "auto" if experiment.memory_budget_bytes is None else "explicit",
        "memory_budget_mib": None if experiment.memory_budget_bytes is None else experiment.memory_budget_bytes >> 20,
        "early_stop_patience": experiment.early_stop_patience,
        "checkpoint_minutes": experiment.checkpoint_minutes,
        "max_devices_per_trial": experiment.max_devices_per_trial,
        "priority": experiment.priority,
        "holdout_bytes": experiment.holdout_bytes,
        "chat_template": experiment.chat_template,
        "objective": experiment.objective,
        **({f"pruner_{k}" if k != "kind" else "pruner": v for k, v in experiment.pruner.items()}
           if experiment.pruner else {}),
    }
    initial.update({k: v for k, v in model.items() if k not in ("kind", "checkpoint_name")})
    return initial, rows_from_space(parse_search_space(experiment.search_space))
