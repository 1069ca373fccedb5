"""The API's contract with its callers: the roles of the pages on every control, another team's objects as
404 on every path, the team a request acts in, the rate limit, the audit log, the upload door and the schema."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from django.contrib.staticfiles import finders
from django.urls import reverse
from openapi_spec_validator import validate

from tests.webapp.api.conftest import api_for
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_roles import ACTIONS, ALLOWED, REFUSED, setup, snapshot, users  # noqa: F401 -- fixtures
from tests.webapp.team_factories import join
from webapp.api.models import AuditEntry
from webapp.datasets.models import Dataset

pytestmark = pytest.mark.django_db

# Each control of the pages that the API offers, by the name `test_roles.ACTIONS` gives it, with its API path.
CONTROLS = {
    "pause trial": lambda e, t: f"/trials/{t.pk}/pause",
    "resume trial": lambda e, t: f"/trials/{t.pk}/resume",
    "cancel trial": lambda e, t: f"/trials/{t.pk}/cancel",
    "retry trial": lambda e, t: f"/trials/{t.pk}/retry",
    "launch experiment": lambda e, t: f"/experiments/{e.pk}/launch",
    "cancel experiment": lambda e, t: f"/experiments/{e.pk}/cancel",
    "retry failed trials": lambda e, t: f"/experiments/{e.pk}/retry-failed",
}


@pytest.mark.parametrize("actor, creator", REFUSED)
@pytest.mark.parametrize("name", CONTROLS)
def test_a_member_may_not_control_someone_elses_experiment(setup, users, scheduler, name, actor, creator,  # noqa: F811
                                                           django_capture_on_commit_callbacks):
    experiment, trial = setup(creator, ACTIONS[name])
    before = snapshot(experiment, scheduler)
    with django_capture_on_commit_callbacks(execute=True):
        response = api_for(users[actor]).post(CONTROLS[name](experiment, trial))
    assert response.status_code == 403
    assert "Only the team's owners and the person who created" in response.json()["detail"]
    assert snapshot(experiment, scheduler) == before
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("actor, creator", ALLOWED)
@pytest.mark.parametrize("name", CONTROLS)
def test_the_creator_and_the_owners_control_and_it_is_audited(setup, users, scheduler, name, actor, creator,  # noqa: F811
                                                              django_capture_on_commit_callbacks):
    experiment, trial = setup(creator, ACTIONS[name])
    before = snapshot(experiment, scheduler)
    with django_capture_on_commit_callbacks(execute=True):
        response = api_for(users[actor]).post(CONTROLS[name](experiment, trial))
    assert response.status_code == 200, response.content
    assert snapshot(experiment, scheduler) != before
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.team, entry.method) == (actor, experiment.team, "POST")
    assert entry.path == "/api/v1" + CONTROLS[name](experiment, trial)


def test_a_control_the_status_does_not_allow_is_a_400_saying_why(alice_api, alice_team, alice_dataset):
    trial = make_experiment(alice_team, alice_dataset).trials.first()
    response = alice_api.post(f"/trials/{trial.pk}/resume")
    assert response.status_code == 400 and "resume" in response.json()["detail"]


def _object_paths(experiment) -> list[tuple[str, str]]:
    trial = experiment.trials.first()
    dataset = experiment.dataset
    return [
        ("get", f"/datasets/{dataset.pk}"), ("get", f"/datasets/{dataset.pk}/preview"),
        ("get", f"/leaderboards/{dataset.pk}"),
        ("get", f"/experiments/{experiment.pk}"), ("get", f"/experiments/{experiment.pk}/space"),
        ("get", f"/experiments/{experiment.pk}/trials"), ("post", f"/experiments/{experiment.pk}/clone"),
        ("post", f"/experiments/{experiment.pk}/launch"), ("post", f"/experiments/{experiment.pk}/cancel"),
        ("post", f"/experiments/{experiment.pk}/retry-failed"),
        ("get", f"/trials/{trial.pk}"), ("get", f"/trials/{trial.pk}/metrics"),
        ("post", f"/trials/{trial.pk}/pause"), ("post", f"/trials/{trial.pk}/resume"),
        ("post", f"/trials/{trial.pk}/cancel"), ("post", f"/trials/{trial.pk}/retry"),
        ("post", f"/trials/{trial.pk}/continue"), ("get", f"/trials/{trial.pk}/archive"),
        ("post", f"/trials/{trial.pk}/archive"), ("get", f"/trials/{trial.pk}/export"),
        ("post", f"/trials/{trial.pk}/generate"), ("get", f"/trials/{trial.pk}/generations/1"),
    ]


def test_every_path_of_another_teams_object_is_a_404_like_a_missing_one(alice_api, bob_team, bob_dataset):
    experiment = make_experiment(bob_team, bob_dataset)
    before = list(experiment.trials.values_list("status", "attempt"))
    for method, path in _object_paths(experiment):
        body = {"steps": 1, "lr": 0.001} if path.endswith("/continue") else (
            {"prompt": "hi"} if path.endswith("/generate") else {})
        response = alice_api.post(path, body) if method == "post" else alice_api.get(path)
        assert response.status_code == 404, (method, path, response.content)
        missing = re.sub(r"/\d+", "/987654", path, count=1)
        absent = alice_api.post(missing, body) if method == "post" else alice_api.get(missing)
        assert absent.status_code == 404 and absent.json() == response.json(), (method, path)
    assert list(experiment.trials.values_list("status", "attempt")) == before
    assert Dataset.objects.filter(team__name="Bob lab").count() == 1
    assert not AuditEntry.objects.exists()


def test_the_team_header_picks_one_of_the_callers_teams_and_no_other(alice, alice_team, bob, bob_team,
                                                                      alice_dataset):
    join(alice_team, alice, bob)  # bob now works in Alice lab, and is still in his own
    bob_own = api_for(bob, team=bob_team.pk)
    assert bob_own.get("/datasets").json()["count"] == 0
    assert api_for(bob).get("/datasets").json()["count"] == 1  # his current team: Alice lab
    assert api_for(alice, team=bob_team.pk).get("/datasets").status_code == 404
    assert api_for(alice, team="x").get("/datasets").status_code == 404


def test_a_user_without_a_team_is_told_how_to_choose_one(charlie):
    api = api_for(charlie)
    assert api.get("/me").json()["team"] is None
    response = api.get("/experiments")
    assert response.status_code == 409 and "X-Hydra-Team" in response.json()["detail"]


def test_a_token_is_throttled_past_its_rate_and_told_when_to_come_back(alice, settings):
    settings.HYDRA = dataclasses.replace(settings.HYDRA, api_rate_per_minute=3)
    api, other = api_for(alice), api_for(alice)
    codes = [api.get("/me").status_code for _ in range(4)]
    assert codes[:3] == [200, 200, 200] and codes[3] == 429
    refused = api.get("/me")
    assert 1 <= int(refused["Retry-After"]) <= 60 and "Too many" in refused.json()["detail"]
    assert other.get("/me").status_code == 200  # each token has its own count


def test_the_audit_log_lists_api_writes_for_owners_only(alice, alice_team, alice_dataset, bob, alice_client,
                                                        bob_client):
    join(alice_team, alice, bob)
    api_for(bob).post("/experiments", {"name": "bob's", "dataset": alice_dataset.pk, "space": "lr: {values: [0.001]}",
                                       "budget": 5, "eval_every": 5, "memory_budget_mib": 256})
    api_for(bob).get("/experiments")  # reads are not audited
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.username, entry.token_name) == ("experiment.create", "bob", "bob write")
    page = alice_client.get(reverse("team_audit", args=[alice_team.pk]))
    assert page.status_code == 200 and "experiment.create" in page.content.decode()
    assert bob_client.get(reverse("team_audit", args=[alice_team.pk])).status_code == 403
    audit_link = reverse("team_audit", args=[alice_team.pk])
    assert audit_link in alice_client.get(reverse("team_detail", args=[alice_team.pk])).content.decode()
    assert audit_link not in bob_client.get(reverse("team_detail", args=[alice_team.pk])).content.decode()


def test_a_dataset_is_uploaded_with_the_pages_checks(alice_api, data_dir):
    from django.core.files.uploadedfile import SimpleUploadedFile

    made = alice_api.upload("/datasets", {"source": "upload", "vocab_size": 300, "val_fraction": 0.25,
                                          "file": SimpleUploadedFile("notes.txt", b"hello world " * 200)})
    assert made.status_code == 201, made.content
    assert made.json()["name"] == "notes.txt" and made.json()["status"] in ("tokenizing", "ready")
    empty = alice_api.upload("/datasets", {"source": "upload", "file": SimpleUploadedFile("e.txt", b"")})
    assert empty.status_code == 400 and "empty" in empty.json()["errors"]["file"][0]
    none = alice_api.upload("/datasets", {"source": "upload"})
    assert none.status_code == 400 and "Choose a file" in none.json()["errors"]["file"][0]
    sample = alice_api.upload("/datasets", {"source": "sample"})
    assert sample.status_code == 201 and sample.json()["kind"] == "corpus"
    assert alice_api.get(f"/datasets/{made.json()['id']}/preview").status_code == 409  # not tokenized here
    listed = alice_api.get("/datasets").json()
    assert listed["count"] == 2 and listed["items"][0]["id"] == sample.json()["id"]


def test_a_body_that_is_not_multipart_is_a_400(alice_api):
    response = alice_api.client.post("/api/v1/datasets", b"--x\r\n", content_type="multipart/form-data",
                                     headers=alice_api.headers)  # no boundary
    assert response.status_code == 400 and "multipart" in response.json()["detail"]


def test_an_upload_over_the_limit_is_a_413(alice_api, settings):
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.HYDRA = dataclasses.replace(settings.HYDRA, max_upload_bytes=1024)
    response = alice_api.upload("/datasets", {"source": "upload",
                                              "file": SimpleUploadedFile("big.txt", b"x" * 4096)})
    assert response.status_code in (400, 413) and "MB" in response.json()["detail"] + json.dumps(
        response.json()["errors"])


def test_a_ready_datasets_preview_shows_its_text_and_tokens(alice_api, alice_dataset):
    preview = alice_api.get(f"/datasets/{alice_dataset.pk}/preview").json()
    assert preview["kind"] == "corpus" and preview["text"].startswith("The quick brown fox")
    assert "".join(preview["pieces"]).replace(" ", "") in preview["text"].replace(" ", "")


def test_the_leaderboard_and_the_queue_answer(alice_api, alice_team, alice_dataset, scheduler):
    board = alice_api.get(f"/leaderboards/{alice_dataset.pk}").json()
    assert board["metric"] == "bpb" and board["team"] == [] and board["teams"] == []
    queue = alice_api.get("/queue").json()
    assert queue["devices"] == [] and queue["waiting"] == [] and queue["running"] == 0


def test_the_schema_is_valid_openapi_and_the_docs_page_loads_nothing_from_elsewhere(client):
    schema = client.get("/api/v1/openapi.json")
    assert schema.status_code == 200
    validate(schema.json())
    paths = schema.json()["paths"]
    assert {"/api/v1/experiments", "/api/v1/trials/{trial_id}/metrics", "/api/v1/queue"} <= set(paths)
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "swagger-ui" in html
    assert not re.search(r"(src|href)=\"https?://", html), html  # no CDN: a lab server may have no internet
    scripts = re.findall(r'src="/static/([^"]+)"', html)
    assert "ninja/swagger-ui-bundle.js" in scripts
    assert all(finders.find(path) for path in scripts), scripts  # what collectstatic gathers and serves
