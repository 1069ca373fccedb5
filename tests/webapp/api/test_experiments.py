"""Experiments and trials through the API, as a script drives them: created from the form's own search-space
schema with the form's own messages, previewed, launched, cloned, listed, read, controlled, polled and
downloaded."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import pytest
import yaml
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_views import exported_trial
from webapp.experiments.archives import trial_archive_build
from webapp.ground.models import Experiment, Trial, TrialArchive
from webapp.telemetry.models import EvalMetric, StepMetric

pytestmark = pytest.mark.django_db

SPACE_YAML = """
model: {preset: gpt2-micro}
lr: {kind: categorical, values: [0.001, 0.003]}
batch_size: {values: [2]}
"""


def body(dataset, **fields):
    return {"name": "api sweep", "dataset": dataset.pk, "space": SPACE_YAML, "budget": 10, "eval_every": 5,
            "memory_budget_mib": 256, **fields}


def test_it_creates_an_experiment_from_the_forms_yaml_and_launches_it(alice, alice_api, alice_dataset, scheduler,
                                                                      django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_api.post("/experiments", body(alice_dataset, launch=True))
    assert response.status_code == 201, response.content
    created = response.json()
    experiment = Experiment.objects.get(pk=created["id"])
    assert experiment.created_by == alice and experiment.team.name == "Alice lab"
    assert created["trials"]["total"] == 2 and created["model"] == {"kind": "preset", "preset": "gpt2-micro"}
    assert sorted(t.params["lr"] for t in experiment.trials.all()) == [0.001, 0.003]
    assert set(experiment.trials.values_list("status", flat=True)) == {"planning"}  # sent to the scheduler
    assert created["status"] == "queued"


def test_a_space_given_as_an_object_is_the_same_as_its_text(alice_api, alice_dataset):
    as_text = alice_api.post("/experiments", body(alice_dataset, name="text")).json()
    as_object = alice_api.post("/experiments", body(alice_dataset, name="object", space=yaml.safe_load(SPACE_YAML)))
    assert as_object.status_code == 201
    first, second = Experiment.objects.get(pk=as_text["id"]), Experiment.objects.get(pk=as_object.json()["id"])
    assert (first.search_space, first.model) == (second.search_space, second.model)


@pytest.mark.parametrize("change, field, message", [
    ({"space": "lr: {kind: float, low: 1, high: 0.1}"}, "space", "reversed"),
    ({"space": "lr: [unclosed"}, "space", "YAML"),
    ({"space": "lr: [0.1\nbatch_size: 8"}, "space", "neither YAML nor JSON: line 2, column 11: expected"),
    ({"space": "lora_rank: [8]"}, "space", "did you mean lora_r?"),
    ({"space": "nonsense_param: {values: [1]}"}, "space", "nonsense_param"),
    ({"budget": -1}, "budget", "greater than or equal to 0.01"),
    ({"budget": 100_000_000}, "budget", "A trial would take 100,000,000 optimizer steps; the cap is"),
    ({"strategy": "magic"}, "strategy", "Select a valid choice"),
    ({"name": ""}, "name", "This field is required"),
])
def test_bad_input_gets_the_forms_message_under_its_field_and_a_400(alice_api, alice_dataset, change, field,
                                                                    message):
    response = alice_api.post("/experiments", body(alice_dataset, **change))
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert any(message in m for m in errors[field]), errors
    assert message in response.json()["detail"] or field == "__all__"
    assert not Experiment.objects.exists()


def test_a_body_of_the_wrong_types_is_a_400_naming_the_field(alice_api, alice_dataset):
    response = alice_api.post("/experiments", body(alice_dataset, n_trials="many"))
    assert response.status_code == 400
    assert "n_trials" in response.json()["errors"]
    broken = alice_api.client.post("/api/v1/experiments", "{not json", content_type="application/json",
                                   headers=alice_api.headers)
    assert 400 <= broken.status_code < 500


def test_another_teams_dataset_is_refused_as_the_form_refuses_it(alice_api, bob_dataset):
    response = alice_api.post("/experiments", body(bob_dataset))
    assert response.status_code == 400
    assert "Select a valid choice" in response.json()["errors"]["dataset"][0]


def test_it_previews_the_trials_and_their_memory_plans_without_creating_anything(alice_api, alice_dataset):
    response = alice_api.post("/experiments/preview", body(alice_dataset))
    assert response.status_code == 200, response.content
    preview = response.json()
    assert preview["status"] == "ready" and preview["budget_bytes"] == 256 << 20
    assert [t["number"] for t in preview["trials"]] == [1, 2]
    plan = preview["trials"][0]["plan"]
    assert plan["shards"] >= 1 and 0 < plan["peak_bytes"] <= 256 << 20
    assert not Experiment.objects.exists()
    tight = alice_api.post("/experiments/preview", body(alice_dataset, memory_budget_mib=1))
    assert tight.status_code == 400 and "memory_budget_mib" in tight.json()["errors"]


def test_a_clone_takes_the_source_with_the_changes_given(alice_api, alice_team, alice_dataset):
    source = make_experiment(alice_team, alice_dataset, name="first")
    response = alice_api.post(f"/experiments/{source.pk}/clone", {"budget": 20, "name": "longer"})
    assert response.status_code == 201, response.content
    clone = Experiment.objects.get(pk=response.json()["id"])
    assert clone.cloned_from == source and clone.name == "longer" and clone.budget == 20
    assert (clone.search_space, clone.model, clone.dataset) == (source.search_space, source.model, source.dataset)
    assert response.json()["cloned_from"] == source.pk
    bad = alice_api.post(f"/experiments/{source.pk}/clone", {"eval_every": 0})
    assert bad.status_code == 400 and "eval_every" in bad.json()["errors"]


def test_the_space_download_creates_the_same_experiment_again(alice_api, alice_team, alice_dataset):
    source = make_experiment(alice_team, alice_dataset, name="first", checkpoint_minutes=7)
    space = alice_api.get(f"/experiments/{source.pk}/space").json()
    again = alice_api.post("/experiments", body(alice_dataset, space=space)).json()
    copy = Experiment.objects.get(pk=again["id"])
    assert (copy.search_space, copy.model, copy.checkpoint_minutes) == (source.search_space, source.model, 7)


def test_the_list_pages_and_filters_as_the_page_does(alice_api, alice_team, alice_dataset, bob_team, bob_dataset):
    for name in ("alpha", "beta", "gamma"):
        make_experiment(alice_team, alice_dataset, name=name)
    make_experiment(bob_team, bob_dataset, name="alpha bob")
    listed = alice_api.get("/experiments", limit=2).json()
    assert listed["count"] == 3 and [e["name"] for e in listed["items"]] == ["gamma", "beta"]
    assert [e["name"] for e in alice_api.get("/experiments", limit=2, offset=2).json()["items"]] == ["alpha"]
    assert [e["name"] for e in alice_api.get("/experiments", q="alp").json()["items"]] == ["alpha"]
    assert alice_api.get("/experiments", status="draft").json()["count"] == 3
    assert alice_api.get("/experiments", status="running").json()["count"] == 0
    assert alice_api.get("/experiments", limit=1000).status_code == 400  # at most 100 a page
    with CaptureQueriesContext(connection) as one:
        alice_api.get("/experiments", limit=1)
    with CaptureQueriesContext(connection) as three:
        alice_api.get("/experiments", limit=3)
    assert len(three.captured_queries) == len(one.captured_queries)  # a page's trials counted in one query


def test_trials_are_listed_read_and_polled_with_a_cursor(alice_api, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    trial = experiment.trials.get(number=1)
    trial.attempt, trial.status, trial.step = 1, Trial.Status.RUNNING, 3
    trial.save()
    for step in (1, 2, 3):
        StepMetric.objects.create(trial=trial, attempt=1, step=step, loss=5.0 - step, lr=1e-3, tokens=step * 64,
                                  time=1000.0 + step)
    StepMetric.objects.create(trial=trial, attempt=0, step=9, loss=9.0, lr=1e-3, tokens=1, time=1.0)  # old attempt
    EvalMetric.objects.create(trial=trial, attempt=1, step=2, loss=3.5, perplexity=33.1, bpb=1.25, time=1002.5)

    trials = alice_api.get(f"/experiments/{experiment.pk}/trials").json()
    assert [t["number"] for t in trials] == [1, 2] and trials[0]["actions"] == ["pause", "cancel"]
    first = alice_api.get(f"/trials/{trial.pk}/metrics").json()
    assert [s["step"] for s in first["steps"]] == [1, 2, 3] and first["steps"][2]["loss"] == 2.0
    assert [(e["step"], e["bpb"]) for e in first["evals"]] == [(2, 1.25)]
    assert first["next"] == 3 and first["trial"]["status"] == "running"
    assert alice_api.get(f"/trials/{trial.pk}/metrics", since=3).json()["steps"] == []
    StepMetric.objects.create(trial=trial, attempt=1, step=4, loss=0.5, lr=1e-3, tokens=256, time=1004.0)
    later = alice_api.get(f"/trials/{trial.pk}/metrics", since=first["next"]).json()
    assert [s["step"] for s in later["steps"]] == [4] and later["evals"] == [] and later["next"] == 4

    stamp = alice_api.get(f"/trials/{trial.pk}").json()["updated"]
    assert alice_api.get(f"/experiments/{experiment.pk}/trials", updated_since=stamp).json() == []
    bad = alice_api.get(f"/experiments/{experiment.pk}/trials", updated_since="yesterday")
    assert bad.status_code == 400 and "ISO 8601" in bad.json()["errors"]["updated_since"][0]


def test_an_unchanged_answer_is_a_304_for_its_etag(alice_api, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    first = alice_api.get(f"/experiments/{experiment.pk}")
    etag = first["ETag"]
    again = alice_api.client.get(f"/api/v1/experiments/{experiment.pk}",
                                 headers={**alice_api.headers, "If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    Experiment.objects.filter(pk=experiment.pk).update(name="renamed")
    changed = alice_api.client.get(f"/api/v1/experiments/{experiment.pk}",
                                   headers={**alice_api.headers, "If-None-Match": etag})
    assert changed.status_code == 200 and changed.json()["name"] == "renamed"


def test_a_finished_trials_model_is_packed_then_downloaded(alice_api, alice_team, alice_dataset, data_dir):
    trial = exported_trial(make_experiment(alice_team, alice_dataset), data_dir)
    assert alice_api.get(f"/trials/{trial.pk}/export").status_code == 409  # not packed yet
    asked = alice_api.post(f"/trials/{trial.pk}/archive").json()
    assert asked["status"] == "preparing" and asked["download"] is None
    trial_archive_build(archive_id=TrialArchive.objects.get().pk)  # what the web worker does
    ready = alice_api.get(f"/trials/{trial.pk}/archive").json()
    assert ready["status"] == "ready" and ready["download"] == f"/api/v1/trials/{trial.pk}/export?kind=model"
    assert ready["packed_bytes"] == ready["total_bytes"] > 0  # every byte packed: config.json and the tokenizer
    response = alice_api.get(f"/trials/{trial.pk}/export")
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content)), mode="r:gz") as tar:
        assert f"sweep-trial-1-id-{trial.pk}-model/config.json" in tar.getnames()


def test_a_trial_without_a_model_cannot_be_packed(alice_api, alice_team, alice_dataset):
    trial = make_experiment(alice_team, alice_dataset).trials.first()
    response = alice_api.post(f"/trials/{trial.pk}/archive")
    assert response.status_code == 400 and "no exported model" in response.json()["detail"]


def test_generation_takes_the_forms_checks(alice_api, alice_team, alice_dataset, data_dir):
    trial = exported_trial(make_experiment(alice_team, alice_dataset), data_dir)
    empty = alice_api.post(f"/trials/{trial.pk}/generate", {"prompt": "   "})
    assert empty.status_code == 400 and "Write some text" in empty.json()["errors"]["prompt"][0]
    hot = alice_api.post(f"/trials/{trial.pk}/generate", {"prompt": "Once", "temperature": 99})
    assert hot.status_code == 400 and "temperature" in hot.json()["errors"]
    asked = alice_api.post(f"/trials/{trial.pk}/generate", {"prompt": "Once upon"})
    assert asked.status_code == 202 and asked.json()["status"] == "pending"
    got = alice_api.get(f"/trials/{trial.pk}/generations/{asked.json()['id']}").json()
    assert got["prompt"] == "Once upon"


def test_continue_takes_the_forms_checks(alice_api, alice_team, alice_dataset):
    trial = make_experiment(alice_team, alice_dataset).trials.first()
    refused = alice_api.post(f"/trials/{trial.pk}/continue", {"steps": 10, "lr": 5})
    assert refused.status_code == 400 and "at most 1" in refused.json()["errors"]["lr"][0]
    not_finished = alice_api.post(f"/trials/{trial.pk}/continue", {"steps": 10, "lr": 0.001})
    assert not_finished.status_code == 400


def test_the_docs_example_space_creates_a_random_search(alice_api, alice_dataset):
    docs = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", docs, re.S).group(1)
    response = alice_api.post("/experiments", body(alice_dataset, space=example, strategy="random", n_trials=3))
    assert response.status_code == 201, response.content
    experiment = Experiment.objects.get(pk=response.json()["id"])
    assert experiment.trials.count() == 3
    assert all(0.0003 <= t.params["lr"] <= 0.003 and t.params["batch_size"] in (4, 8)
               for t in experiment.trials.all())


def test_every_error_of_the_space_comes_back_at_once(alice_api, alice_dataset):
    response = alice_api.post("/experiments", body(alice_dataset, space="lora_rank: [8]\nlr: 0.001\noptimizer: adam"))
    assert response.status_code == 400
    space = response.json()["errors"]["space"]
    assert len(space) == 2 and "did you mean lora_r?" in space[0] and "'adam' is not one of" in space[1]
