"""Dashboard pages and polls: login, team scoping, cursors, downsampling budgets, CSV, inert names."""

from __future__ import annotations

import datetime
import json
import re
import time

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.api.conftest import api_for
from tests.webapp.telemetry.factories import (
    make_experiment,
    write_final_eval,
    write_sample,
    write_span,
    write_steps,
)
from webapp.dashboards import selectors
from webapp.experiments.ingest import telemetry_ingest
from webapp.ground.models import Trial

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiment(alice_team, redis_client, host_id):
    experiment = make_experiment(alice_team, trials=[{"lr": 1e-3, "optimizer": "adamw"},
                                                     {"lr": 3e-2, "optimizer": "sgd"}], total_steps=1000)
    first, second = experiment.trials.order_by("number")
    write_steps(redis_client, host_id, first, range(0, 900))
    write_steps(redis_client, host_id, second, range(0, 40))
    now = time.time()
    write_span(redis_client, host_id, first, device="cpu0", unit=0, start=now, end=now + 0.5)
    write_span(redis_client, host_id, second, device="cpu0", unit=0, start=now + 0.5, end=now + 1)
    write_span(redis_client, host_id, first, device="cpu1", unit=1, start=now + 0.6, end=now + 1.2)
    write_sample(redis_client, host_id, device="cpu0", at=now + 0.7, utilization=0.95)
    telemetry_ingest(host_id=host_id)
    return experiment


def _urls(experiment) -> list[str]:
    trial = experiment.trials.first()
    return [
        reverse("dashboard_curves", args=[experiment.pk]),
        reverse("dashboard_curves_data", args=[experiment.pk]),
        reverse("dashboard_devices", args=[experiment.pk]),
        reverse("dashboard_devices_data", args=[experiment.pk]),
        reverse("dashboard_metrics_csv", args=[experiment.pk]),
        reverse("dashboard_trial_plan", args=[trial.pk]),
        reverse("dashboard_leaderboard", args=[experiment.dataset_id]),
    ]


def test_it_requires_login(client, experiment):
    for url in _urls(experiment):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login"))


def test_a_user_in_no_team_is_sent_to_the_teams_page(charlie, experiment):
    client = Client()
    client.force_login(charlie)
    for url in _urls(experiment):
        response = client.get(url, follow=True)
        assert response.status_code == 200, url
        assert response.redirect_chain == [(reverse("team_list"), 302)], url
        assert "You are not in a team yet" in response.content.decode(), url


def test_it_answers_404_for_another_teams_objects(bob_client, experiment):
    for url in _urls(experiment):
        assert bob_client.get(url).status_code == 404, url


def test_it_refuses_writes(alice_client, experiment):
    # Read-only pages: a POST (with or without a CSRF token) is not allowed.
    client = Client(enforce_csrf_checks=True)
    client.force_login(experiment.team.memberships.first().user)
    for url in _urls(experiment):
        assert client.post(url).status_code in (403, 405), url


def test_the_curves_page_embeds_its_figures_and_state(alice_client, experiment):
    response = alice_client.get(reverse("dashboard_curves", args=[experiment.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    # Plotly from this server and no script from elsewhere (a CDN); not "cdn" absent from the page, whose random
    # CSRF tokens can hold those letters
    scripts = re.findall(r'<script[^>]*\ssrc="([^"]*)"', page)
    assert "/static/vendor/plotly.min.js" in scripts and all(src.startswith("/") and not src.startswith("//")
                                                             for src in scripts), scripts
    state = json.loads(page.split('id="dashboard-state" type="application/json">')[1].split("</script>")[0])
    assert state["running"] is True
    assert state["cursor"]["after_step"] > 0


def test_the_poll_returns_only_what_is_new(alice_client, experiment, redis_client, host_id):
    url = reverse("dashboard_curves_data", args=[experiment.pk])
    first = alice_client.get(url).json()
    assert alice_client.get(url, first["cursor"]).json()["points"] == {}

    second_trial = experiment.trials.get(number=2)
    write_steps(redis_client, host_id, second_trial, range(40, 45))
    telemetry_ingest(host_id=host_id)
    update = alice_client.get(url, first["cursor"] | {"x": "tokens"}).json()

    assert list(update["points"]) == [str(second_trial.pk)]
    assert update["points"][str(second_trial.pk)]["x"] == [41 * 256, 42 * 256, 43 * 256, 44 * 256, 45 * 256]
    assert update["trials"][str(second_trial.pk)]["step"] == 45  # steps 0..44 done


def test_it_stops_being_live_when_every_trial_ended(alice_client, experiment):
    experiment.trials.update(status=Trial.Status.FINISHED)
    assert alice_client.get(reverse("dashboard_curves_data", args=[experiment.pk])).json()["running"] is False


def test_it_rejects_a_bad_axis(alice_client, experiment):
    assert alice_client.get(reverse("dashboard_curves", args=[experiment.pk]), {"x": "bogus"}).status_code == 400
    assert alice_client.get(reverse("dashboard_curves_data", args=[experiment.pk]),
                            {"after_step": "-1"}).status_code == 400


def test_long_curves_are_downsampled_to_the_budget(alice_client, experiment, monkeypatch):
    monkeypatch.setattr(selectors, "TRAIN_POINTS", 50)
    page = alice_client.get(reverse("dashboard_curves", args=[experiment.pk])).content.decode()
    figure = json.loads(page.split('id="curves-figure" type="application/json">')[1].split("</script>")[0])
    raw = [t for t in figure["data"] if t["meta"]["role"] == "raw"]
    assert [len(t["x"]) for t in raw] == [50, 40]
    assert raw[0]["x"][0] == 1 and raw[0]["x"][-1] == 900  # the ends are kept


def test_the_devices_poll_returns_new_spans_per_lane(alice_client, experiment):
    data = alice_client.get(reverse("dashboard_devices_data", args=[experiment.pk])).json()
    first = experiment.trials.get(number=1)
    assert data["spans"][str(first.pk)]["y"] == ["cpu0", "cpu1"]
    assert data["samples"]["cpu0"]["utilization"] == [95.0]
    again = alice_client.get(reverse("dashboard_devices_data", args=[experiment.pk]), data["cursor"]).json()
    assert again["spans"] == {} and again["samples"] == {}


def test_the_csv_has_every_step_and_evaluation(alice_client, experiment):
    response = alice_client.get(reverse("dashboard_metrics_csv", args=[experiment.pk]))
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert lines[0] == "trial,split,step,tokens,time,loss,perplexity,lr"
    assert sum(1 for line in lines if ",train," in line) == 940
    assert sum(1 for line in lines if ",validation," in line) == 94


def test_it_renders_a_script_name_inert(alice_client, experiment):
    experiment.name = "<script>alert(1)</script>"
    experiment.save()
    for url in _urls(experiment)[:3] + _urls(experiment)[5:6]:
        page = alice_client.get(url).content.decode()
        assert "<script>alert(1)</script>" not in page, url


def test_device_samples_are_limited_to_when_the_teams_trials_ran(alice_client, alice_team, bob_team,
                                                                    redis_client, host_id):
    # Bob's experiment had the shared device cpu0 first; Alice's trial ran on it from t0+20 s to t0+30 s;
    # then the device went on working for someone else.
    t0 = time.time() - 100
    bob_experiment = make_experiment(bob_team, name="bob sweep")
    alice_experiment = make_experiment(alice_team, name="alice sweep", status="finished")
    bob_trial, alice_trial = bob_experiment.trials.get(), alice_experiment.trials.get()
    write_span(redis_client, host_id, bob_trial, device="cpu0", unit=0, start=t0, end=t0 + 10)
    write_span(redis_client, host_id, alice_trial, device="cpu0", unit=0, start=t0 + 21, end=t0 + 29)
    for at, utilization in [(t0 + 5, 0.11), (t0 + 25, 0.22), (t0 + 35, 0.33)]:
        write_sample(redis_client, host_id, device="cpu0", at=at, utilization=utilization)
    telemetry_ingest(host_id=host_id)
    Trial.objects.filter(pk=alice_trial.pk).update(started=_at(t0 + 20), finished=_at(t0 + 30))
    alice_experiment.__class__.objects.filter(pk=alice_experiment.pk).update(launched=_at(t0 - 60))

    url = reverse("dashboard_devices_data", args=[alice_experiment.pk])
    assert alice_client.get(url, {"samples_after": "0"}).json()["samples"]["cpu0"]["utilization"] == [22.0]
    assert alice_client.get(url).json()["samples"]["cpu0"]["utilization"] == [22.0]
    page = alice_client.get(reverse("dashboard_devices", args=[alice_experiment.pk])).content.decode()
    figure = json.loads(page.split('id="utilization-figure" type="application/json">')[1].split("</script>")[0])
    assert [trace["y"] for trace in figure["data"]] == [[22.0]]


def test_a_running_trials_window_is_open_ended():
    trials = [_info(1, started=10.0, finished=20.0), _info(2, started=15.0, finished=None),
              _info(3, started=40.0, finished=50.0), _info(4, started=None, finished=None)]
    assert selectors.run_windows(trials) == [(10.0, None)]
    assert selectors.run_windows([trials[0], trials[2]]) == [(10.0, 20.0), (40.0, 50.0)]


def _at(epoch: float):
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)


def _info(trial_id: int, *, started: float | None, finished: float | None) -> selectors.TrialInfo:
    return selectors.TrialInfo(id=trial_id, number=trial_id, attempt=1, experiment="e", params={}, status="running",
                               step=0, total_steps=1, best_val_loss=None, best_val_ppl=None, launched=None,
                               started=started, finished=finished)


def test_the_pages_figures_carry_names_as_text(alice_client, experiment):
    experiment.name = "<b>bold</b>"
    experiment.save()
    page = alice_client.get(reverse("dashboard_curves", args=[experiment.pk])).content.decode()
    figure = json.loads(page.split('id="curves-figure" type="application/json">')[1].split("</script>")[0])
    names = {trace["name"] for trace in figure["data"]}
    assert "&lt;b&gt;bold&lt;/b&gt; #1" in names
    assert not [name for name in names if "<b>" in name]


def _measured_plan(*, frozen: int) -> dict:
    """A plan as a device worker reports it (the engine's own `MemoryPlan.to_dict()`): two shards of two layers,
    with `frozen` bytes of frozen base weights per layer (a LoRA trial's; 0 for full training)."""
    from worker.engine.partition import LayerCost, plan_with_shards

    owned = 2**20 if not frozen else 2**14
    costs = [LayerCost(name=name, param_bytes=owned, grad_bytes=owned, optim_bytes=2 * owned,
                       activation_bytes=2**20, frozen_bytes=frozen) for name in ("embedding", "block.0", "block.1",
                                                                                  "head")]
    return plan_with_shards(costs, [0, 2], 64 * 2**20).to_dict() | {"source": "measured"}


def test_the_plan_page_shows_a_lora_trials_shared_base_apart_from_its_own_state(alice_client, alice_team):
    lora, full = make_experiment(alice_team, trials=[{"lora_r": 8}, {"lora_r": 0}]).trials.order_by("number")
    Trial.objects.filter(pk=lora.pk).update(plan=_measured_plan(frozen=3 * 2**20))
    Trial.objects.filter(pk=full.pk).update(plan=_measured_plan(frozen=0))

    page = alice_client.get(reverse("dashboard_trial_plan", args=[lora.pk])).content.decode()
    assert ("Shared base: 12.0\xa0MB of frozen weights read from the host's one copy of the base (not in this "
            "trial's spill store)") in page
    figure = json.loads(page.split('id="plan-figure" type="application/json">')[1].split("</script>")[0])
    frozen = [t for t in figure["data"] if t["legendgroup"] == "frozen_bytes"]
    assert [(t["name"], t["offsetgroup"], t["y"]) for t in frozen] == [("frozen base (resident, shared)", "resident",
                                                                          [6.0, 6.0])]
    spilled = {t["name"]: t["y"] for t in figure["data"] if t["offsetgroup"] == "spilled"}
    assert spilled == {"parameters (spilled)": [0.031, 0.031], "optimizer state (spilled)": [0.062, 0.062]}
    detail = alice_client.get(reverse("trial_detail", args=[lora.pk])).content.decode()
    assert "shared base 12.0\xa0MB read from the host's one copy (not in this trial's state)" in detail
    assert "<th>Frozen base (shared)</th>" in detail and "<td>6.0\xa0MB</td>" in detail

    page = alice_client.get(reverse("dashboard_trial_plan", args=[full.pk])).content.decode()
    assert "Shared base:" not in page and "frozen base" not in page
    assert "shared base" not in alice_client.get(reverse("trial_detail", args=[full.pk])).content.decode()


def test_the_devices_page_draws_the_budgets_the_trials_were_planned_for(alice_client, experiment):
    first, second = experiment.trials.order_by("number")
    Trial.objects.filter(pk=first.pk).update(plan={"budget_bytes": 3 << 30, "shards": []})
    Trial.objects.filter(pk=second.pk).update(plan={"budget_bytes": 2 << 30, "shards": []})
    page = alice_client.get(reverse("dashboard_devices", args=[experiment.pk])).content.decode()
    memory = json.loads(page.split('id="memory-figure" type="application/json">')[1].split("</script>")[0])
    assert [shape["y0"] for shape in memory["layout"]["shapes"]] == [2.0, 3.0]
    assert [trace["name"] for trace in memory["data"]] == ["cpu0 (of 8 GiB)"]  # the device's total, named only

    experiment.memory_budget_bytes = 1 << 30  # an explicit budget is the one every trial runs under
    experiment.save(update_fields=["memory_budget_bytes"])
    page = alice_client.get(reverse("dashboard_devices", args=[experiment.pk])).content.decode()
    memory = json.loads(page.split('id="memory-figure" type="application/json">')[1].split("</script>")[0])
    assert [shape["y0"] for shape in memory["layout"]["shapes"]] == [1.0]


def test_the_curves_the_api_and_the_leaderboard_count_steps_alike(alice, alice_client, alice_team, redis_client,
                                                                   host_id):
    # Evaluations every 10 steps: the workers report them after steps 9, 19, 29 and 39 of their 0-based count.
    experiment = make_experiment(alice_team, name="counted", total_steps=40)
    trial = experiment.trials.get()
    write_steps(redis_client, host_id, trial, range(0, 40))
    write_final_eval(redis_client, host_id, trial, step=39, loss=2.0, bpb=1.4)
    telemetry_ingest(host_id=host_id)
    trial.refresh_from_db()

    curves = alice_client.get(reverse("dashboard_curves_data", args=[experiment.pk])).json()["points"][str(trial.pk)]
    assert curves["eval_x"] == [10, 20, 30, 40]  # drawn at the steps they were measured after
    assert curves["x"][0] == 1 and curves["x"][-1] == 40  # the first step's loss at step 1
    tokens = alice_client.get(reverse("dashboard_curves_data", args=[experiment.pk]), {"x": "tokens"}).json()
    assert tokens["points"][str(trial.pk)]["eval_x"] == [10 * 256, 20 * 256, 30 * 256, 40 * 256]

    api = api_for(alice)
    metrics = api.get(f"/trials/{trial.pk}/metrics").json()
    assert [e["step"] for e in metrics["evals"]] == [10, 20, 30, 40]
    assert metrics["steps"][0]["step"] == 1 and metrics["steps"][-1]["step"] == 40 == metrics["trial"]["step"]
    board = api.get(f"/leaderboards/{experiment.dataset_id}").json()["team"]
    assert [(row["trial_id"], row["step"]) for row in board] == [(trial.pk, 40)]  # the final evaluation's


def test_the_trial_curves_poll_answers_the_trials_new_points_and_404_for_another_teams(alice_client, bob_client,
                                                                                        experiment, redis_client,
                                                                                        host_id):
    second = experiment.trials.get(number=2)
    url = reverse("dashboard_trial_curves_data", args=[second.pk])
    first = alice_client.get(url).json()
    assert list(first["points"]) == [str(second.pk)] and first["points"][str(second.pk)]["x"][-1] == 40
    assert first["running"] is True
    write_steps(redis_client, host_id, second, range(40, 42))
    telemetry_ingest(host_id=host_id)
    update = alice_client.get(url, first["cursor"]).json()
    assert update["points"][str(second.pk)]["x"] == [41, 42]
    assert bob_client.get(url).status_code == 404
