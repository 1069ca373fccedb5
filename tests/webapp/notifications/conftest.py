"""A local webhook receiver, the allowlist and retry settings, teams' launched experiments and a real web
worker that delivers, for the notification tests."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.webapp.datasets.factories import make_dataset, use_data_dir
from tests.webapp.experiments.conftest import scheduler  # noqa: F401 -- a fixture
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.web_worker import WebWorker
from webapp.allowlist import allowlist_parse
from webapp.background.reconcile import web_work_reconcile
from webapp.experiments import services
from webapp.ground.models import Experiment, Trial
from webapp.notifications.models import Delivery

RETRY_S = (0.2, 0.2, 0.2)  # tiny back-off: four tries in all


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class Receiver:
    """An HTTP server on 127.0.0.1 that records each POST and answers the next of `statuses` (200 once they
    run out); while `hang` is set it holds each request that long before answering."""

    url: str
    port: int
    received: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    redirect_to: str = ""
    hang_s: float = 0.0
    answered: int = 0
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def allowed(self) -> str:
        """The allowlist entry that lets webhooks reach this server: the loopback, on its port."""
        return f"127.0.0.1:{self.port}"

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"received {len(self.received)} requests, not {count}"
            time.sleep(0.05)
        return self.received


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.received.append(Received(self.path, dict(self.headers.items()), body))
            if state.hang_s:
                state.release.wait(state.hang_s)
            status = state.statuses.pop(0) if state.statuses else 200
            self.send_response(status)
            if state.redirect_to:
                self.send_header("Location", state.redirect_to)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            state.answered += 1

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.block_on_close = False
    port = server.server_address[1]
    state = Receiver(url=f"http://127.0.0.1:{port}/hooks/hydra?team=a", port=port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()


def notify_settings(settings, *, allowed: str = "127.0.0.1", retry_s: tuple[float, ...] = RETRY_S) -> None:
    """The web app's settings as if HYDRA_WEBHOOK_ALLOWED_HOSTS=`allowed` and the retry waits `retry_s`."""
    notify = dataclasses.replace(settings.HYDRA.notify, webhook_allowlist=allowlist_parse(allowed), retry_s=retry_s)
    settings.HYDRA = dataclasses.replace(settings.HYDRA, notify=notify)


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    use_data_dir(settings, tmp_path)
    return tmp_path


@pytest.fixture
def loopback_allowed(settings, receiver) -> None:
    notify_settings(settings, allowed=receiver.allowed)


@pytest.fixture
def alice_dataset(alice_team):
    return make_dataset(alice_team, name="alice corpus")


@pytest.fixture
def bob_dataset(bob_team):
    return make_dataset(bob_team, name="bob corpus")


@pytest.fixture
def launched(scheduler, django_capture_on_commit_callbacks) -> Callable[..., Experiment]:  # noqa: F811
    """An experiment of `team` (two trials by default), launched through the real services into the test's own
    queue, each trial waiting to be planned."""

    def launch(team, dataset, **fields) -> Experiment:
        experiment = make_experiment(team, dataset, **fields)
        with django_capture_on_commit_callbacks(execute=True):
            services.experiment_launch(experiment=experiment, actor=team.memberships.get().user)
        assert all(t.queue_id for t in experiment.trials.all())
        return experiment

    return launch


def trials_of(experiment: Experiment) -> list[Trial]:
    return list(experiment.trials.order_by("number"))


@pytest.fixture
def notify_worker(request, monkeypatch, settings, receiver) -> WebWorker:
    """A real web worker (`manage.py hydra_web_worker`) that may reach the receiver and retries after RETRY_S,
    with this test's settings saying the same."""
    monkeypatch.setenv("HYDRA_WEBHOOK_ALLOWED_HOSTS", receiver.allowed)
    monkeypatch.setenv("HYDRA_NOTIFY_RETRY_SECONDS", ",".join(map(str, RETRY_S)))
    worker: WebWorker = request.getfixturevalue("web_worker")
    notify_settings(settings, allowed=receiver.allowed)
    return worker


def delivered(delivery: Delivery, *, worker: WebWorker | None = None, timeout_s: float = 30.0) -> Delivery:
    """`delivery` once it is no longer pending, running the pass that sends due retries meanwhile (as the
    telemetry ingest does every second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        delivery.refresh_from_db()
        if delivery.status != Delivery.Status.PENDING:
            return delivery
        log = worker.log() if worker is not None else ""
        assert time.monotonic() < deadline, f"delivery still pending: {delivery.message}\n{log}"
        web_work_reconcile()
        time.sleep(0.1)
