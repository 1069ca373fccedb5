"""Experiment pages: login, CSRF, 404 across teams for every object URL, inert names, the form's flows."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_forms import post_data
from tests.webapp.web_worker import CLOSED_PORT_URL, redis_at
from webapp.background.reconcile import WebWorkReconciled, web_work_reconcile
from webapp.experiments.model_shapes import PRESETS, model_from_spec, model_to_spec
from webapp.experiments.space_text import checkpoint_minutes_of_text, load_spec_text
from webapp.ground.models import Experiment, Trial, TrialArchive
from webapp.telemetry.models import UnitSpan

pytestmark = pytest.mark.django_db


def object_urls(experiment):
    trial = experiment.trials.first()
    return [
        ("get", reverse("experiment_detail", args=[experiment.pk])),
        ("get", reverse("experiment_delete", args=[experiment.pk])),
        ("get", reverse("experiment_space", args=[experiment.pk, "yaml"])),
        ("get", reverse("experiment_create") + f"?clone={experiment.pk}"),
        ("post", reverse("experiment_action", args=[experiment.pk, "launch"])),
        ("post", reverse("experiment_delete", args=[experiment.pk])),
        ("get", reverse("trial_detail", args=[trial.pk])),
        ("get", reverse("trial_delete", args=[trial.pk])),
        ("get", reverse("trial_export", args=[trial.pk])),
        ("post", reverse("trial_action", args=[trial.pk, "cancel"])),
        ("post", reverse("trial_generate", args=[trial.pk])),
        ("post", reverse("trial_delete", args=[trial.pk])),
    ]


def test_it_requires_login(client, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    for method, url in [*object_urls(experiment), ("get", reverse("experiment_list")),
                        ("get", reverse("experiment_create")), ("get", reverse("home"))]:
        response = getattr(client, method)(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url


def test_it_answers_404_for_every_url_of_another_teams_experiment(alice_client, bob_team, bob_dataset):
    experiment = make_experiment(bob_team, bob_dataset)
    for method, url in object_urls(experiment):
        assert getattr(alice_client, method)(url).status_code == 404, url
    assert Experiment.objects.filter(pk=experiment.pk).exists()
    assert experiment.trials.filter(status="new").count() == 2


def test_it_requires_csrf_on_every_post(alice, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    for method, url in object_urls(experiment):
        if method == "post":
            assert client.post(url).status_code == 403, url
    assert client.post(reverse("experiment_create"), post_data(alice_dataset, action="create")).status_code == 403
    assert Experiment.objects.count() == 1


def test_it_renders_script_names_inert(alice_client, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset, name="<script>alert(1)</script>")
    for url in [reverse("home"), reverse("experiment_detail", args=[experiment.pk]),
                reverse("trial_detail", args=[experiment.trials.first().pk]),
                reverse("experiment_create") + f"?clone={experiment.pk}"]:
        page = alice_client.get(url).content.decode()
        assert "<script>alert(1)</script>" not in page, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, url


def test_it_previews_then_creates_and_launches(alice_client, alice_dataset, scheduler):
    preview = alice_client.post(reverse("experiment_create"), post_data(alice_dataset, action="preview"))
    assert preview.status_code == 200
    page = preview.content.decode()
    assert "Preview: 2 trials" in page and "Shards" in page
    assert not Experiment.objects.exists()
    response = alice_client.post(reverse("experiment_create"),
                                 post_data(alice_dataset, action="create", launch="1"))
    experiment = Experiment.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("experiment_detail", args=[experiment.pk])
    assert set(experiment.trials.values_list("status", flat=True)) == {"planning"}


def test_it_shows_field_errors_for_bad_input(alice_client, alice_dataset):
    data = post_data(alice_dataset, action="preview", rows=[{"name": "lr", "kind": "float", "low": "1",
                                                             "high": "0.1"}], strategy="random")
    response = alice_client.post(reverse("experiment_create"), data)
    assert response.status_code == 400
    assert "reversed" in response.content.decode()


def test_it_clones_an_experiment_into_the_form(alice_client, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset, name="first")
    page = alice_client.get(reverse("experiment_create") + f"?clone={experiment.pk}").content.decode()
    assert 'value="first (copy)"' in page
    assert 'value="0.001, 0.003"' in page


def test_it_downloads_the_search_space_with_the_model_so_that_pasting_it_gives_the_same_experiment(
        alice_client, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset, model={"kind": "preset", "preset": "llama-micro"},
                                 shape=PRESETS["llama-micro"][1], checkpoint_minutes=7)
    for fmt in ("yaml", "json"):
        text = alice_client.get(reverse("experiment_space", args=[experiment.pk, fmt])).content.decode()
        model, space = load_spec_text(text)
        assert model_from_spec(model) == experiment.model
        assert checkpoint_minutes_of_text(text) == 7
        assert space.to_dict() == experiment.search_space
    assert alice_client.get(reverse("experiment_space", args=[experiment.pk, "exe"])).status_code == 404


def test_a_downloaded_custom_size_reads_back_as_the_same_model():
    custom = {"kind": "custom", "family": "llama", "n_layer": 4, "n_embd": 128, "n_head": 4, "n_kv_head": 2,
              "n_positions": 512}
    assert model_from_spec(model_to_spec(custom)) == custom


def test_it_confirms_then_deletes_a_trial(alice_client, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    trial = experiment.trials.first()
    assert "Delete trial #1" in alice_client.get(reverse("trial_delete", args=[trial.pk])).content.decode()
    alice_client.post(reverse("trial_delete", args=[trial.pk]))
    assert experiment.trials.count() == 1


def exported_trial(experiment, data_dir):
    """The experiment's first trial as a finished attempt whose model the worker exported."""
    trial = experiment.trials.first()
    trial.queue_id, trial.attempt, trial.status = str(trial.pk), 1, Trial.Status.FINISHED
    export = data_dir / "exports" / trial.queue_id
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    trial.export_path = str(export)
    trial.save()
    return trial


def test_it_packs_a_model_for_download_outside_the_request(alice_client, alice_team, alice_dataset, data_dir):
    trial = exported_trial(make_experiment(alice_team, alice_dataset), data_dir)
    export_url = reverse("trial_export", args=[trial.pk])
    assert alice_client.get(export_url).status_code == 404  # nothing packed yet
    assert "Prepare model (.tar.gz)" in alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    response = alice_client.post(reverse("trial_archive", args=[trial.pk]), {"kind": "model"})
    assert response.status_code == 302
    assert response["Location"] == reverse("trial_detail", args=[trial.pk]) + "#downloads"
    # The request only recorded the wish (this test runs without a web worker): no archive was built in it.
    assert TrialArchive.objects.get().status == TrialArchive.Status.PREPARING
    assert not (data_dir / "archives").exists()
    page = alice_client.get(response["Location"]).content.decode()
    assert "Packing: 0%" in page and 'data-poll="' in page and "js/poll_cards.js" in page
    assert alice_client.get(export_url).status_code == 404


def test_it_refuses_to_pack_a_model_outside_the_exports_dir(alice_client, alice_team, alice_dataset, data_dir):
    trial = exported_trial(make_experiment(alice_team, alice_dataset), data_dir)
    trial.export_path = str(data_dir)  # outside exports/
    trial.save()
    page = alice_client.post(reverse("trial_archive", args=[trial.pk]), follow=True).content.decode()
    assert "has no exported model to download" in page
    assert not TrialArchive.objects.exists()


def test_the_web_worker_packs_the_model_and_the_page_links_it(alice, alice_team, alice_dataset, data_dir,
                                                              web_worker):
    client = Client()
    client.force_login(alice)
    trial = exported_trial(make_experiment(alice_team, alice_dataset), data_dir)
    client.post(reverse("trial_archive", args=[trial.pk]))
    web_worker.wait(lambda: TrialArchive.objects.get().status != TrialArchive.Status.PREPARING, 60, "the archive")
    assert TrialArchive.objects.get().status == TrialArchive.Status.READY, TrialArchive.objects.get().message
    page = client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    assert "Download model (.tar.gz)" in page and "data-poll" not in page
    response = client.get(reverse("trial_export", args=[trial.pk]) + "?kind=model")
    assert response.status_code == 200
    name = f"sweep-trial-1-id-{trial.pk}-model"
    assert response["Content-Disposition"] == f'attachment; filename="{name}.tar.gz"'
    with tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content)), mode="r:gz") as tar:
        assert f"{name}/config.json" in tar.getnames()


def test_a_download_asked_for_while_redis_is_down_is_packed_once_it_is_back(alice, alice_team, alice_dataset,
                                                                            data_dir, web_worker, settings):
    client = Client()
    client.force_login(alice)
    trial = exported_trial(make_experiment(alice_team, alice_dataset), data_dir)
    with redis_at(settings, CLOSED_PORT_URL):
        response = client.post(reverse("trial_archive", args=[trial.pk]))
        assert response.status_code == 302
        page = client.get(response["Location"]).content.decode()
    assert TrialArchive.objects.get().status == TrialArchive.Status.PREPARING
    assert "The background worker could not be reached (" in page and "Or press Prepare again." in page
    assert "Prepare model (.tar.gz)</button>" in page  # the button to try again, not the progress

    assert web_work_reconcile() == WebWorkReconciled(sent=1, failed=0)  # Redis is back: the ingest's pass

    web_worker.wait(lambda: TrialArchive.objects.get().status != TrialArchive.Status.PREPARING, 60, "the archive")
    assert TrialArchive.objects.get().status == TrialArchive.Status.READY, TrialArchive.objects.get().message
    assert client.get(reverse("trial_export", args=[trial.pk])).status_code == 200


def test_it_cancels_a_trial_not_yet_launched(alice_client, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    trial = experiment.trials.first()
    alice_client.post(reverse("trial_action", args=[trial.pk, "cancel"]))
    trial.refresh_from_db()
    assert trial.status == "cancelled"


def test_the_trial_page_shows_its_curves_and_its_parameters_with_the_defaults_that_applied(
        alice_client, alice_team, alice_dataset, data_dir, settings):
    trial = make_experiment(alice_team, alice_dataset).trials.order_by("number").first()
    trial.spec = {"data": {"tokens_path": str(data_dir / "tokens" / "ids.npy")}, "model": {"dropout": 0.1}}
    trial.save(update_fields=["spec"])
    page = alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()

    settings_list = page.split('id="trial-settings">')[1].split("</dl>")[0]
    assert '<dd data-parameter="lr">0.001</dd>' in settings_list  # as the space gave it
    assert '<dd data-parameter="batch_size">2</dd>' in settings_list
    assert ('<dd data-parameter="dropout" data-default>0.1 <span class="chip" title="Not in the search space: '
            "Hydra's default applied\">default</span></dd>") in settings_list
    assert 'data-parameter="momentum"' not in settings_list and 'data-parameter="lora_r"' not in settings_list
    assert "Engine spec" not in page and str(data_dir) not in page and str(settings.HYDRA.models_root) not in page

    figure = json.loads(page.split('id="curves-figure" type="application/json">')[1].split("</script>")[0])
    assert [t["meta"]["role"] for t in figure["data"]] == ["raw", "smooth", "eval"]
    state = json.loads(page.split('id="dashboard-state" type="application/json">')[1].split("</script>")[0])
    assert state["url"] == reverse("dashboard_trial_curves_data", args=[trial.pk])


def test_the_trial_page_adds_up_its_device_time_over_the_devices_its_micro_batches_ran_on(
        alice_client, alice_team, alice_dataset):
    """A trial whose micro-batches ran on two devices at once: each device's seconds and units, their sum, and the
    shorter wall time they took."""
    trial = make_experiment(alice_team, alice_dataset).trials.order_by("number").first()
    spans = [("cpu0", 0.0, 2.0), ("cpu1", 1.0, 2.0), ("cpu0", 2.0, 3.0), ("cpu1", 2.0, 3.0)]
    UnitSpan.objects.bulk_create(
        UnitSpan(trial=trial, host="h", entry_id=f"{n}-0", device=device, unit=n, step=0, micro_batch=n % 2,
                 phase="F", shard=0, start=start, end=end, bytes_moved=0, peak_bytes=0)
        for n, (device, start, end) in enumerate(spans))
    page = alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    shown = page.split('id="device-time">')[1].split("</dd>")[0]
    assert shown.startswith("5s on 2 devices: ")
    assert '<span data-device="cpu0">cpu0 3s (2 units)</span>' in shown
    assert '<span data-device="cpu1">cpu1 2s (2 units)</span>' in shown
    assert "over 3s" in shown
