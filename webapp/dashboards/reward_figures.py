"""The rewards of DPO trials as Plotly figures, built by pure functions from `selectors.reward_curves`.

TRL's ``DPOTrainer`` logs ``rewards/chosen``, ``rewards/rejected`` and ``rewards/accuracies``: the mean implicit
reward ``beta * (log pi(answer) - log pi_ref(answer))`` of the chosen and the rejected answers of a step's batch,
and the share of its pairs whose chosen answer has the higher one. Training pulls the chosen reward up and the
rejected one down; the accuracy climbs towards 1. The figure draws those per step for each trial (rewards on the
left axis, accuracy on the right, from 0 to 1) and the held-out pairs' accuracy at each evaluation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from webapp.dashboards.figures import BASE_LAYOUT, Figure, colour, text
from webapp.dashboards.selectors import RewardSeries, TrialInfo


def reward_points(series: Mapping[int, RewardSeries]) -> dict[str, dict[str, list[float]]]:
    """Per trial with new rewards, what a page's poll appends to `reward_curves`' traces (``dashboards.js``):
    ``{"x", "chosen", "rejected", "accuracy"}`` per step and ``{"eval_x", "eval_accuracy", "eval_margin"}`` per
    held-out evaluation."""
    return {
        str(trial): {"x": one.step, "chosen": one.chosen, "rejected": one.rejected, "accuracy": one.accuracy,
                     "eval_x": one.eval_step, "eval_accuracy": one.eval_accuracy, "eval_margin": one.eval_margin}
        for trial, one in series.items()
    }


def reward_curves(series: Mapping[int, RewardSeries], trials: Sequence[TrialInfo]) -> Figure | None:
    """Chosen (solid) and rejected (dashed) rewards and the preference accuracy (dotted; markers: held-out pairs)
    of every trial in `series`, coloured as on the learning curves (by its place in `trials`); None when no trial
    has rewards (no DPO trial). Every trial has its four traces, the held-out one empty before its first
    evaluation, so that a live page's poll extends them (`reward_points`)."""
    if not series:
        return None
    traces: list[Figure] = []
    for index, trial in enumerate(trials):
        one = series.get(trial.id)
        if one is None:
            continue
        label = text(trial.label)
        common = {"legendgroup": str(trial.id)}
        for name, values, dash in (("chosen reward", one.chosen, "solid"), ("rejected reward", one.rejected, "dash")):
            traces.append({"type": "scatter", "mode": "lines", "name": f"{label} {name}", "x": one.step, "y": values,
                           **common, "line": {"color": colour(index), "dash": dash},
                           "meta": {"trial": trial.id, "role": name.split()[0]},
                           "hovertemplate": f"<b>{label}</b> {name}<br>step %{{x}}: %{{y:.4g}}<extra></extra>"})
        traces.append({"type": "scatter", "mode": "lines", "name": f"{label} preference accuracy", "x": one.step,
                       "y": one.accuracy, "yaxis": "y2", **common, "line": {"color": colour(index), "dash": "dot"},
                       "meta": {"trial": trial.id, "role": "accuracy"},
                       "hovertemplate": f"<b>{label}</b> accuracy<br>step %{{x}}: %{{y:.2%}}<extra></extra>"})
        traces.append({"type": "scatter", "mode": "markers", "name": f"{label} held-out accuracy",
                       "x": one.eval_step, "y": one.eval_accuracy, "yaxis": "y2", **common,
                       "marker": {"color": colour(index), "size": 8, "symbol": "diamond"},
                       "customdata": one.eval_margin, "meta": {"trial": trial.id, "role": "eval_accuracy"},
                       "hovertemplate": f"<b>{label}</b> held-out pairs<br>step %{{x}}: accuracy %{{y:.2%}}, "
                                        "margin %{customdata:.4g}<extra></extra>"})
    return {
        "data": traces,
        "layout": BASE_LAYOUT | {
            "title": {"text": "DPO rewards: chosen (solid), rejected (dashed), preference accuracy (dotted)"},
            "xaxis": {"title": {"text": "optimizer step"}},
            "yaxis": {"title": {"text": "implicit reward (beta x log-ratio)"}},
            # room on the right for the accuracy's ticks and title; a little beyond 0 and 1, so that the accuracy's
            # line at 0 is not hidden by the x axis nor a held-out diamond at 1 cut in half
            "margin": BASE_LAYOUT["margin"] | {"r": 70},
            "yaxis2": {"title": {"text": "preference accuracy"}, "overlaying": "y", "side": "right",
                       "range": [-0.05, 1.05], "tickformat": ".0%", "tickvals": [0, 0.25, 0.5, 0.75, 1]},
        },
    }
