"""The figure builders are pure: data in, Plotly dicts out."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from webapp.dashboards import figures
from webapp.dashboards.selectors import (
    Cursor,
    Curves,
    Devices,
    EvalSeries,
    SampleSeries,
    SpanRow,
    TrainSeries,
    TrialInfo,
)


def _trial(id: int, number: int, params: dict, loss: float | None = None) -> TrialInfo:
    return TrialInfo(id=id, number=number, attempt=1, experiment="exp", params=params, status="running", step=3,
                     total_steps=10, best_val_loss=loss, best_val_ppl=None, launched=100.0)


def test_ema_starts_at_the_first_value_and_continues_from_a_previous_one():
    assert figures.ema([1.0, 3.0], 0.5) == [1.0, 2.0]
    assert figures.ema([3.0], 0.5, previous=1.0) == [2.0]
    with pytest.raises(ValueError, match="smoothing weight 1"):
        figures.ema([1.0], 1)


def test_interpolate_is_piecewise_linear_and_flat_beyond_the_ends():
    assert figures.interpolate([0, 10], [0, 100], [-1, 5, 10, 20]) == [0.0, 50.0, 100.0, 100.0]


def test_learning_curves_draw_raw_smoothed_and_validation_per_trial_on_the_chosen_axis():
    trial = _trial(7, 1, {"lr": "<b>"})
    curves = Curves(trials=[trial],
                    train={7: TrainSeries(step=[0, 1, 2], tokens=[10, 20, 30], time=[101.0, 102.0, 103.0],
                                          loss=[3.0, 2.0, 1.0])},
                    evals={7: EvalSeries(step=[1], time=[102.0], loss=[2.5], perplexity=[12.2])},
                    cursor=Cursor())
    figure = figures.learning_curves(curves, x="time", smoothing=0.5)
    raw, smooth, evals = figure["data"]
    assert [t["meta"]["role"] for t in figure["data"]] == ["raw", "smooth", "eval"]
    assert raw["x"] == [1.0, 2.0, 3.0]  # seconds since the experiment's launch
    assert smooth["y"] == [3.0, 2.5, 1.75]
    assert evals["x"] == [2.0]
    assert "&lt;b&gt;" in raw["hovertemplate"]
    tokens = figures.curve_points(curves, x="tokens", metric="loss")[7]
    assert tokens["eval_x"] == [20.0]


def test_the_loss_axis_says_a_dpo_trial_s_loss_is_per_pair():
    sft, dpo = _trial(1, 1, {}), replace(_trial(2, 2, {"dpo_beta": 0.1}), objective="dpo")

    def title(*trials: TrialInfo, metric: figures.Metric = "loss") -> str:
        curves = Curves(trials=list(trials), train={t.id: TrainSeries() for t in trials},
                        evals={t.id: EvalSeries() for t in trials}, cursor=Cursor())
        return figures.learning_curves(curves, metric=metric)["layout"]["yaxis"]["title"]["text"]

    assert title(sft) == "loss (nats/token)"
    assert title(dpo) == "DPO loss (nats/pair)"
    assert title(sft, dpo) == "loss (nats/token; DPO trials: DPO loss, nats/pair)"
    assert title(sft, metric="perplexity") == "perplexity"
    assert title(dpo, metric="perplexity") == "perplexity of the held-out chosen answers"
    assert title(sft, dpo, metric="perplexity") == "perplexity (DPO trials: the held-out chosen answers')"


def test_a_dpo_trial_s_perplexity_is_its_chosen_answers_not_the_exponential_of_its_dpo_loss():
    sft, dpo = _trial(1, 1, {}), replace(_trial(2, 2, {"dpo_beta": 0.1}), objective="dpo")
    train = TrainSeries(step=[0, 1], tokens=[10, 20], time=[101.0, 102.0], loss=[0.69, 0.6])
    evals = EvalSeries(step=[1], time=[102.0], loss=[0.55], perplexity=[7.5])
    curves = Curves(trials=[sft, dpo], train={1: train, 2: train}, evals={1: evals, 2: evals}, cursor=Cursor())
    points = figures.curve_points(curves, x="step", metric="perplexity")
    assert points[1]["y"] == pytest.approx([math.exp(0.69), math.exp(0.6)]) and points[1]["eval_y"] == [7.5]
    assert (points[2]["x"], points[2]["y"], points[2]["eval_y"]) == ([], [], [7.5])
    assert figures.curve_points(curves, x="step", metric="loss")[2]["y"] == [0.69, 0.6]


def test_the_timeline_has_a_bar_per_unit_in_its_devices_lane_and_a_trace_per_trial():
    trials = [_trial(1, 1, {}), _trial(2, 2, {})]
    spans = [SpanRow(trial=1, lane="cpu0", phase="F", shard=0, step=0, start=10.0, end=10.5, peak_bytes=0),
             SpanRow(trial=2, lane="cpu0", phase="B", shard=1, step=0, start=10.5, end=11.0, peak_bytes=0),
             SpanRow(trial=1, lane="cpu1", phase="B", shard=0, step=0, start=10.6, end=11.0, peak_bytes=0)]
    figure = figures.device_timeline(Devices(spans=spans, samples={}, origin=10.0, cursor=3, sample_after=0),
                                     trials)
    first, second = figure["data"]
    assert (first["y"], first["base"], first["x"]) == (["cpu0", "cpu1"], [0.0, 0.6], [0.5, 0.4])
    assert second["y"] == ["cpu0"] and first["marker"]["color"] != second["marker"]["color"]
    assert figure["layout"]["yaxis"]["categoryarray"] == ["cpu0", "cpu1"]


def test_the_memory_plan_stacks_resident_and_spilled_bytes_per_shard():
    shard = {"index": 0, "layers": ["embedding"], "param_bytes": 2**20, "grad_bytes": 2**20,
             "optim_bytes": 2 * 2**20, "activation_bytes": 3 * 2**20}
    figure = figures.memory_plan({"budget_bytes": 8 * 2**20, "shards": [shard]})
    resident = {t["name"]: t["y"] for t in figure["data"] if t["offsetgroup"] == "resident"}
    spilled = {t["name"]: t["y"] for t in figure["data"] if t["offsetgroup"] == "spilled"}
    assert resident == {"parameters (resident)": [1.0], "gradients (resident)": [1.0],
                        "optimizer state (resident)": [2.0], "activations (resident)": [3.0]}
    assert spilled == {"parameters (spilled)": [1.0], "optimizer state (spilled)": [2.0]}
    assert figure["layout"]["shapes"][0]["y0"] == 8.0


def test_the_memory_axis_scales_to_the_use_and_the_budgets_not_to_the_hosts_memory():
    host = int(23.6 * 2**30)
    samples = {"cpu0": SampleSeries(time=[1.0, 2.0], utilization=[0.5, 0.5], memory_used=[2**30, 1.6 * 2**30],
                                    memory_total=host)}
    figure = figures.device_memory(samples, 0.0, [4 * 2**30, 4 * 2**30])
    assert [(shape["y0"], shape["label"]["text"]) for shape in figure["layout"]["shapes"]] == [(4.0, "budget 4 GiB")]
    (trace,) = figure["data"]
    assert max(trace["y"]) == 1.6 and trace["name"] == "cpu0 (of 23.6 GiB)"
    assert figures.device_memory(samples, 0.0, [])["layout"]["shapes"] == []


def test_parallel_coordinates_map_categories_to_ticks_and_skip_unscored_trials():
    trials = [_trial(1, 1, {"lr": 0.1, "optimizer": "sgd"}, 2.0), _trial(2, 2, {"lr": 0.01, "optimizer": "adamw"}, 1.5),
              _trial(3, 3, {"lr": 0.5, "optimizer": "sgd"})]
    dims = figures.hyperparameters(trials)["data"][0]["dimensions"]
    assert dims[0] == {"label": "lr", "values": [0.1, 0.01]}
    assert dims[1] == {"label": "optimizer", "values": [1.0, 0.0], "tickvals": [0, 1], "ticktext": ["adamw", "sgd"]}
    assert dims[2]["values"] == [2.0, 1.5]


def test_comparison_plots_leave_out_parameters_every_trial_shares():
    trials = [_trial(1, 1, {"lr": 1e-3, "batch_size": 8, "optimizer": "adamw"}, 2.0),
              _trial(2, 2, {"lr": 3e-3, "batch_size": 8, "optimizer": "adamw"}, 1.8),
              _trial(3, 3, {"lr": 1e-2, "batch_size": 16, "optimizer": "adamw"}),  # no result: not compared
              ]
    assert figures.varied(trials[:2]) == ["lr"]
    dims = figures.hyperparameters(trials)["data"][0]["dimensions"]
    assert [d["label"] for d in dims] == ["lr", "best validation loss"]
    scatter = figures.hyperparameter_scatter(trials)
    assert [t["name"] for t in scatter["data"]] == ["lr"] and "xaxis2" not in scatter["layout"]

    alike = [_trial(1, 1, {"lr": 1e-3}, 2.0), _trial(2, 2, {"lr": 1e-3}, 1.9)]
    for figure in (figures.hyperparameters(alike), figures.hyperparameter_scatter(alike)):
        assert figure["data"] == []
        (note,) = figure["layout"]["annotations"]
        assert note["text"] == "No parameter differs between the trials with a result yet."


def test_trials_of_one_value_stand_side_by_side_and_show_their_exact_values():
    trials = [_trial(1, 1, {"optimizer": "sgd", "batch_size": 8}, 2.0),
              _trial(2, 2, {"optimizer": "adamw", "batch_size": 8}, 2.0),  # same loss as trial 1
              _trial(3, 3, {"optimizer": "sgd", "batch_size": 16}, 2.1),
              _trial(4, 4, {"optimizer": "sgd", "batch_size": 8}, 2.0)]
    batch, optimizer = figures.hyperparameter_scatter(trials)["data"]
    # batch size 8 three times at 0, side by side; 16 once, at 1.
    assert batch["x"] == [-0.1667, 0.0, 1.0, 0.1667]
    assert batch["customdata"] == ["8", "8", "16", "8"] and "%{customdata}" in batch["hovertemplate"]
    # adamw once at 0, sgd three times around 1.
    assert optimizer["x"] == [0.8333, 0.0, 1.0, 1.1667]
    layout = figures.hyperparameter_scatter(trials)["layout"]
    assert (layout["xaxis"]["tickvals"], layout["xaxis"]["ticktext"]) == ([0, 1], ["8", "16"])
    assert (layout["xaxis2"]["tickvals"], layout["xaxis2"]["ticktext"]) == ([0, 1], ["adamw", "sgd"])
    assert batch["marker"]["opacity"] < 1 and batch["marker"]["line"]["width"] > 0
    assert len({(x, y) for x, y in zip(batch["x"], batch["y"], strict=True)}) == 4  # no marker on another

    # Many distinct numbers (a random search's draws) keep their value axis, on a log scale across decades.
    drawn = [_trial(i, i, {"lr": 10 ** (-5 + i / 4)}, 2.0 + i / 10) for i in range(1, 14)]
    (lr,) = figures.hyperparameter_scatter(drawn)["data"]
    assert lr["x"] == [t.params["lr"] for t in drawn]
    assert figures.hyperparameter_scatter(drawn)["layout"]["xaxis"]["type"] == "log"


MARKUP = '<img src=x onerror="alert(1)"><b>bold</b>'
ESCAPED = "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&lt;b&gt;bold&lt;/b&gt;"


def _strings(value) -> list[str]:
    """Every string a figure shows: anywhere in it but its keys and its ``meta`` (which Plotly never draws)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() if k != "meta" for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def test_every_figure_escapes_user_text():
    # Names and values come from users (experiment names, parameter values) and workers (device names);
    # Plotly would render their markup in legends, labels and hover text.
    trials = [TrialInfo(id=1, number=1, attempt=1, experiment=MARKUP, params={"optimizer": MARKUP, MARKUP: 1},
                        status="finished", step=3, total_steps=3, best_val_loss=2.0, best_val_ppl=7.4, launched=0.0),
              TrialInfo(id=2, number=2, attempt=1, experiment=MARKUP, params={"optimizer": "sgd", MARKUP: 2},
                        status="finished", step=3, total_steps=3, best_val_loss=2.5, best_val_ppl=9.1, launched=0.0)]
    curves = Curves(trials=trials, train={i: TrainSeries(step=[1], tokens=[1], time=[1.0], loss=[2.0]) for i in (1, 2)},
                    evals={i: EvalSeries(step=[1], time=[1.0], loss=[2.0], perplexity=[7.4]) for i in (1, 2)},
                    cursor=Cursor())
    lane = f"host/{MARKUP}"
    samples = {lane: SampleSeries(time=[1.0], utilization=[0.5], memory_used=[1], memory_total=2)}
    devices = Devices(spans=[SpanRow(trial=1, lane=lane, phase="F", shard=0, step=0, start=0.0, end=1.0,
                                     peak_bytes=0)], samples=samples, origin=0.0, cursor=1, sample_after=1.0)
    shard = {"index": 0, "layers": [MARKUP], "param_bytes": 1, "grad_bytes": 1, "optim_bytes": 1,
             "activation_bytes": 1}
    built = {
        "curves": figures.learning_curves(curves),
        "parallel": figures.hyperparameters(trials),
        "scatter": figures.hyperparameter_scatter(trials),
        "timeline": figures.device_timeline(devices, trials),
        "poll": figures.device_points(devices, trials)["spans"],
        "utilization": figures.device_utilization(samples, 0.0),
        "memory": figures.device_memory(samples, 0.0, []),
        "plan": figures.memory_plan({"shards": [shard]}),
        "leaderboard": figures.leaderboard([(f"{MARKUP} #1", 2.0)]),
    }
    for name, figure in built.items():
        strings = _strings(figure)
        assert not [s for s in strings if "<img" in s or "<b>bold" in s], name
        assert any(ESCAPED in s for s in strings), name
    assert built["curves"]["data"][1]["name"] == f"{ESCAPED} #1"
    assert built["timeline"]["data"][0]["name"] == f"{ESCAPED} #1"
    assert built["utilization"]["data"][0]["name"] == f"host/{ESCAPED}"
    assert built["utilization"]["data"][0]["meta"]["lane"] == lane  # what the page's poll matches samples by
