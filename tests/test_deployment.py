"""docker-compose.yml describes a lab GPU server: it validates, keeps plain HTTP and default passwords off the
network and has one pinned worker per GPU; production settings pass Django's deployment checklist."""

from __future__ import annotations

import gzip
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.conf import settings

ROOT = Path(__file__).resolve().parents[1]


def compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


COMPOSE_ENV = {"SECRET_KEY": "x" * 40, "POSTGRES_PASSWORD": "p" * 24, "HYDRA_HOSTNAME": "hydra.lab.example"}
WORKER_HOST_ENV = {"HYDRA_REDIS_URL": "redis://10.0.0.1:6379/0", "HYDRA_HOST_ID": "gpuserver2",
                   "HYDRA_DATA_NFS_ADDR": "10.0.0.1"}


def compose_config(tmp_path: Path, environ: dict[str, str],
                   file: str = "docker-compose.yml") -> subprocess.CompletedProcess[str]:
    """`compose config` of `file` with exactly `environ` for compose's variables (an empty .env, none
    inherited)."""
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed (.ci/run installs docker-compose)")
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    inherited = {key: value for key, value in os.environ.items() if key not in COMPOSE_ENV | WORKER_HOST_ENV}
    return subprocess.run(
        [*command, "-f", file, "--env-file", str(env_file), "config", "-q"], cwd=ROOT,
        env={**inherited, **environ}, capture_output=True, text=True,
    )


def test_it_passes_docker_compose_config(tmp_path):
    result = compose_config(tmp_path, COMPOSE_ENV)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("missing", sorted(COMPOSE_ENV))
def test_it_refuses_to_start_without_a_secret_or_the_host_name(tmp_path, missing):
    result = compose_config(tmp_path, {key: value for key, value in COMPOSE_ENV.items() if key != missing})
    assert result.returncode != 0
    assert f"set {missing}" in result.stderr


def test_a_further_lab_server_runs_workers_only_against_the_first_one_s_redis_and_data(tmp_path):
    assert compose_config(tmp_path, WORKER_HOST_ENV, "docker-compose.worker.yml").returncode == 0
    for missing in sorted(WORKER_HOST_ENV):
        result = compose_config(tmp_path, {k: v for k, v in WORKER_HOST_ENV.items() if k != missing},
                                "docker-compose.worker.yml")
        assert result.returncode != 0 and f"set {missing}" in result.stderr, missing
    spec = yaml.safe_load((ROOT / "docker-compose.worker.yml").read_text())
    assert all(name.startswith("worker-gpu") for name in spec["services"])  # no web, database or Redis here
    assert not any(service.get("ports") for service in spec["services"].values())
    assert spec["volumes"]["hydra-data"]["driver_opts"]["type"] == "nfs"
    assert spec["volumes"]["hydra-spill"]["driver_opts"]["type"] == "tmpfs"
    # the spill files' whole 2 MiB extents in huge pages: a unit's new buffer versions cost less to write
    assert "huge=within_size" in spec["volumes"]["hydra-spill"]["driver_opts"]["o"].split(",")


def test_it_publishes_plain_http_to_this_host_only():
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    published = [port for service in spec["services"].values() for port in service.get("ports", [])]
    assert published == ["127.0.0.1:8000:8000"]


def test_its_redis_keeps_an_append_only_file_and_every_service_restarts():
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = spec["services"]["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert {name: service.get("restart") for name, service in spec["services"].items()} == {
        name: "unless-stopped" for name in spec["services"]}


def production_environ(tmp_path: Path) -> dict[str, str]:
    """What a production server sets: no DEBUG, a real secret, its host name (HTTPS is on by default)."""
    return {
        "PATH": os.environ["PATH"], "DEBUG": "0", "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "hydra.lab.example", "HYDRA_DATA_DIR": str(tmp_path),
    }


def deploy_check(environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=environ, capture_output=True, text=True,
    )


def test_it_passes_the_deployment_checklist_with_production_settings(tmp_path):
    result = deploy_check(production_environ(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_fails_the_deployment_checklist_when_https_is_turned_off(tmp_path):
    result = deploy_check({**production_environ(tmp_path), "HYDRA_HTTPS": "0"})
    assert result.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in result.stderr, check


def collectstatic(environ: dict[str, str]) -> None:
    result = subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT,
                            env=environ, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_collectstatic_compresses_every_file_under_its_hashed_name(tmp_path):
    collectstatic(production_environ(tmp_path))
    collected = tmp_path / "staticfiles"
    manifest = json.loads((collected / "staticfiles.json").read_text())["paths"]
    plotly = collected / manifest["vendor/plotly.min.js"]
    assert plotly.name != "plotly.min.js" and plotly.is_file()  # hashed: browsers keep it for good
    assert gzip.decompress(plotly.with_name(plotly.name + ".gz").read_bytes()) == plotly.read_bytes()
    assert (collected / manifest["css/hydra.css"]).with_suffix(".css.gz").is_file()


def test_it_runs_one_worker_per_gpu_with_a_shared_spill_volume():
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = spec["services"]
    assert {"postgres", "redis", "web"} <= services.keys()
    workers = {name: service for name, service in services.items() if name.startswith("worker-gpu")}
    assert len(workers) >= 2
    for index, (name, service) in enumerate(sorted(workers.items())):
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "device_ids": [str(index)], "capabilities": ["gpu"]}], name
        assert service["environment"]["HYDRA_WORKER_DEVICE"] == f"cuda:{index}"
        assert "hydra-spill:/spill" in service["volumes"]
    assert spec["volumes"]["hydra-spill"]["driver_opts"]["type"] == "tmpfs"
    # the spill files' whole 2 MiB extents in huge pages: a unit's new buffer versions cost less to write
    assert "huge=within_size" in spec["volumes"]["hydra-spill"]["driver_opts"]["o"].split(",")
    assert "migrate" in services["web"]["command"] and "gunicorn" in services["web"]["command"]


# Requests through Django's test client under the production settings, printed as one JSON line.
PROBE = """
import gzip
import json
from django.test import Client
client = Client()
plain = client.get("/login/")
secure = client.get("/login/", headers={"x-forwarded-proto": "https"})
print(json.dumps({
    "plain": [plain.status_code, plain.get("Location")],
    "health": client.get("/health").status_code,
    "secure": [secure.status_code, secure.get("Strict-Transport-Security"), secure.cookies["csrftoken"]["secure"]],
}))
"""


def test_it_redirects_plain_http_to_https_except_the_load_balancers_health_check(tmp_path):
    redis_url = settings.HYDRA.worker.redis_url  # the tests' Redis, which /health asks
    environ = {**production_environ(tmp_path), "ALLOWED_HOSTS": "testserver", "REDIS_URL": redis_url}
    collectstatic(environ)  # as the deployment does before it serves: the pages name the collected files
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", PROBE], cwd=ROOT, env=environ, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["plain"] == [301, "https://testserver/login/"]
    assert seen["health"] == 200
    assert seen["secure"] == [200, "max-age=31536000; includeSubDomains; preload", True]


def test_it_runs_the_web_worker_on_the_data_volume():
    """Uploads are tokenized and model archives packed by the web worker, which reads and writes /data."""
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["web-worker"]
    assert service["command"] == ["python", "manage.py", "hydra_web_worker"]
    assert "hydra-data:/data" in service["volumes"]
