"""docker-compose.yml describes a lab GPU server: it validates and has one pinned worker per GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_it_passes_docker_compose_config():
    command = compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed (.ci/run installs docker-compose)")
    result = subprocess.run(
        [*command, "config", "-q"], cwd=ROOT, env={**os.environ, "SECRET_KEY": "x" * 40},
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr


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
    assert "migrate" in services["web"]["command"] and "gunicorn" in services["web"]["command"]
