"""A DPO trial's rewards, stored by the real ingest from the workers' streams, drawn as TRL logs them: the chosen
and rejected rewards over steps and the preference accuracy, on the trial page and the experiment's curves (which
also compare experiments); a trial of another objective draws none. Its final evaluation's accuracy and margin
become the trial's figures, which the API gives."""

from __future__ import annotations

import json
import math
import time

import pytest
from django.urls import reverse

from tests.webapp.api.conftest import api_for
from tests.webapp.telemetry.factories import make_experiment, write_steps
from webapp.dashboards import reward_figures, selectors
from webapp.experiments.ingest import telemetry_ingest
from worker.scheduling import telemetry

pytestmark = pytest.mark.django_db
STEPS = 6


def write_dpo(client, host_id, trial, steps: range = range(STEPS)) -> None:
    """`steps` whose chosen reward climbs and rejected reward falls, an evaluation after the third of all `STEPS`
    and a final one."""
    pipe = client.pipeline()
    now = time.time()
    for step in steps:
        telemetry.add(pipe, host_id, "steps", telemetry.StepMetrics(
            trial=trial.queue_id, step=step, loss=0.69 - 0.05 * step, lr=1e-3, tokens=64 * (step + 1),
            time=now + step, rewards_chosen=0.01 * step, rewards_rejected=-0.02 * step, reward_accuracy=step / STEPS))
    for step, final in ((2, 0), (STEPS - 1, 1)):
        if step not in steps:
            continue
        telemetry.add(pipe, host_id, "evals", telemetry.EvalMetrics(
            trial=trial.queue_id, step=step, loss=0.6, perplexity=math.exp(1.2), time=now + step, bpb=1.5,
            tokens=100, bytes=300, final=final, rewards_chosen=0.05, rewards_rejected=-0.1, reward_margin=0.15,
            reward_accuracy=0.75))
    pipe.execute()


@pytest.fixture
def trials(alice_team, redis_client, host_id):
    experiment = make_experiment(alice_team, trials=[{"dpo_beta": 0.1}, {"dpo_beta": 0.3}], total_steps=STEPS,
                                 objective="dpo")
    dpo, plain = experiment.trials.order_by("number")
    write_dpo(redis_client, host_id, dpo)
    write_steps(redis_client, host_id, plain, range(STEPS))
    telemetry_ingest(host_id=host_id)
    dpo.refresh_from_db()
    plain.refresh_from_db()
    return dpo, plain


def test_the_figure_draws_the_rewards_and_the_accuracy_of_dpo_trials_only(trials):
    dpo, plain = trials
    infos = selectors.trial_infos([dpo, plain])
    series = selectors.reward_curves(trials=infos, until=selectors.curves(trials=infos).cursor)
    assert list(series) == [dpo.pk]  # the other trial has no rewards
    figure = reward_figures.reward_curves(series, infos)
    by_role = {trace["meta"]["role"]: trace for trace in figure["data"]}
    assert set(by_role) == {"chosen", "rejected", "accuracy", "eval_accuracy"}
    assert by_role["chosen"]["x"] == list(range(1, STEPS + 1))  # steps counted from 1, as every page counts them
    assert by_role["chosen"]["y"] == pytest.approx([0.01 * s for s in range(STEPS)])
    assert by_role["rejected"]["y"] == pytest.approx([-0.02 * s for s in range(STEPS)])
    assert by_role["accuracy"]["y"] == pytest.approx([s / STEPS for s in range(STEPS)])
    assert by_role["accuracy"]["yaxis"] == "y2" and figure["layout"]["yaxis2"]["range"] == [-0.05, 1.05]
    assert (by_role["eval_accuracy"]["x"], by_role["eval_accuracy"]["customdata"]) == ([3, STEPS], [0.15, 0.15])
    assert reward_figures.reward_curves(selectors.reward_curves(trials=infos[1:], until=selectors.Cursor(2**62, 2**62)),
                                        infos[1:]) is None


def test_the_trial_page_and_the_curves_page_embed_the_rewards_of_a_dpo_trial(alice_client, trials):
    dpo, plain = trials
    page = alice_client.get(reverse("trial_detail", args=[dpo.pk])).content.decode()
    figure = json.loads(page.split('<script id="rewards-figure" type="application/json">')[1].split("</script>")[0])
    assert [t["meta"]["role"] for t in figure["data"]] == ["chosen", "rejected", "accuracy", "eval_accuracy"]
    assert "rewards-figure" not in alice_client.get(reverse("trial_detail", args=[plain.pk])).content.decode()
    curves = alice_client.get(reverse("dashboard_curves", args=[dpo.experiment_id])).content.decode()
    assert '<script id="reward-figure" type="application/json">' in curves


def test_a_poll_answers_only_the_rewards_stored_since_the_page_s_cursor(alice_client, alice_team, redis_client,
                                                                         host_id):
    experiment = make_experiment(alice_team, trials=[{"dpo_beta": 0.1}, {"dpo_beta": 0.3}], total_steps=STEPS,
                                 objective="dpo")
    dpo, plain = experiment.trials.order_by("number")
    write_dpo(redis_client, host_id, dpo, range(2))
    write_steps(redis_client, host_id, plain, range(2))
    telemetry_ingest(host_id=host_id)
    page = alice_client.get(reverse("trial_detail", args=[dpo.pk])).content.decode()
    state = json.loads(page.split('<script id="dashboard-state" type="application/json">')[1].split("</script>")[0])
    figure = json.loads(page.split('<script id="rewards-figure" type="application/json">')[1].split("</script>")[0])
    held_out = next(t for t in figure["data"] if t["meta"]["role"] == "eval_accuracy")
    assert held_out["x"] == []  # drawn empty, for the poll to extend

    write_dpo(redis_client, host_id, dpo, range(2, STEPS))
    write_steps(redis_client, host_id, plain, range(2, STEPS))
    telemetry_ingest(host_id=host_id)
    new = alice_client.get(reverse("dashboard_trial_curves_data", args=[dpo.pk]), state["cursor"]).json()
    assert list(new["rewards"]) == [str(dpo.pk)]
    rewards = new["rewards"][str(dpo.pk)]
    assert rewards["x"] == list(range(3, STEPS + 1))
    assert rewards["chosen"] == pytest.approx([0.01 * s for s in range(2, STEPS)])
    assert rewards["accuracy"] == pytest.approx([s / STEPS for s in range(2, STEPS)])
    assert (rewards["eval_x"], rewards["eval_accuracy"], rewards["eval_margin"]) == ([3, STEPS], [0.75] * 2,
                                                                                     [0.15] * 2)
    again = alice_client.get(reverse("dashboard_trial_curves_data", args=[dpo.pk]), new["cursor"]).json()
    assert again["rewards"] == {}
    curves = alice_client.get(reverse("dashboard_curves_data", args=[experiment.pk]), state["cursor"]).json()
    assert list(curves["rewards"]) == [str(dpo.pk)]  # the other trial has no rewards
    assert curves["rewards"][str(dpo.pk)]["rejected"] == pytest.approx([-0.02 * s for s in range(2, STEPS)])


def test_the_final_evaluation_s_accuracy_and_margin_are_the_trial_s_figures(alice, trials):
    dpo, plain = trials
    assert (dpo.final_reward_accuracy, dpo.final_reward_margin, dpo.final_loss) == (0.75, 0.15, 0.6)
    assert plain.final_reward_accuracy is None
    api = api_for(alice)
    shown = api.get(f"/trials/{dpo.pk}").json()
    assert (shown["final_reward_accuracy"], shown["final_reward_margin"]) == (0.75, 0.15)
    metrics = api.get(f"/trials/{dpo.pk}/metrics").json()
    assert [s["reward_accuracy"] for s in metrics["steps"]] == pytest.approx([s / STEPS for s in range(STEPS)])
    assert [e["reward_margin"] for e in metrics["evals"]] == [0.15, 0.15]
