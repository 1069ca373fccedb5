"""The dashboards in real Chromium over real telemetry: written to Redis streams in the scheduler's format,
ingested by `telemetry_ingest`, drawn by Plotly from our static files, updated live, stopped at the end."""

from __future__ import annotations

import time

import pytest

from tests.conftest import PASSWORD
from tests.webapp.dashboards.test_reward_curves import STEPS, write_dpo
from tests.webapp.telemetry.factories import (
    make_experiment,
    write_event,
    write_final_eval,
    write_sample,
    write_span,
    write_steps,
)
from webapp.dashboards import views
from webapp.experiments.ingest import telemetry_ingest
from webapp.ground.models import Trial

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PLAN = {
    "budget_bytes": 64 << 20, "reserve_bytes": 4 << 20, "source": "measured",
    "shards": [
        {"index": 0, "layers": ["embedding", "block.0"], "param_bytes": 8 << 20, "grad_bytes": 8 << 20,
         "optim_bytes": 16 << 20, "activation_bytes": 6 << 20},
        {"index": 1, "layers": ["block.1", "head"], "param_bytes": 6 << 20, "grad_bytes": 6 << 20,
         "optim_bytes": 12 << 20, "activation_bytes": 9 << 20},
    ],
}


def _shot(page, screenshots_dir, name: str) -> None:
    path = screenshots_dir / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def _trace_lengths(page, plot_id: str, role: str) -> list[int]:
    return page.evaluate(
        "([id, role]) => document.getElementById(id).data.filter(t => t.meta && t.meta.role === role)"
        ".map(t => t.x.length)", [plot_id, role])


def test_the_dashboards_draw_grow_and_stop_live(page, live_server, alice, alice_team, redis_client, host_id,
                                                 screenshots_dir, monkeypatch, db_lock):
    monkeypatch.setattr(views, "POLL_MS", 300)
    experiment = make_experiment(alice_team, name="live sweep", total_steps=60,
                                 trials=[{"lr": 1e-3, "optimizer": "adamw"}, {"lr": 3e-3, "optimizer": "adamw"},
                                         {"lr": 1e-2, "optimizer": "sgd"}])
    trials = list(experiment.trials.order_by("number"))
    Trial.objects.filter(pk=trials[0].pk).update(plan=PLAN)
    now = time.time()
    for trial in trials:
        write_steps(redis_client, host_id, trial, range(0, 20), t0=now)
    # SHARP: units of different trials alternate on each device, and trial 1 hops from cpu0 to cpu1.
    for unit, (trial, device) in enumerate([(0, "cpu0"), (1, "cpu1"), (2, "cpu0"), (0, "cpu1"), (1, "cpu0")]):
        write_span(redis_client, host_id, trials[trial], device=device, unit=unit, start=now + 0.2 * unit,
                   end=now + 0.2 * unit + 0.18)
    for i in range(5):
        write_sample(redis_client, host_id, device="cpu0", at=now + 0.2 * i, utilization=0.9)
        write_sample(redis_client, host_id, device="cpu1", at=now + 0.2 * i, utilization=0.8)
    with db_lock:
        telemetry_ingest(host_id=host_id)

    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")

    page.goto(f"{live_server.url}/dashboards/experiments/{experiment.pk}/curves/")
    page.wait_for_selector("#curves-plot .main-svg")
    assert _trace_lengths(page, "curves-plot", "raw") == [20, 20, 20]
    assert page.is_visible("#live-indicator")
    _shot(page, screenshots_dir, "dashboard-curves")

    # Training goes on: the curves grow with only the new points.
    for trial in trials:
        write_steps(redis_client, host_id, trial, range(20, 35), t0=now)
    with db_lock:
        telemetry_ingest(host_id=host_id)
    page.wait_for_function(
        "() => document.getElementById('curves-plot').data.filter(t => t.meta.role === 'raw')"
        ".every(t => t.x.length === 35)", timeout=10_000)
    # Steps 0..34 are done.
    assert page.inner_text(f'#trial-table tr[data-trial="{trials[0].pk}"] [data-field="step"]') == "35 / 60"

    # Every trial finishes, with its final evaluation on the held-out text: the table says so and polling stops.
    for index, trial in enumerate(trials):
        write_final_eval(redis_client, host_id, trial, step=34, loss=2.0 + index / 10, bpb=1.5 + index / 10)
        write_event(redis_client, host_id, trial, "finished")
    with db_lock:
        telemetry_ingest(host_id=host_id)
    page.wait_for_function("() => document.getElementById('live-indicator').hidden", timeout=10_000)
    assert page.inner_text(f'#trial-table tr[data-trial="{trials[2].pk}"] [data-field="status"]') == "finished"
    page.wait_for_selector("#parallel-plot .main-svg")
    _shot(page, screenshots_dir, "dashboard-curves-finished")

    page.goto(f"{live_server.url}/dashboards/experiments/{experiment.pk}/devices/")
    page.wait_for_selector("#timeline-plot .main-svg")
    lanes = page.evaluate(
        "() => document.getElementById('timeline-plot').data.map(t => [...new Set(t.y)].sort().join(','))")
    assert lanes == ["cpu0,cpu1", "cpu0,cpu1", "cpu0"]  # trials 1 and 2 hopped between the devices
    assert page.locator("#timeline-plot .bars path").count() == 5
    _shot(page, screenshots_dir, "dashboard-devices")

    page.goto(f"{live_server.url}/dashboards/trials/{trials[0].pk}/plan/")
    page.wait_for_selector("#plan-plot .main-svg")
    _shot(page, screenshots_dir, "dashboard-memory-plan")

    # The trial's own page: its curves (evaluations at the steps they followed), its parameters with the
    # defaults that applied, and its memory plan's table within the page's width.
    page.goto(f"{live_server.url}/trials/{trials[0].pk}/")
    page.wait_for_selector("#curves-plot .main-svg")
    evals = page.evaluate("() => document.getElementById('curves-plot').data.find(t => t.meta.role === 'eval').x")
    assert evals == [10, 20, 30, 35], evals  # every 10 steps, then the final evaluation after step 35
    assert page.inner_text('#trial-settings dd[data-parameter="lr"]') == "0.001"
    assert page.inner_text('#trial-settings dd[data-parameter="dropout"]') == "0.1 default"
    assert page.evaluate("() => { const wrap = document.querySelector('#memory-plan .table-wrap');"
                         " return wrap.scrollWidth <= wrap.clientWidth; }"), "the memory plan overflows the page"
    _shot(page, screenshots_dir, "trial-page")

    page.goto(f"{live_server.url}/dashboards/datasets/{experiment.dataset_id}/leaderboard/")
    page.wait_for_selector("#leaderboard-plot .main-svg")
    assert page.locator("#leaderboard-table tbody tr").count() == 3
    _shot(page, screenshots_dir, "dashboard-leaderboard")

    assert page.errors == []


def _reward_lengths(page) -> dict[str, int]:
    return page.evaluate("() => Object.fromEntries(document.getElementById('rewards-plot').data"
                         ".map(t => [t.meta.role, t.x.length]))")


def test_a_dpo_trial_s_page_draws_its_rewards_as_they_come(page, live_server, alice, alice_team, redis_client,
                                                           host_id, screenshots_dir, monkeypatch, db_lock):
    """Opened before its first step, the page of a running DPO trial draws the reward figure when the first
    rewards arrive, then extends it with each poll, held-out evaluations included, without a reload."""
    monkeypatch.setattr(views, "POLL_MS", 300)
    experiment = make_experiment(alice_team, name="dpo live", trials=[{"dpo_beta": 0.1}], total_steps=STEPS,
                                 objective="dpo")
    (trial,) = experiment.trials.all()
    page.goto(f"{live_server.url}/login/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    page.goto(f"{live_server.url}/trials/{trial.pk}/")
    page.wait_for_selector("#curves-plot .main-svg")
    assert page.locator("#rewards-plot").count() == 0  # no rewards yet

    write_dpo(redis_client, host_id, trial, range(2))
    with db_lock:
        telemetry_ingest(host_id=host_id)
    page.wait_for_selector("#rewards-plot .main-svg", timeout=10_000)
    assert _reward_lengths(page) == {"chosen": 2, "rejected": 2, "accuracy": 2, "eval_accuracy": 0}

    page.evaluate("() => { window.notReloaded = true; }")
    write_dpo(redis_client, host_id, trial, range(2, STEPS))
    with db_lock:
        telemetry_ingest(host_id=host_id)
    page.wait_for_function("() => document.getElementById('rewards-plot').data"
                           ".every(t => t.x.length === (t.meta.role === 'eval_accuracy' ? 2 : 6))", timeout=10_000)
    assert page.evaluate("() => window.notReloaded") is True
    chosen = page.evaluate("() => document.getElementById('rewards-plot').data.find(t => t.meta.role === 'chosen')")
    assert chosen["x"] == list(range(1, STEPS + 1))
    assert chosen["y"] == pytest.approx([0.01 * step for step in range(STEPS)])
    page.locator("#trial-rewards").scroll_into_view_if_needed()
    _shot(page, screenshots_dir, "trial-rewards-live")
    assert page.errors == []
