"""The health pages ask the real database, the real Redis and real Celery workers; only staff see the details."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from tests.conftest import PASSWORD
from tests.webapp.datasets.factories import use_data_dir
from webapp import queue_client
from webapp.health import service_events
from webapp.health.selectors import health_report
from worker.scheduling.keys import HOSTS_KEY

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path) -> Path:
    """A data folder of the test's own: make run's service events of this checkout are not the test's."""
    use_data_dir(settings, tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def no_cached_workers():
    """Each test asks the workers afresh, whatever an earlier test left in the cache."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def staff_client(django_user_model) -> Client:
    client = Client()
    client.force_login(django_user_model.objects.create_user(username="oscar", password=PASSWORD, is_staff=True))
    return client


@pytest.fixture
def cpu_worker(redis_url, tmp_path):
    """One real device worker (cpu:0) started the way a process manager would, against the real broker."""
    env = {**os.environ, "REDIS_URL": redis_url, "DEBUG": "1", "HYDRA_HOST_ID": "healthcheck",
           "HYDRA_DEVICES": "cpu:1", "HYDRA_DATA_DIR": str(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "-m", "worker.launch", "--device", "cpu:0", "--loglevel", "WARNING"],
        env=env, cwd=ROOT, start_new_session=True,
    )
    yield process
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    redis.Redis.from_url(redis_url).zrem(HOSTS_KEY, "healthcheck")  # the lab no longer has this host


def test_it_reports_database_redis_and_a_worker_with_its_device(cpu_worker, staff_client):
    deadline = time.monotonic() + 90
    workers = []
    while time.monotonic() < deadline:
        workers = [w for w in health_report().workers if w.name == "cpu0@healthcheck"]
        if workers:
            break
        assert cpu_worker.poll() is None, "the worker exited"
        time.sleep(1)
    assert workers, "the worker never answered the broadcast"
    assert workers[0].device == "cpu:0" and workers[0].pid == cpu_worker.pid

    response = staff_client.get(reverse("health_json"))
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] and body["database"]["ok"] and body["redis"]["ok"]
    assert {"name": "cpu0@healthcheck", "device": "cpu:0", "host": "healthcheck", "pid": cpu_worker.pid} in body[
        "workers"
    ]
    page = staff_client.get(reverse("health")).content.decode()
    assert "cpu0@healthcheck" in page and "cpu:0" in page


def test_it_reports_redis_down_with_status_503(settings, client, staff_client):
    settings.HYDRA = dataclasses.replace(
        settings.HYDRA, worker=dataclasses.replace(settings.HYDRA.worker, redis_url="redis://:secret@127.0.0.1:1/0"))
    status = client.get("/health")
    assert (status.status_code, status.content) == (503, b"down\n")
    response = staff_client.get(reverse("health_json"))
    assert response.status_code == 503
    body = response.json()
    assert body["database"]["ok"] and not body["redis"]["ok"]
    assert "secret" not in body["redis"]["detail"]
    assert body["workers"] == []
    assert staff_client.get(reverse("health")).status_code == 503


def test_it_tells_anyone_only_up_or_down(client):
    response = client.get("/health")
    assert (response.status_code, response.content) == (200, b"up\n")
    assert response["Content-Type"].startswith("text/plain")


def test_it_sends_anonymous_visitors_of_the_details_to_the_login_page(client):
    for name in ("health", "health_json"):
        response = client.get(reverse(name))
        assert response.status_code == 302 and response["Location"].startswith(reverse("login")), name


def test_it_refuses_the_details_to_users_who_are_not_staff(alice_client):
    for name in ("health", "health_json"):
        response = alice_client.get(reverse(name))
        assert response.status_code == 403, name
        assert b"redis" not in response.content.lower(), name
    assert b'href="/health/"' not in alice_client.get(reverse("team_list")).content


def test_it_shows_the_details_to_staff(staff_client):
    body = staff_client.get(reverse("health_json")).json()
    assert body["ok"] and body["database"]["detail"] in {"postgresql", "sqlite"}
    assert body["redis"]["detail"].startswith("redis ")
    page = staff_client.get(reverse("health")).content.decode()
    assert "Workers online" in page and body["redis"]["detail"] in page
    assert 'href="/health/"' in staff_client.get(reverse("team_list")).content.decode()


def test_make_runs_demo_user_of_a_new_lab_is_its_staff_and_reads_the_details(django_user_model):
    call_command("hydra_demo", stdout=io.StringIO())
    demo = django_user_model.objects.get(username="demo")
    assert demo.is_staff and not demo.is_superuser
    client = Client()
    client.force_login(demo)
    assert client.get(reverse("health")).status_code == 200
    assert 'href="/health/"' in client.get(reverse("team_list")).content.decode()


def test_a_demo_user_made_in_a_lab_that_has_users_is_not_staff(alice, django_user_model):
    call_command("hydra_demo", stdout=io.StringIO())
    demo = django_user_model.objects.get(username="demo")
    assert not demo.is_staff
    client = Client()
    client.force_login(demo)
    assert client.get(reverse("health")).status_code == 403


def test_it_broadcasts_to_the_workers_once_for_two_quick_requests(staff_client, monkeypatch):
    broadcasts = []
    broadcast = queue_client.workers_online

    def counted(**kwargs: bool) -> list[dict[str, object]]:
        broadcasts.append(1)
        return broadcast(**kwargs)

    monkeypatch.setattr(queue_client, "workers_online", counted)
    assert staff_client.get(reverse("health_json")).status_code == 200
    assert staff_client.get(reverse("health")).status_code == 200
    assert len(broadcasts) == 1
    assert staff_client.get("/health").status_code == 200  # the up/down answer asks no worker
    assert len(broadcasts) == 1


RUN_STARTED = datetime(2026, 3, 2, 11, 0, 0, tzinfo=UTC)


def record(data_dir: Path, *events: dict[str, object]) -> None:
    """Append `events` as make run's supervisor does, a second apart from RUN_STARTED."""
    for offset, event in enumerate(events):
        service_events.event_append(data_dir, event, now=RUN_STARTED + timedelta(seconds=offset))


STARTED = {"event": "started", "services": ["redis-server", "web server", "worker cpu0", "ingest", "web worker"]}


def exited(service: str, code: int, restart: int, **fields: object) -> dict[str, object]:
    return {"event": "exited", "service": service, "code": code, "uptime_s": 42.0, "restart": restart,
            "delay_s": 1.0, "failures_in_row": 1, "failing": False, **fields}


def test_anyone_reads_which_service_exited_and_was_restarted_staff_read_every_exit(data_dir, client, staff_client):
    record(data_dir, STARTED, exited("worker cpu0", -9, 1),
           {"event": "restarted", "service": "worker cpu0", "restart": 1, "pid": 4321},
           exited("redis-server", -9, 1), {"event": "restarted", "service": "redis-server", "restart": 1, "pid": 99})
    response = client.get("/health")
    assert response.status_code == 200
    assert response.content.decode() == (
        "up\nredis-server exited with -9 (SIGKILL) at 11:00:03, restarted (1st restart); 2 exits since make run "
        "started\n")
    body = staff_client.get(reverse("health_json")).json()
    assert body["service_events"] == [
        "redis-server exited with -9 (SIGKILL) at 11:00:03, restarted (1st restart)",
        "worker cpu0 exited with -9 (SIGKILL) at 11:00:01, restarted (1st restart)",
    ]
    page = staff_client.get(reverse("health")).content.decode()
    assert "worker cpu0 exited with -9 (SIGKILL) at 11:00:01, restarted (1st restart)" in page


def test_a_service_down_now_comes_first_and_a_failing_one_says_so(data_dir, client):
    record(data_dir, STARTED, exited("worker cpu0", -9, 1),
           {"event": "restarted", "service": "worker cpu0", "restart": 1, "pid": 4321},
           exited("ingest", 1, 5, delay_s=30.0, failures_in_row=5, failing=True))
    assert client.get("/health").content.decode() == (
        "up\ningest exited with 1 at 11:00:03: FAILING, 5 exits in a row within a minute of starting; next try in "
        "30 s (see make run's output)\n")
    record(data_dir, {"event": "restarted", "service": "ingest", "restart": 5, "pid": 77})
    assert client.get("/health").content.decode().splitlines()[1].startswith(
        "ingest exited with 1 at 11:00:03, restarted (5th restart)")


def test_exits_of_a_make_run_that_stopped_are_not_reported_and_a_torn_line_is_skipped(data_dir, client):
    record(data_dir, STARTED, exited("redis-server", -9, 1), {"event": "stopped"})
    assert client.get("/health").content == b"up\n"
    record(data_dir, STARTED)
    with service_events.events_path(data_dir).open("a") as file:
        file.write('{"at": "2026-03-02T11:00:09+00:00", "event": "exi')  # a write cut short
    record(data_dir, exited("web worker", -15, 1))
    assert client.get("/health").content.decode() == (
        "up\nweb worker exited with -15 (SIGTERM) at 11:00:00; restarting in 1 s (1st restart)\n")


def test_the_event_file_keeps_only_the_latest_events(data_dir):
    for restart in range(1, service_events.MAX_LINES + 2):
        service_events.event_append(data_dir, exited("ingest", 1, restart))
    lines = service_events.events_path(data_dir).read_text().splitlines()
    assert len(lines) == service_events.KEEP_LINES
    assert [e.restart for e in service_events.events_read(data_dir, limit=2)] == [
        service_events.MAX_LINES, service_events.MAX_LINES + 1]


def shared_base(spill_dir: Path, key: str, *, size: int, trials: list[str]) -> None:
    """A shared base as the engine leaves it on the host: its index and one reference file per trial."""
    root = spill_dir / ".bases" / key
    (root / "refs").mkdir(parents=True)
    (root / "index.json").write_text(json.dumps({"files": {"model.embed_tokens.weight": "layer-0.safetensors"},
                                                 "bytes": size}))
    for trial in trials:
        (root / "refs" / trial).touch()


def test_staff_see_the_hosts_shared_bases_with_only_their_teams_trials_named(
        settings, alice, alice_team, bob_team, client):
    from tests.webapp.telemetry.factories import make_experiment

    alice.is_staff = True
    alice.save()
    client.force_login(alice)
    (mine,) = make_experiment(alice_team, name="alice lora sweep").trials.all()
    (theirs,) = make_experiment(bob_team, name="bob secret sweep").trials.all()
    spill = settings.HYDRA.worker.spill_dir
    key, other = "3f9a" * 8, "77aa" * 8
    # Alice's trial, on its second attempt too; Bob's second attempt; a deleted trial's reference.
    shared_base(spill, key, size=5 * 2**30, trials=[str(mine.pk), f"{mine.pk}.2", f"{theirs.pk}.2", "999999999"])
    shared_base(spill, other, size=300 * 2**20, trials=[str(theirs.pk)])
    building = spill / ".bases" / f".{'0' * 32}.building"  # a base being written is not one yet
    building.mkdir()
    (building / "index.json").write_text(json.dumps({"files": {}, "bytes": 1}))

    page = client.get(reverse("health")).content.decode()
    section = page.split('id="health-shared-bases"')[1].split("</section>")[0]
    assert "Shared LoRA bases (2): 5.3\xa0GB of host memory" in section
    assert f'<code title="{key}">{key[:12]}</code>' in section and "5.0\xa0GB" in section
    assert f'<code title="{other}">{other[:12]}</code>' in section and "300.0\xa0MB" in section
    url = reverse("trial_detail", args=[mine.pk])
    assert (f'<a href="{url}">alice lora sweep #1</a>, <a href="{url}">alice lora sweep #1 (attempt 2)</a>; '
            "1 trial of other teams; 1 no longer in the database") in section
    assert "1 trial of other teams</td>" in section  # the other base: Bob's trial alone, counted
    assert "bob secret sweep" not in page and reverse("trial_detail", args=[theirs.pk]) not in page

    body = client.get(reverse("health_json")).json()["shared_bases"]
    assert body["total_bytes"] == 5 * 2**30 + 300 * 2**20
    assert [(b["key"], b["other_teams"], b["unknown"], len(b["trials"])) for b in body["bases"]] == [
        (key, 1, 1, 2), (other, 1, 0, 0)]
    assert "bob secret sweep" not in json.dumps(body)


def test_a_host_without_shared_bases_says_so(staff_client):
    page = staff_client.get(reverse("health")).content.decode()
    assert "Shared LoRA bases (0): 0\xa0bytes of host memory" in page
    assert "None: no LoRA trial holds a base on this host." in page


def test_a_damaged_base_index_is_reported_not_a_server_error(settings, staff_client):
    shared_base(settings.HYDRA.worker.spill_dir, "ab" * 16, size=1, trials=[])
    (settings.HYDRA.worker.spill_dir / ".bases" / ("ab" * 16) / "index.json").write_text("{not json")
    response = staff_client.get(reverse("health"))
    assert response.status_code == 200
    assert "the shared bases in" in response.content.decode() and "cannot be read" in response.content.decode()
