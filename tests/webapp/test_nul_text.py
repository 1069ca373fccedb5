"""Null characters never reach the database: what people type is refused under its field, on the pages and in
the API; what machines produce is kept with U+FFFD in their place, by the database connection itself. On
PostgreSQL a NUL in text or jsonb fails the statement (and the transaction around it)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from tests.webapp.api.conftest import api_for
from tests.webapp.datasets.factories import make_dataset, use_data_dir
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_forms import post_data
from webapp.accounts.models import Team
from webapp.api.models import AccessToken
from webapp.ground.models import Experiment, SavedComparison, Trial
from webapp.telemetry.models import UnitSpan

pytestmark = pytest.mark.django_db
REFUSED = "Null characters are not allowed."


@pytest.fixture
def alice_dataset(alice_team, settings, tmp_path):
    use_data_dir(settings, tmp_path)
    return make_dataset(alice_team, name="alice corpus")


def test_a_comparison_named_with_a_null_character_is_refused(alice_client: Client, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    response = alice_client.post(reverse("comparison_create"), {"name": "best\x00runs",
                                                                "experiments": [experiment.pk]}, follow=True)
    assert REFUSED in response.content.decode()
    assert not SavedComparison.objects.exists()


def test_a_search_with_a_null_character_is_refused_and_the_list_still_shows(alice_client: Client, alice_team,
                                                                           alice_dataset):
    make_experiment(alice_team, alice_dataset, name="kept")
    for query in ({"q": "ke\x00pt"}, {"q": "tag:a\x00b"}, {"tag": "\x00"}):
        response = alice_client.get(reverse("experiment_list"), query)
        page = response.content.decode()
        assert response.status_code == 400
        assert f"The search and filters were not applied: {REFUSED}" in page and "kept" in page


@pytest.mark.parametrize("space_text", [
    'lr: {values: [0.001]}\nprecision: {values: ["fp\\0"]}',  # YAML's escape
    '{"lr": {"values": [0.001]}, "chat_template": "{{ x }}\\u0000"}',  # JSON's
])
def test_a_pasted_search_space_with_an_escaped_null_character_is_refused(alice_client: Client, alice_dataset,
                                                                          space_text: str):
    response = alice_client.post(reverse("experiment_create"), post_data(alice_dataset, action="create",
                                                                         space_text=space_text))
    assert response.status_code == 400
    assert response.context["form"].errors["space_text"] == [
        "The search space holds a null character (\\0 or \\u0000): null characters are not allowed."]
    assert not Experiment.objects.exists()


def test_the_api_refuses_a_null_character_in_a_space_sent_as_an_object(alice, alice_dataset):
    response = api_for(alice).post("/experiments", {
        "name": "sweep", "dataset": alice_dataset.pk,
        "space": {"lr": {"values": [0.001]}, "chat_template": "{{ messages }}\x00"}})
    assert response.status_code == 400
    assert response.json()["errors"] == {"space": [
        "The search space holds a null character (\\0 or \\u0000): null characters are not allowed."]}
    assert not Experiment.objects.exists()


@pytest.mark.parametrize(("url", "data"), [
    ("team_list", {"name": "Lab\x00"}),
    ("api_tokens", {"name": "laptop\x00", "scope": "read", "days": 30}),
])
def test_the_pages_forms_refuse_a_null_character_under_the_field(alice_client: Client, url: str,
                                                                 data: dict[str, object]):
    before = (Team.objects.count(), AccessToken.objects.count())
    response = alice_client.post(reverse(url), data)
    assert REFUSED in response.content.decode()
    assert (Team.objects.count(), AccessToken.objects.count()) == before


def test_text_from_a_machine_is_stored_with_a_replacement_character(alice_team, alice_dataset):
    """Whatever path a worker's or a model's text takes to a row (a save, an update, JSON), the connection
    replaces each NUL: U+FFFD shows that something was there."""
    trial = make_experiment(alice_team, alice_dataset).trials.first()
    trial.message = "row 3: 'a\x00b'"
    trial.plan = {"note": "x\x00", "layers\x00": ["\x00"]}
    trial.save()
    Trial.objects.filter(pk=trial.pk).update(export_path="/exports/\x00")
    trial.refresh_from_db()
    assert trial.message == "row 3: 'a\ufffdb'"
    assert trial.export_path == "/exports/\ufffd"
    if connection.vendor == "postgresql":  # SQLite keeps JSON as text, where the escape \u0000 is harmless
        assert trial.plan == {"note": "x\ufffd", "layers\ufffd": ["\ufffd"]}


def test_a_bulk_insert_of_machine_text_with_a_nul_is_stored_whole(alice_team, alice_dataset):
    """The ingest stores each batch of telemetry in one insert (on PostgreSQL, one array per column): a device
    or phase name with a NUL in one row is kept with U+FFFD, and the batch goes in whole, not entry by entry."""
    trial = make_experiment(alice_team, alice_dataset).trials.first()
    spans = [UnitSpan(trial=trial, host="h", entry_id=f"1-{k}", device=device, unit=k, step=0, micro_batch=0,
                      phase=phase, shard=0, start=1.0, end=2.0, bytes_moved=0, peak_bytes=0)
             for k, (device, phase) in enumerate([("cpu\x000", "F\x00"), ("cpu1", "F")])]
    UnitSpan.objects.bulk_create(spans)
    assert sorted(UnitSpan.objects.values_list("device", "phase")) == [("cpu1", "F"), ("cpu\ufffd0", "F\ufffd")]
