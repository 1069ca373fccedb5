"""The Python client (`hydra_client.Hydra`) against a real server: what a script relies on."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hydra_client import Hydra, HydraError, HydraUnreachable
from hydra_client.connection import attachment_name
from tests.browser.devstack import free_port
from tests.client.conftest import make_token
from tests.webapp.datasets.factories import TINY_CORPUS, make_dataset
from tests.webapp.experiments.factories import make_experiment
from webapp.api.tokens import token_create, token_revoke

ROOT = Path(__file__).resolve().parents[2]
SPACE = "model: {preset: gpt2-micro}\nlr: {kind: categorical, values: [0.001, 0.003]}\nbatch_size: [2]\n"


def test_it_imports_no_server_code_torch_or_django() -> None:
    """The client runs on laptops that have none of the server's packages."""
    code = textwrap.dedent("""
        import sys
        BLOCKED = {"django", "webapp", "worker", "torch", "transformers", "celery", "redis"}

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError(f"{name} must not be imported by the client")
                return None

        sys.meta_path.insert(0, Blocker())
        import hydra_client, hydra_client.cli, hydra_client.watch
        from click.testing import CliRunner
        result = CliRunner().invoke(hydra_client.cli.cli, ["--help"])
        assert result.exit_code == 0, result.output
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr


def test_calls_act_in_the_tokens_team_and_read_its_objects(server, alice, alice_team, alice_token, db_lock) -> None:
    with db_lock:
        dataset = make_dataset(alice_team, name="tiny")
        experiment = make_experiment(alice_team, dataset)
    with Hydra(server, alice_token) as hydra:
        me = hydra.me()
        assert (me["username"], me["team"]["name"], me["scope"]) == ("alice", "Alice lab", "write")
        assert hydra.datasets.get(dataset.pk)["status"] == "ready"
        assert hydra.datasets.preview(dataset.pk)["kind"] == "corpus"
        assert [e["id"] for e in hydra.experiments.list()] == [experiment.pk]
        trials = hydra.experiments.trials(experiment.pk)
        assert [t["status"] for t in trials] == ["new", "new"]
        metrics = hydra.trials.metrics(trials[0]["id"])
        assert (metrics["steps"], metrics["evals"], metrics["next"]) == ([], [], -1)
        space = hydra.experiments.space(experiment.pk)
        assert space["lr"] == {"kind": "categorical", "values": [0.001, 0.003]}


def test_the_space_an_experiment_gives_back_makes_the_same_experiment(server, alice, alice_team, alice_token,
                                                                         db_lock) -> None:
    with db_lock:
        dataset = make_dataset(alice_team)
    with Hydra(server, alice_token) as hydra:
        first = hydra.experiments.create(SPACE, name="first", dataset=dataset.pk, budget=10, eval_every=5)
        again = hydra.experiments.create(hydra.experiments.space(first["id"]), name="again", dataset=dataset.pk,
                                         budget=10, eval_every=5)
        copy = hydra.experiments.clone(first["id"], name="copy", budget=20)
        params = [[t["params"] for t in hydra.experiments.trials(e["id"])] for e in (first, again, copy)]
    assert params[0] == params[1] == params[2] == [{"lr": 0.001, "batch_size": 2}, {"lr": 0.003, "batch_size": 2}]
    assert (copy["budget"], copy["cloned_from"], copy["name"]) == (20, first["id"], "copy")


def test_a_preview_plans_the_trials_without_making_them(server, alice, alice_team, alice_token, db_lock) -> None:
    with db_lock:
        dataset = make_dataset(alice_team)
    with Hydra(server, alice_token) as hydra:
        preview = hydra.experiments.preview(SPACE, name="planned", dataset=dataset.pk, budget=10,
                                            memory_budget_mib=256)
        assert hydra.experiments.list() == []
    assert (preview["status"], preview["budget_bytes"]) == ("ready", 256 << 20)
    assert [(t["number"], t["params"]["lr"], t["total_steps"]) for t in preview["trials"]] == [(1, 0.001, 10),
                                                                                              (2, 0.003, 10)]
    assert all(t["plan"]["peak_bytes"] <= 256 << 20 for t in preview["trials"])


def test_a_refused_call_raises_the_servers_detail_and_field_errors(server, alice, alice_team, alice_token,
                                                                   db_lock) -> None:
    with db_lock:
        dataset = make_dataset(alice_team)
    with Hydra(server, alice_token) as hydra, pytest.raises(HydraError) as refused:
        hydra.experiments.create("lr: {kind: categorical, values: []}", name="x", dataset=dataset.pk)
    assert refused.value.status == 400
    assert refused.value.errors == {"space": ["lr: list at least one value."]}
    assert "lr: list at least one value." in refused.value.detail


def test_pages_are_followed_to_the_last(server, alice, alice_team, alice_token, db_lock) -> None:
    with db_lock:
        made = [make_dataset(alice_team, name=f"corpus {i}", text=TINY_CORPUS[: 400 + i]).pk for i in range(5)]
    with Hydra(server, alice_token) as hydra:
        paged = [d["id"] for d in hydra.paginate("/datasets", page_size=2)]
        listed = [d["id"] for d in hydra.datasets.list()]
    assert paged == listed == made[::-1]  # newest first


def test_another_teams_objects_and_teams_are_not_found(server, alice, bob, bob_team, alice_token, db_lock) -> None:
    with db_lock:
        experiment = make_experiment(bob_team, make_dataset(bob_team))
    trial = experiment.trials.first()
    with Hydra(server, alice_token) as hydra:
        for call in (lambda: hydra.experiments.get(experiment.pk), lambda: hydra.datasets.get(experiment.dataset_id),
                     lambda: hydra.trials.pause(trial.pk)):
            with pytest.raises(HydraError) as missing:
                call()
            assert missing.value.status == 404
    with Hydra(server, alice_token, team=bob_team.pk) as in_bobs_team, pytest.raises(HydraError) as other_team:
        in_bobs_team.me()
    assert (other_team.value.status, other_team.value.detail) == (404, "No such team.")


def test_dead_and_read_only_tokens_are_refused(server, alice, db_lock) -> None:
    with db_lock:
        reader = make_token(alice, scope="read")
        token, revoked = token_create(user=alice, name="old laptop", scope="write", days=30)
        token_revoke(user=alice, token_id=token.pk)
    with Hydra(server, revoked) as hydra, pytest.raises(HydraError) as dead:
        hydra.me()
    assert dead.value.status == 401
    with Hydra(server, reader) as hydra:
        assert hydra.me()["scope"] == "read"
        with pytest.raises(HydraError) as read_only:
            hydra.datasets.sample()
    assert read_only.value.status == 403
    assert "may only read" in read_only.value.detail


def test_too_many_requests_answer_429_with_retry_after(server, alice, alice_token, settings) -> None:
    settings.HYDRA = dataclasses.replace(settings.HYDRA, api_rate_per_minute=1)
    with Hydra(server, alice_token, retries=0) as hydra, pytest.raises(HydraError) as throttled:
        for _ in range(3):  # a new minute may start between two calls, and count afresh
            hydra.me()
    assert throttled.value.status == 429
    assert 0 < throttled.value.retry_after <= 60


@pytest.fixture
def flaky_server() -> Iterator[tuple[str, list[str]]]:
    """A server that answers 429 with Retry-After: 0 to every second request, and a JSON document otherwise.

    The real server's Retry-After is the rest of the clock's minute (up to 60 s): too long to wait for in a
    test, so this stands in for it to show that the client waits and tries again."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            throttled = len(seen) % 2 == 1
            body = json.dumps({"detail": "Too many requests.", "errors": {}} if throttled else {"ok": True})
            self.send_response(429 if throttled else 200)
            if throttled:
                self.send_header("Retry-After", "0")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


def test_a_throttled_call_waits_and_tries_again(flaky_server) -> None:
    url, seen = flaky_server
    assert Hydra(url, "hyd_x").me() == {"ok": True}
    assert seen == ["/api/v1/me", "/api/v1/me"]
    with pytest.raises(HydraError) as throttled:
        Hydra(url, "hyd_x", retries=0).me()
    assert (throttled.value.status, throttled.value.retry_after) == (429, 0)


def test_a_server_out_of_reach_raises_unreachable() -> None:
    with pytest.raises(HydraUnreachable) as unreachable:
        Hydra(f"http://127.0.0.1:{free_port()}", "hyd_x").me()
    assert "Connection refused" in unreachable.value.detail


def test_a_url_without_a_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="http://host:port"):
        Hydra("hydra.example.org", "hyd_x")


@pytest.mark.parametrize(("header", "name"), [
    ('attachment; filename="sweep-trial-3.tar.gz"', "sweep-trial-3.tar.gz"),
    ("attachment; filename*=UTF-8''d%C3%A9j%C3%A0-vu-trial-1.tar.gz", "déjà-vu-trial-1.tar.gz"),
    ('attachment; filename="../../.bashrc"', ".bashrc"),
    ('attachment; filename="..\\\\..\\\\evil.tar.gz"', "evil.tar.gz"),
    ('attachment; filename=".."', "trial-7.tar.gz"),
    ("", "trial-7.tar.gz"),
])
def test_a_download_keeps_to_its_folder(header: str, name: str) -> None:
    """The server names the file; the name never leads outside the folder the user chose."""
    assert attachment_name(header, "trial-7.tar.gz") == name
