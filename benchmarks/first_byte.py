"""How long the pages a new user opens first take to start answering on `make run`'s own web server, and how
many bytes the curves page's Plotly costs.

`make run` serves with Django's development server (``runserver --noreload``, DEBUG on, SQLite under the data
folder). This script starts `make run`'s services as it starts them (`scripts/devstack.py`'s `stack_services`:
the web server, a device worker, the ingest, the web worker) on a throw-away data folder with a demo user, a
dataset, a catalog checkpoint and an experiment with a trained trial, against the Redis of ``REDIS_URL`` (the
workers' default without it) under a throw-away host id, with `--busy` processes that keep the cores busy at the
device workers' CPU priority, as training does. It then times, on each of `--starts` fresh stacks, what a new
user does: the login page, the login itself (the POST), then the first load of each page (the catalog, the new
experiment form, the lab queue, the trial's page, the learning curves), and `--repeat` loads more of each
(warm). Each figure is the time to the response's first byte (its status line and headers), over one
kept-alive connection. The curves page's Plotly script is fetched as a browser would (``Accept-Encoding:
gzip``), and its bytes on the wire are compared with the full plotly.js bundle (plotly.min.js).

The last line is one JSON object: ``{"starts", "busy", "pages": {name: {"first_ms", "warm_p50_ms"}}, "login_ms",
"password_check_ms", "slowest_first_ms", "plotly_bytes_sent", "plotly_full_bytes", "plotly_ratio",
"target_met"}``, the first loads and the login being medians over the starts. Target: every page's first load
under 300 ms. The login is reported beside it with what checking one password costs alone (Django's PBKDF2
hasher, timed in the seeding process, nothing else running): most of a login is that deliberate cost.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.gunicorn_server import free_port  # noqa: E402 -- Django-free

TARGET_MS = 300
# The full plotly.js bundle as its npm and Python packages ship it (4,851,164 bytes for plotly.js 3.7.0): what
# the curves page sent before it served a bundle of the traces it draws.
FULL_PLOTLY_BYTES = 4_851_164


def environment(data_dir: Path) -> dict[str, str]:
    """`make run`'s environment on a throw-away data folder: DEBUG on, SQLite, the caller's Redis."""
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env.update(HYDRA_DATA_DIR=str(data_dir), DEBUG="1", DJANGO_SETTINGS_MODULE="webapp.settings",
               SECRET_KEY=secrets.token_urlsafe(48), HYDRA_DEVICES="cpu:1",
               HYDRA_HOST_ID=f"bench-first-byte-{os.getpid()}", HYDRA_SPILL_DIR=str(data_dir / "spill"))
    return env


def seed(env: dict[str, str]) -> dict[str, str]:
    """Migrate, make the demo user and a lab to look at (in a child process: this one stays Django-free);
    the paths of the pages to load, and the demo password."""
    out = subprocess.run([sys.executable, __file__, "--seed"], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def seed_lab() -> None:
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.hashers import check_password, make_password
    from django.core.management import call_command
    from django.urls import reverse
    from django.utils import timezone

    from webapp.accounts.management.commands.hydra_demo import DEMO_USERNAME
    from webapp.accounts.models import Membership
    from webapp.catalog.models import Checkpoint
    from webapp.datasets.models import Dataset
    from webapp.ground.models import Experiment, Trial
    from webapp.telemetry.models import EvalMetric, StepMetric

    call_command("migrate", verbosity=0)
    call_command("hydra_demo", stdout=open(os.devnull, "w"))  # noqa: SIM115 -- closed with the process
    username, password = (settings.HYDRA.data_dir / "demo-login.txt").read_text().split()
    team = Membership.objects.get(user__username=DEMO_USERNAME).team
    dataset = Dataset.objects.create(team=team, name="sample corpus", source=Dataset.Source.SAMPLE, vocab_size=512,
                                     val_fraction=0.1, n_bytes=100_000, n_tokens=30_000, fingerprint="f" * 64,
                                     storage_key="first-byte", status=Dataset.Status.READY)
    Checkpoint.objects.create(name="SmolLM2-135M-Instruct", path="smollm2-135m-instruct",
                              source=Checkpoint.Source.SMOLLM2, status=Checkpoint.Status.READY, family="llama",
                              n_params=134_515_008, context_length=8192, vocab_size=49_152,
                              largest_layer_params=28_311_552)
    experiment = Experiment.objects.create(
        team=team, name="lr sweep", dataset=dataset, model={"kind": "preset", "preset": "gpt2-micro"},
        search_space={"lr": {"kind": "logfloat", "low": 1e-4, "high": 1e-2}}, strategy=Experiment.Strategy.GRID,
        n_trials=1, budget=200, eval_every=20, launched=timezone.now())
    plan = {"source": "measured", "shards": [{"index": 0, "layers": ["embed", "block.0"], "state_bytes": 8 << 20}],
            "peak_bytes": 48 << 20, "budget_bytes": 256 << 20, "state_bytes": 16 << 20}
    trial = Trial.objects.create(experiment=experiment, number=1, params={"lr": 1e-3}, status=Trial.Status.FINISHED,
                                 attempt=1, queue_id="1", step=200, total_steps=200, best_val_loss=2.5,
                                 best_val_ppl=12.2, plan=plan, started=timezone.now(), finished=timezone.now())
    start = time.time() - 600
    StepMetric.objects.bulk_create(StepMetric(trial=trial, attempt=1, step=s, loss=5 - s / 100, lr=1e-3,
                                              tokens=(s + 1) * 1024, time=start + s) for s in range(200))
    EvalMetric.objects.bulk_create(EvalMetric(trial=trial, attempt=1, step=s, loss=5.1 - s / 100,
                                              perplexity=2.7 ** (5.1 - s / 100), time=start + s)
                                   for s in range(19, 200, 20))
    pages = {"catalog": reverse("catalog_list"), "new_experiment": reverse("experiment_create"),
             "queue": reverse("lab_queue"), "trial": reverse("trial_detail", args=[trial.pk]),
             "curves": reverse("dashboard_curves", args=[experiment.pk])}
    hashed = make_password(password)
    checks = []
    for _ in range(3):
        started = time.perf_counter()
        check_password(password, hashed)
        checks.append((time.perf_counter() - started) * 1000)
    print(json.dumps({"pages": pages, "login": reverse("login"), "username": username, "password": password,
                      "password_check_ms": round(statistics.median(checks), 1)}))


def start_stack(env: dict[str, str], port: int, busy: int) -> list[subprocess.Popen[bytes]]:
    """The processes `make run` starts (the web server, a worker per device, the ingest, the web worker), as it
    starts them, once the web server listens and the device loops survey their queue; and `busy` processes
    that keep a core busy each at the device workers' CPU priority, as training on every core does."""
    from scripts.devstack import stack_services
    from worker import api
    from worker.config import load

    services = stack_services("127.0.0.1", port, env)
    processes = [subprocess.Popen(list(s.command), env=dict(s.env or env), cwd=s.cwd, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, preexec_fn=_nice(s.niceness))
                 for s in services]
    workers = [p for p, s in zip(processes, services, strict=True) if s.name.startswith("worker")]
    config = load(env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            stop(processes)
            raise SystemExit("a process of the stack exited")
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            if len(api.live_workers(config=config)) >= len(workers):
                break
        except OSError:
            pass
        time.sleep(0.2)
    else:
        stop(processes)
        raise SystemExit("the stack did not come up within 180 s")
    niceness = os.getpriority(os.PRIO_PROCESS, workers[0].pid) if workers else 0
    return processes + [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_nice(niceness))
                        for _ in range(busy)]


def _nice(niceness: int) -> Any:
    return (lambda: os.nice(niceness)) if niceness else None


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Browser:
    """One kept-alive connection with a cookie jar: enough of a browser to log in and load pages."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, body: str | None = None,
                headers: dict[str, str] | None = None) -> tuple[float, http.client.HTTPResponse, bytes]:
        """Milliseconds to the first byte, the response and its body."""
        sent = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items()), **(headers or {})}
        if body is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        start = time.perf_counter()
        self.connection.request(method, path, body=body, headers=sent)
        response = self.connection.getresponse()  # returns once the status line and headers are read
        first = (time.perf_counter() - start) * 1000
        content = response.read()
        for header in response.headers.get_all("Set-Cookie") or []:
            name, _, rest = header.partition("=")
            self.cookies[name.strip()] = rest.split(";", 1)[0]
        return first, response, content

    def get(self, path: str, status: int = 200, headers: dict[str, str] | None = None) -> tuple[float, bytes, str]:
        first, response, content = self.request("GET", path, headers=headers)
        if response.status != status:
            raise SystemExit(f"GET {path}: HTTP {response.status}, not {status}")
        return first, content, response.headers.get("Content-Encoding", "")


def one_start(env: dict[str, str], lab: dict[str, str], repeat: int, busy: int) -> dict[str, object]:
    port = free_port()
    processes = start_stack(env, port, busy)
    try:
        browser = Browser(port)
        login_page_ms, page, _ = browser.get(lab["login"])
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token is not None, "no CSRF token on the login page"
        body = urlencode({"csrfmiddlewaretoken": token.group(1).decode(), "username": lab["username"],
                          "password": lab["password"]})
        login_ms, response, _ = browser.request("POST", lab["login"], body=body,
                                                headers={"Referer": f"http://127.0.0.1:{port}{lab['login']}"})
        if response.status != 302:
            raise SystemExit(f"logging in answered HTTP {response.status}, not a redirect")
        first = {name: browser.get(path)[0] for name, path in lab["pages"].items()}
        warm = {name: statistics.median(browser.get(path)[0] for _ in range(repeat))
                for name, path in lab["pages"].items()}
        curves = browser.get(lab["pages"]["curves"])[1].decode()
        script = re.search(r'<script src="([^"]*plotly[^"]*)"', curves)
        assert script is not None, "no Plotly script on the curves page"
        _, content, encoding = browser.get(script.group(1), headers={"Accept-Encoding": "gzip"})
        return {"login_page_ms": login_page_ms, "login_ms": login_ms, "first": first, "warm": warm,
                "plotly_path": script.group(1), "plotly_bytes_sent": len(content), "plotly_encoding": encoding}
    finally:
        stop(processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5, help="fresh servers, each loading every page once first")
    parser.add_argument("--repeat", type=int, default=10, help="warm loads of each page per start")
    parser.add_argument("--busy", type=int, default=2, help="processes keeping a core busy each, as training does")
    parser.add_argument("--quick", action="store_true", help="2 starts, 5 warm loads")
    parser.add_argument("--seed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed:
        seed_lab()
        return
    if args.quick:
        args.starts, args.repeat = 2, 5
    data_dir = Path(tempfile.mkdtemp(prefix="hydra-first-byte-"))
    try:
        env = environment(data_dir)
        lab = seed(env)
        runs = []
        for n in range(args.starts):
            runs.append(one_start(env, lab, args.repeat, args.busy))
            print(f"start {n + 1}: login {runs[-1]['login_ms']:.0f} ms; first loads " + ", ".join(
                f"{name} {ms:.0f}" for name, ms in runs[-1]["first"].items()) + " ms", flush=True)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    pages = {name: {"first_ms": round(statistics.median(r["first"][name] for r in runs), 1),
                    "warm_p50_ms": round(statistics.median(r["warm"][name] for r in runs), 1)}
             for name in lab["pages"]}
    login_ms = round(statistics.median(r["login_ms"] for r in runs), 1)
    slowest = max(p["first_ms"] for p in pages.values())
    sent = runs[-1]["plotly_bytes_sent"]
    print(f"Plotly: {runs[-1]['plotly_path']}, {sent} bytes sent "
          f"({runs[-1]['plotly_encoding'] or 'uncompressed'}) against {FULL_PLOTLY_BYTES} for the full bundle")
    print(json.dumps({"starts": args.starts, "busy": args.busy, "pages": pages, "login_ms": login_ms,
                      "password_check_ms": lab["password_check_ms"], "slowest_first_ms": slowest,
                      "plotly_bytes_sent": sent, "plotly_full_bytes": FULL_PLOTLY_BYTES,
                      "plotly_ratio": round(sent / FULL_PLOTLY_BYTES, 3), "target_met": slowest < TARGET_MS}))


if __name__ == "__main__":
    main()
