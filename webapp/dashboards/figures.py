"""Plotly figures as plain dicts, built by pure functions from the selectors' data.

Nothing here touches the database or the request, so every figure is tested by comparing dicts, and the
page hands the result to Plotly.js through ``json_script``. Traces carry ``meta`` (trial id and role) so
that ``static/js/dashboards.js`` can append a poll's new points to the right trace.

Plotly renders a subset of HTML in trace names, legends, axis and tick labels and hover text, so every text
that a user chose (experiment names, parameter values) or a worker reported (device names) goes through
`text` first: ``<b>`` then shows as typed instead of turning bold, and no tag reaches the page.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from webapp.dashboards.selectors import Curves, Devices, EvalSeries, SampleSeries, SpanRow, TrainSeries, TrialInfo

Figure = dict[str, Any]
XAxis = Literal["step", "tokens", "time"]
Metric = Literal["loss", "perplexity"]
X_AXES: tuple[XAxis, ...] = ("step", "tokens", "time")
METRICS: tuple[Metric, ...] = ("loss", "perplexity")
SMOOTHING_CHOICES = (0.0, 0.3, 0.6, 0.8, 0.9, 0.95)  # the weights `ema` smooths a learning curve with
DEFAULT_SMOOTHING = 0.6
X_TITLES = {"step": "optimizer step", "tokens": "training tokens", "time": "wall time (s since launch)"}

# Plotly's qualitative "D3" palette: a trial keeps its colour on every figure of the page.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
PHASE_NAMES = {"F": "forward", "FB": "forward+backward (last shard)", "B": "backward", "E": "evaluation",
               "S": "optimizer step", "R": "DPO reference pass", "plan": "planning",
               "replan": "re-planning after out-of-memory"}
BYTE_CATEGORIES = (("param_bytes", "parameters"), ("grad_bytes", "gradients"), ("optim_bytes", "optimizer state"),
                   ("activation_bytes", "activations"))
# A LoRA trial's frozen base weights, in a colour apart from the four byte categories' on the memory plan.
FROZEN_NAME, FROZEN_COLOUR = "frozen base", "#7f7f7f"
SPREAD_MAX_VALUES = 12  # a parameter with at most this many distinct numbers is drawn as categories, spread
MAX_EXP = 50.0  # exp(50) overflows nothing, and a loss that high is divergence, not a perplexity worth drawing
BASE_LAYOUT: Figure = {
    "margin": {"l": 60, "r": 20, "t": 40, "b": 50},
    "hovermode": "closest",
    "legend": {"orientation": "h", "y": -0.2},
    "template": None,
}


def text(value: object) -> str:
    """`value` as text Plotly shows literally (it decodes the entities back to the characters typed)."""
    return html.escape(str(value))


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def ema(values: Sequence[float], weight: float, previous: float | None = None) -> list[float]:
    """Exponential moving average ``s = weight * s + (1 - weight) * y``, started at `previous` (or the first y).

    `dashboards.js` continues the same recurrence from a trace's last smoothed value when new points arrive.
    """
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight {weight} must be in [0, 1).")
    out: list[float] = []
    state = previous
    for value in values:
        state = value if state is None else weight * state + (1 - weight) * value
        out.append(state)
    return out


def perplexity(loss: float) -> float:
    return math.exp(min(loss, MAX_EXP))


def params_text(params: Mapping[str, Any]) -> str:
    """A trial's parameters for hover labels (escaped: Plotly renders hover text as HTML)."""
    return "<br>".join(text(f"{name} = {value}") for name, value in sorted(params.items()))


def _trial_x(series: TrainSeries | EvalSeries, x: XAxis, origin: float, train: TrainSeries) -> list[float]:
    if x == "step":
        return list(series.step)
    if x == "time":
        return [round(t - origin, 3) for t in series.time]
    if isinstance(series, TrainSeries):
        return list(series.tokens)
    return interpolate(train.step, train.tokens, series.step)


def interpolate(xs: Sequence[float], ys: Sequence[float], at: Sequence[float]) -> list[float]:
    """Piecewise-linear ys at each of `at` (held constant beyond the ends; [] known points give zeros)."""
    if not xs:
        return [0.0 for _ in at]
    out: list[float] = []
    j = 0
    for a in at:
        while j + 1 < len(xs) and xs[j + 1] < a:
            j += 1
        if a <= xs[0]:
            out.append(float(ys[0]))
        elif j + 1 >= len(xs):
            out.append(float(ys[-1]))
        else:
            x0, x1, y0, y1 = xs[j], xs[j + 1], ys[j], ys[j + 1]
            out.append(float(y0 + (y1 - y0) * (a - x0) / (x1 - x0)) if x1 != x0 else float(y1))
    return out


def curve_points(curves: Curves, *, x: XAxis, metric: Metric) -> dict[int, dict[str, list[float]]]:
    """Per trial, the train and validation points on the chosen axes: ``{"x", "y", "eval_x", "eval_y"}``.

    Wall time counts from the trial's experiment's launch (else its first point), so a page's poll puts new
    points on the same axis as the first load. A DPO trial has no train perplexity (its train loss is the DPO loss
    of pairs, whose exponential is no perplexity): its perplexity is its evaluations', of the chosen answers.
    """
    points: dict[int, dict[str, list[float]]] = {}
    for trial in curves.trials:
        train, evals = curves.train[trial.id], curves.evals[trial.id]
        origin = trial.launched
        if origin is None:
            origin = min(train.time[:1] + evals.time[:1], default=0.0)
        no_train = metric == "perplexity" and trial.objective == "dpo"
        points[trial.id] = {
            "x": [] if no_train else _trial_x(train, x, origin, train),
            "y": list(train.loss) if metric == "loss" else [] if no_train else [perplexity(v) for v in train.loss],
            "eval_x": _trial_x(evals, x, origin, train),
            "eval_y": list(evals.loss if metric == "loss" else evals.perplexity),
        }
    return points


def learning_curves(curves: Curves, *, x: XAxis = "step", metric: Metric = "loss", smoothing: float = DEFAULT_SMOOTHING,
                    log_y: bool = False) -> Figure:
    """Train (raw, faded, behind its smoothed curve) and validation curves of every trial, a legend group each.

    Clicking a legend entry hides the trial's traces; double-clicking isolates it (Plotly's default). A
    "log y" button switches the axis without a round trip.
    """
    points = curve_points(curves, x=x, metric=metric)
    traces: list[Figure] = []
    for index, trial in enumerate(curves.trials):
        p = points[trial.id]
        label = text(trial.label)
        hover = f"<b>{label}</b><br>{params_text(trial.params)}<br>%{{x}}: %{{y:.4g}}<extra></extra>"
        common = {"legendgroup": str(trial.id), "hovertemplate": hover}
        traces.append({"type": "scattergl", "mode": "lines", "name": f"{label} train (raw)", "x": p["x"],
                       "y": p["y"], "opacity": 0.25, "showlegend": False, "line": {"color": colour(index)},
                       "meta": {"trial": trial.id, "role": "raw"}, **common})
        traces.append({"type": "scattergl", "mode": "lines", "name": label, "x": p["x"],
                       "y": ema(p["y"], smoothing), "line": {"color": colour(index)},
                       "meta": {"trial": trial.id, "role": "smooth"}, **common})
        traces.append({"type": "scattergl", "mode": "lines+markers", "name": f"{label} validation",
                       "x": p["eval_x"], "y": p["eval_y"], "showlegend": False, "marker": {"size": 6},
                       "line": {"color": colour(index), "dash": "dot"},
                       "meta": {"trial": trial.id, "role": "eval"}, **common})
        if trial.status == "pruned" and p["eval_x"]:  # where the pruner stopped it: its last evaluation
            where = f"pruned at rung {trial.rung}" if trial.rung is not None else "pruned"
            traces.append({"type": "scatter", "mode": "markers+text", "name": f"{label} {where}",
                           "x": p["eval_x"][-1:], "y": p["eval_y"][-1:], "text": [where], "textposition": "top center",
                           "showlegend": False, "marker": {"symbol": "x", "size": 11, "color": colour(index)},
                           "meta": {"trial": trial.id, "role": "pruned"}, "legendgroup": str(trial.id),
                           "hovertemplate": f"<b>{label}</b> {where}<extra></extra>"})
    y_title = _y_title(curves.trials, metric)
    return {
        "data": traces,
        "layout": BASE_LAYOUT | {
            "title": {"text": f"Train (solid) and validation (dotted) {metric}"},
            "xaxis": {"title": {"text": X_TITLES[x]}},
            "yaxis": {"title": {"text": y_title}, "type": "log" if log_y else "linear"},
            "updatemenus": [{
                "type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.15,
                "active": 1 if log_y else 0,
                "buttons": [{"label": "linear y", "method": "relayout", "args": [{"yaxis.type": "linear"}]},
                            {"label": "log y", "method": "relayout", "args": [{"yaxis.type": "log"}]}],
            }],
            "meta": {"smoothing": smoothing},
        },
    }


def _y_title(trials: Sequence[TrialInfo], metric: Metric) -> str:
    """The y axis' title: a loss in nats a token or a perplexity, or for DPO trials (a compared experiment may mix
    both) a pair's DPO loss, or the perplexity of the held-out chosen answers."""
    dpo = {trial.objective == "dpo" for trial in trials}
    plain, only_dpo, mixed = {
        "loss": ("loss (nats/token)", "DPO loss (nats/pair)", "loss (nats/token; DPO trials: DPO loss, nats/pair)"),
        "perplexity": ("perplexity", "perplexity of the held-out chosen answers",
                       "perplexity (DPO trials: the held-out chosen answers')"),
    }[metric]
    if dpo == {True}:
        return only_dpo
    return mixed if dpo == {True, False} else plain


def device_timeline(devices: Devices, trials: Sequence[TrialInfo]) -> Figure:
    """A Gantt chart: one lane per device, one bar per unit, one trace (colour) per trial."""
    origin = devices.origin or 0.0
    by_trial: dict[int, list[SpanRow]] = {}
    for span in devices.spans:
        by_trial.setdefault(span.trial, []).append(span)
    traces = [_timeline_trace(index, trial, by_trial.get(trial.id, []), origin) for index, trial in enumerate(trials)]
    lanes = sorted({text(s.lane) for s in devices.spans})
    return {
        "data": traces,
        "layout": BASE_LAYOUT | {
            "title": {"text": "Units per device (colour: trial)"},
            "barmode": "overlay",
            "xaxis": {"title": {"text": "seconds since launch"}},
            "yaxis": {"title": {"text": "device"}, "type": "category", "categoryorder": "array",
                      "categoryarray": lanes, "autorange": "reversed"},
            "height": max(220, 80 + 50 * len(lanes)),
            "meta": {"origin": origin},
        },
    }


def _timeline_trace(index: int, trial: TrialInfo, spans: Sequence[SpanRow], origin: float) -> Figure:
    return {
        "type": "bar", "orientation": "h", "name": text(trial.label), "legendgroup": str(trial.id),
        "marker": {"color": colour(index)},
        "base": [round(s.start - origin, 4) for s in spans],
        "x": [round(max(s.end - s.start, 1e-4), 4) for s in spans],
        "y": [text(s.lane) for s in spans],
        "customdata": [[PHASE_NAMES.get(s.phase, s.phase), s.shard, s.step, round(s.peak_bytes / 2**20, 1)]
                       for s in spans],
        "hovertemplate": (f"<b>{text(trial.label)}</b><br>%{{customdata[0]}} of shard %{{customdata[1]}}"
                          ", step %{customdata[2]}<br>%{base:.3f} s + %{x:.3f} s<br>peak %{customdata[3]} MiB"
                          "<extra></extra>"),
        "meta": {"trial": trial.id, "role": "units"},
    }


def device_utilization(samples: Mapping[str, SampleSeries], origin: float | None) -> Figure:
    start = origin or 0.0
    traces = [
        {"type": "scattergl", "mode": "lines", "name": text(lane), "x": [round(t - start, 3) for t in s.time],
         "y": [round(100 * u, 2) for u in s.utilization], "line": {"color": colour(i)},
         "meta": {"lane": lane, "role": "utilization"}}
        for i, (lane, s) in enumerate(sorted(samples.items()))
    ]
    return {
        "data": traces,
        "layout": BASE_LAYOUT | {
            "title": {"text": "Utilization per device"},
            "xaxis": {"title": {"text": "seconds since launch"}},
            "yaxis": {"title": {"text": "utilization (%)"}, "range": [0, 105]},
        },
    }


def device_memory(samples: Mapping[str, SampleSeries], origin: float | None, budgets: Sequence[int]) -> Figure:
    """Memory used per device against the device budgets the trials are planned for (dashed lines).

    The axis scales to the use and the budgets: a device's total (a CPU device's is the host's memory) is
    named beside it in the legend rather than drawn, so that a few GiB used are not a flat line at the bottom
    of a host's tens of GiB.
    """
    start = origin or 0.0
    traces = [
        {"type": "scattergl", "mode": "lines", "name": _lane_name(lane, s.memory_total),
         "x": [round(t - start, 3) for t in s.time], "y": [round(m / 2**30, 4) for m in s.memory_used],
         "line": {"color": colour(i)}, "meta": {"lane": lane, "role": "memory"}}
        for i, (lane, s) in enumerate(sorted(samples.items()))
    ]
    # Lines across the whole plot (paper x), so they need no update as the live traces grow.
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": round(v / 2**30, 4),
               "y1": round(v / 2**30, 4), "line": {"dash": "dash", "color": "#d62728", "width": 1},
               "label": {"text": f"budget {v / 2**30:.3g} GiB", "textposition": "end", "font": {"size": 11}}}
              for v in sorted(set(budgets))]
    return {
        "data": traces,
        "layout": BASE_LAYOUT | {
            "title": {"text": "Memory per device"},
            "xaxis": {"title": {"text": "seconds since launch"}},
            "yaxis": {"title": {"text": "memory (GiB)"}, "rangemode": "tozero"},
            "shapes": shapes,
        },
    }


def _lane_name(lane: str, total_bytes: int) -> str:
    return text(lane) if not total_bytes else f"{text(lane)} (of {total_bytes / 2**30:.3g} GiB)"


def device_points(devices: Devices, trials: Sequence[TrialInfo]) -> dict[str, Any]:
    """A live poll's new spans per trial (as the timeline's bar arrays) and new samples per lane."""
    origin = devices.origin or 0.0
    spans: dict[int, Figure] = {}
    for index, trial in enumerate(trials):
        mine = [s for s in devices.spans if s.trial == trial.id]
        if mine:
            trace = _timeline_trace(index, trial, mine, origin)
            spans[trial.id] = {key: trace[key] for key in ("base", "x", "y", "customdata")}
    samples = {
        lane: {"x": [round(t - origin, 3) for t in s.time], "utilization": [round(100 * u, 2) for u in s.utilization],
               "memory": [round(m / 2**30, 4) for m in s.memory_used]}
        for lane, s in devices.samples.items()
    }
    return {"spans": spans, "samples": samples}


def memory_plan(plan: Mapping[str, Any]) -> Figure:
    """Per shard, two stacked bars: what is resident on the device while its unit runs, and what stays spilled
    in the trial's host store between units (fp32 parameters and optimizer state). A LoRA trial's frozen base
    weights are resident bytes of their own colour, and not spilled: the host keeps one shared copy of the
    base for every trial on it, apart from the trials' stores. The budget is a dashed line."""
    shards = plan.get("shards", [])
    labels = [f"shard {s['index']}<br>{text(_layer_range(s['layers']))}" for s in shards]
    traces: list[Figure] = []
    for i, (key, name) in enumerate(BYTE_CATEGORIES):
        traces.append({"type": "bar", "name": f"{name} (resident)", "x": labels, "offsetgroup": "resident",
                       "legendgroup": key, "y": [round(s[key] / 2**20, 3) for s in shards],
                       "marker": {"color": colour(i)},
                       "hovertemplate": f"{name}: %{{y:.1f}} MiB<extra>resident</extra>"})
    if any(s.get("frozen_bytes") for s in shards):
        traces.append({"type": "bar", "name": f"{FROZEN_NAME} (resident, shared)", "x": labels,
                       "offsetgroup": "resident", "legendgroup": "frozen_bytes",
                       "y": [round(s.get("frozen_bytes", 0) / 2**20, 3) for s in shards],
                       "marker": {"color": FROZEN_COLOUR},
                       "hovertemplate": f"{FROZEN_NAME}: %{{y:.1f}} MiB<extra>resident, read from the host's "
                                        "shared base</extra>"})
    for i, (key, name) in enumerate(BYTE_CATEGORIES):
        if key in ("param_bytes", "optim_bytes"):
            traces.append({"type": "bar", "name": f"{name} (spilled)", "x": labels, "offsetgroup": "spilled",
                           "legendgroup": key, "y": [round(s[key] / 2**20, 3) for s in shards],
                           "marker": {"color": colour(i), "pattern": {"shape": "/"}, "opacity": 0.6},
                           "hovertemplate": f"{name}: %{{y:.1f}} MiB<extra>spilled</extra>"})
    shapes = []
    if plan.get("budget_bytes"):
        budget = round(plan["budget_bytes"] / 2**20, 3)
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": budget, "y1": budget,
                       "line": {"dash": "dash", "color": "#d62728"}})
    return {
        "data": traces,
        "layout": BASE_LAYOUT | {
            "title": {"text": "Memory plan: resident (left) vs spilled (right) per shard"},
            "barmode": "relative",
            "yaxis": {"title": {"text": "MiB"}},
            "shapes": shapes,
        },
    }


def _layer_range(layers: Sequence[str]) -> str:
    if not layers:
        return ""
    return layers[0] if len(layers) == 1 else f"{layers[0]} … {layers[-1]}"


def _dimension_values(values: Sequence[Any]) -> tuple[list[float], dict[str, Any]]:
    """Numbers as they are; anything else (optimizer names) mapped to 0, 1, ... with tick labels."""
    if _numeric(values):
        return [float(v) for v in values], {}
    categories = sorted({str(v) for v in values})
    codes = {c: i for i, c in enumerate(categories)}
    return [float(codes[str(v)]) for v in values], {"tickvals": list(range(len(categories))),
                                                    "ticktext": [text(c) for c in categories]}


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def varied(trials: Sequence[TrialInfo]) -> list[str]:
    """The parameters whose values differ between `trials`, in name order: a parameter every trial shares (a
    fixed value, or one every trial left at its default) tells nothing on a comparison plot."""
    names = sorted({name for t in trials for name in t.params})
    return [name for name in names if len({repr(t.params.get(name)) for t in trials}) > 1]


def _nothing_varied(layout: Figure) -> Figure:
    return {"data": [], "layout": layout | {
        "xaxis": {"visible": False}, "yaxis": {"visible": False},
        "annotations": [{"text": "No parameter differs between the trials with a result yet.", "showarrow": False,
                         "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]}}


def hyperparameters(trials: Sequence[TrialInfo], *, metric: Metric = "loss") -> Figure:
    """Parallel coordinates of every parameter that varied and the best validation metric, coloured by it.

    Only trials with a validation result take part.
    """
    scored = [(t, _best(t, metric)) for t in trials]
    scored = [(t, v) for t, v in scored if v is not None]
    layout = BASE_LAYOUT | {"title": {"text": f"Hyperparameters vs best validation {metric}"},
                            "margin": {"l": 70, "r": 70, "t": 80, "b": 30}}
    names = varied([t for t, _ in scored])
    if not names:
        return _nothing_varied(layout)
    dimensions = []
    for name in names:
        values, ticks = _dimension_values([t.params.get(name, "") for t, _ in scored])
        dimensions.append({"label": text(name), "values": values, **ticks})
    best = [v for _, v in scored]
    dimensions.append({"label": f"best validation {metric}", "values": best})
    return {
        "data": [{"type": "parcoords", "dimensions": dimensions,
                  "line": {"color": best, "colorscale": "Viridis", "reversescale": True, "showscale": True}}],
        "layout": layout,
    }


def spread(values: Sequence[Any]) -> tuple[list[float], list[Any]] | None:
    """Positions that keep trials of one value from hiding each other: each distinct value (in order) at its
    index, the trials sharing it side by side within +-0.25 of it, in the order given; and the values, for
    the ticks. None when the values are many distinct numbers, which a value axis shows apart already."""
    if _numeric(values):
        distinct: list[Any] = sorted(set(values))
        if len(distinct) > SPREAD_MAX_VALUES or len(distinct) == len(values):
            return None
    else:
        distinct = sorted(set(values), key=str)
    index = {repr(v): i for i, v in enumerate(distinct)}
    counts = {key: sum(1 for v in values if repr(v) == key) for key in index}
    seen = dict.fromkeys(index, 0)
    positions = []
    for value in values:
        key = repr(value)
        n, k = counts[key], seen[key]
        seen[key] += 1
        positions.append(round(index[key] + (k - (n - 1) / 2) * (0.5 / n if n > 1 else 0), 4))
    return positions, distinct


def hyperparameter_scatter(trials: Sequence[TrialInfo], *, metric: Metric = "loss") -> Figure:
    """One small scatter per parameter that varied: its value (x) against the trial's best validation metric
    (y). Trials of one value stand side by side (`spread`), half see-through, so that none hides another; the
    hover names the trial and its exact value."""
    scored = [(t, _best(t, metric)) for t in trials]
    scored = [(t, v) for t, v in scored if v is not None]
    names = varied([t for t, _ in scored])
    layout: Figure = BASE_LAYOUT | {"title": {"text": f"Each hyperparameter vs best validation {metric}"},
                                    "showlegend": False}
    if not names:
        return _nothing_varied(layout)
    traces: list[Figure] = []
    gap = 0.04
    width = (1 - gap * max(len(names) - 1, 0)) / max(len(names), 1)
    for i, name in enumerate(names):
        axis = "" if i == 0 else str(i + 1)
        values = [t.params.get(name) for t, _ in scored]
        placed = spread(values)
        traces.append({
            "type": "scatter", "mode": "markers", "name": text(name), "xaxis": f"x{axis}", "yaxis": f"y{axis}",
            "x": values if placed is None else placed[0], "y": [v for _, v in scored],
            "text": [text(t.label) for t, _ in scored], "customdata": [text(v) for v in values],
            "marker": {"color": [colour(_index_of(trials, t)) for t, _ in scored], "size": 10, "opacity": 0.75,
                       "line": {"width": 1, "color": "#ffffff"}},
            "hovertemplate": f"%{{text}}<br>{text(name)} = %{{customdata}}<br>{metric} %{{y:.4g}}<extra></extra>",
        })
        start = i * (width + gap)
        x_axis: Figure = {"domain": [start, start + width], "title": {"text": text(name)}, "anchor": f"y{axis}"}
        if placed is not None:
            x_axis |= {"tickvals": list(range(len(placed[1]))), "ticktext": [text(v) for v in placed[1]],
                       "range": [-0.5, len(placed[1]) - 0.5]}
        elif _spans_decades(values):
            x_axis["type"] = "log"
        layout[f"xaxis{axis}"] = x_axis
        layout[f"yaxis{axis}"] = {"anchor": f"x{axis}", "title": {"text": metric if i == 0 else ""}}
    return {"data": traces, "layout": layout}


def _spans_decades(values: Sequence[Any]) -> bool:
    """Whether positive values cover two orders of magnitude or more (learning rates): then a log axis."""
    positive = [float(v) for v in values if v and float(v) > 0]
    return bool(positive) and len(positive) == len(values) and max(positive) / min(positive) >= 100


def _index_of(trials: Sequence[TrialInfo], trial: TrialInfo) -> int:
    return next(i for i, t in enumerate(trials) if t.id == trial.id)


def _best(trial: TrialInfo, metric: Metric) -> float | None:
    return trial.best_val_loss if metric == "loss" else trial.best_val_ppl


def leaderboard(rows: Sequence[tuple[str, float]], *, metric: str = "validation perplexity",
                direction: str = "lower is better") -> Figure:
    """Horizontal bars, best on top, for a leaderboard of (label, value) rows in rank order; `direction` says
    which way the metric is better."""
    return {
        "data": [{"type": "bar", "orientation": "h", "y": [text(label) for label, _ in rows],
                  "x": [value for _, value in rows], "marker": {"color": [colour(i) for i in range(len(rows))]},
                  "hovertemplate": f"%{{y}}<br>{metric} %{{x:.4g}}<extra></extra>"}],
        "layout": BASE_LAYOUT | {
            "title": {"text": f"Best {metric} ({direction})"},
            "xaxis": {"title": {"text": metric}},
            "yaxis": {"autorange": "reversed", "automargin": True},
            "height": max(220, 60 + 28 * len(rows)),
        },
    }
