"""Previews of large sweeps: planned by the web worker, not the request (and once Redis is back, when it was
down); creation reuses them; team-scoped."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.webapp.experiments.factories import draft
from tests.webapp.experiments.test_forms import post_data
from tests.webapp.web_worker import CLOSED_PORT_URL, redis_at
from webapp.background.reconcile import WebWorkReconciled, web_work_reconcile
from webapp.experiments import planning, previews
from webapp.experiments.model_shapes import ModelShape
from webapp.experiments.search_space import parse_search_space
from webapp.ground.models import Experiment, ExperimentPreview

Status = ExperimentPreview.Status
LEARNING_RATES = [round(0.001 * (n + 1), 3) for n in range(20)]
# 20 trials of a 64-layer model: 20 x (62 blocks + embedding + head) = 1280 layer plans, over the inline bound,
# yet quick for the web worker (every trial has the same shape, so it packs one plan).
DEEP = {"model_kind": "custom", "n_layer": 62, "n_embd": 32, "n_head": 2, "n_positions": 256}
LARGE_ROWS = [{"name": "lr", "kind": "categorical", "values": ", ".join(map(str, LEARNING_RATES))},
              {"name": "batch_size", "kind": "categorical", "values": "2"}]
DEEP_SHAPE = ModelShape(n_layer=62, n_embd=32, n_head=2, n_positions=256)
LARGE_SPACE = {"lr": {"kind": "categorical", "values": LEARNING_RATES}, "batch_size": {"values": [2]}}


@pytest.fixture
def planner_calls(monkeypatch) -> list[object]:
    """Every memory plan this process asks for (the web worker, another process, is not counted)."""
    calls: list[object] = []
    plan = planning.memory_plan

    def counted(*args, **kwargs):
        calls.append(args)
        return plan(*args, **kwargs)

    monkeypatch.setattr(planning, "memory_plan", counted)
    return calls


def large_post(dataset, **fields):
    return post_data(dataset, rows=LARGE_ROWS, **{**DEEP, **fields})


def large_draft(dataset, **fields):
    return draft(dataset, model={"kind": "custom", **{k: v for k, v in DEEP.items() if k != "model_kind"}},
                 shape=DEEP_SHAPE, space=LARGE_SPACE, **fields)


def poll_url(page: str) -> str:
    match = re.search(r'data-poll="([^"]+)"', page)
    assert match, page
    return match.group(1)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_bound_sits_between_a_small_and_a_large_draft(alice_dataset):
    assert planning.plan_cost(draft(alice_dataset)) == 2 * (2 + 2)  # 2 trials of the micro preset's 2 blocks
    assert planning.plan_cost(large_draft(alice_dataset)) == 20 * 64
    assert not previews.plans_in_background(draft(alice_dataset))
    assert previews.plans_in_background(large_draft(alice_dataset))
    # The deepest searched depth counts, and TPE plans only its first wave.
    deeper = draft(alice_dataset, space={**LARGE_SPACE, "n_layer": {"values": [2, 200]}}, strategy="random",
                   n_trials=3)
    assert planning.plan_cost(deeper) == 3 * 202
    assert planning.plan_cost(dataclasses.replace(deeper, strategy="tpe", n_trials=100)) == 4 * 202


def test_the_key_covers_what_the_plans_depend_on_and_nothing_else(alice_dataset):
    def key(d, budget_bytes=256 << 20):
        return previews.preview_key(d, budget_bytes=budget_bytes, caps=settings.HYDRA.caps)

    base = large_draft(alice_dataset)
    assert key(base) == key(dataclasses.replace(base, name="renamed", eval_every=7, early_stop_patience=3))
    reordered = parse_search_space({"batch_size": {"values": [2]}, **LARGE_SPACE})
    for changed in (dataclasses.replace(base, seed=1), dataclasses.replace(base, budget=11),
                    dataclasses.replace(base, space=reordered),  # the order of the grid's trials
                    dataclasses.replace(base, shape=dataclasses.replace(DEEP_SHAPE, n_layer=61))):
        assert key(changed) != key(base), changed
    assert key(base, budget_bytes=128 << 20) != key(base)


def test_a_small_draft_is_still_previewed_in_the_request(alice_client, alice_dataset, planner_calls):
    response = alice_client.post(reverse("experiment_create"), post_data(alice_dataset, action="preview"))
    page = response.content.decode()
    assert response.status_code == 200 and "Preview: 2 trials" in page and "Preparing preview" not in page
    assert planner_calls and not ExperimentPreview.objects.exists()


def test_a_large_preview_is_planned_by_the_web_worker_and_the_page_shows_it(alice, alice_dataset, web_worker,
                                                                            planner_calls):
    client = logged_in(alice)
    response = client.post(reverse("experiment_create"), large_post(alice_dataset, action="preview"))
    page = response.content.decode()
    assert response.status_code == 200 and "Preparing preview…" in page and "Preview: 20 trials" not in page
    assert planner_calls == []  # the request planned nothing
    preview = ExperimentPreview.objects.get()
    assert poll_url(page) == reverse("experiment_preview", args=[preview.pk])
    web_worker.wait(lambda: ExperimentPreview.objects.get().status != Status.PREPARING, 60, "the preview")
    preview.refresh_from_db()
    assert preview.status == Status.READY, preview.message
    shown = client.get(poll_url(page)).content.decode()
    assert "Preview: 20 trials" in shown and 'http-equiv="refresh"' not in shown and "data-poll" not in shown
    assert shown.count('<span class="param">lr=') == 20
    # Previewing the same draft again shows the stored trials at once.
    again = client.post(reverse("experiment_create"), large_post(alice_dataset, action="preview")).content.decode()
    assert "Preview: 20 trials" in again and ExperimentPreview.objects.count() == 1
    assert planner_calls == []


def test_a_large_preview_asked_for_while_redis_is_down_is_planned_once_it_is_back(alice, alice_dataset,
                                                                                 web_worker, settings):
    client = logged_in(alice)
    with redis_at(settings, CLOSED_PORT_URL):
        response = client.post(reverse("experiment_create"), large_post(alice_dataset, action="preview"))
    page = response.content.decode()
    assert response.status_code == 200 and "Preparing preview…" in page
    assert "The background worker could not be reached (" in page and "Or press Preview again." in page
    assert ExperimentPreview.objects.get().status == Status.PREPARING

    assert web_work_reconcile() == WebWorkReconciled(sent=1, failed=0)  # Redis is back: the ingest's pass

    web_worker.wait(lambda: ExperimentPreview.objects.get().status != Status.PREPARING, 60, "the preview")
    assert ExperimentPreview.objects.get().status == Status.READY, ExperimentPreview.objects.get().message
    shown = client.get(poll_url(page)).content.decode()
    assert "Preview: 20 trials" in shown and "could not be reached" not in shown


def test_creating_a_large_draft_waits_for_its_preview_then_uses_its_plans(alice, alice_dataset, web_worker,
                                                                          planner_calls):
    client = logged_in(alice)
    refused = client.post(reverse("experiment_create"), large_post(alice_dataset, action="create"))
    page = refused.content.decode()
    assert refused.status_code == 400 and "Press Create again once the preview below shows them" in page
    assert "Preparing preview…" in page and not Experiment.objects.exists()
    web_worker.wait(lambda: ExperimentPreview.objects.get().status != Status.PREPARING, 60, "the preview")
    preview = ExperimentPreview.objects.get()
    assert preview.status == Status.READY, preview.message
    created = client.post(reverse("experiment_create"), large_post(alice_dataset, action="create", name="deep"))
    assert created.status_code == 302, created.content.decode()
    experiment = Experiment.objects.get()
    assert experiment.name == "deep"  # the name is not part of the preview's key
    assert [(t.number, t.params, t.total_steps, t.plan) for t in experiment.trials.all()] == [
        (t["number"], t["params"], t["total_steps"], t["plan"]) for t in preview.trials]
    assert planner_calls == []  # neither request planned


def test_another_teams_draft_never_reuses_a_preview(alice_client, bob_client, alice_team, bob_team,
                                                   alice_dataset, scheduler):
    ours = previews.experiment_preview_request(team=alice_team, draft=large_draft(alice_dataset))
    previews.experiment_preview_plan(preview_id=ours.pk)  # what the web worker runs
    assert ExperimentPreview.objects.get(pk=ours.pk).status == Status.READY
    url = reverse("experiment_preview", args=[ours.pk])
    assert "Preview: 20 trials" in alice_client.get(url).content.decode()
    assert bob_client.get(url).status_code == 404
    with pytest.raises(previews.PreviewPending) as pending:
        previews.experiment_preview_trials(team=bob_team, draft=large_draft(alice_dataset))
    assert pending.value.preview.pk != ours.pk and pending.value.preview.team == bob_team
    assert pending.value.preview.status == Status.PREPARING


def test_a_preview_that_cannot_fit_shows_why_and_creation_is_refused(alice_client, alice_team, alice_dataset,
                                                                    scheduler):
    data = large_post(alice_dataset, action="preview", n_embd=256, memory_budget_mib=1)
    page = alice_client.post(reverse("experiment_create"), data).content.decode()
    assert "Preparing preview…" in page
    previews.experiment_preview_plan(preview_id=ExperimentPreview.objects.get().pk)
    shown = alice_client.get(poll_url(page)).content.decode()
    assert "Preview failed" in shown and "needs" in shown and "the budget is 1.0 MiB" in shown
    refused = alice_client.post(reverse("experiment_create"), {**data, "action": "create"})
    assert refused.status_code == 400 and "This sweep cannot be created: Layer" in refused.content.decode()
    assert not Experiment.objects.exists()


def test_planning_deletes_previews_older_than_a_day(alice_team, alice_dataset, scheduler):
    old = previews.experiment_preview_request(team=alice_team, draft=large_draft(alice_dataset, seed=1))
    ExperimentPreview.objects.filter(pk=old.pk).update(created=timezone.now() - timedelta(days=1, minutes=1))
    recent = previews.experiment_preview_request(team=alice_team, draft=large_draft(alice_dataset, seed=2))
    previews.experiment_preview_plan(preview_id=recent.pk)
    assert list(ExperimentPreview.objects.values_list("pk", "status")) == [(recent.pk, Status.READY)]
