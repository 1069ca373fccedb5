"""Each bad environment variable stops start-up with an error that names it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from webapp.config import LoginThrottle, load

DEV = {"DEBUG": "1"}


def test_it_starts_with_no_environment_in_debug():
    config = load(DEV)
    assert config.debug is True
    assert config.database["ENGINE"] == "django.db.backends.sqlite3"
    assert config.worker.redis_url == "redis://127.0.0.1:6379/0"
    assert config.worker.devices == "auto"


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({}, "SECRET_KEY"),
        ({"SECRET_KEY": "short", "ALLOWED_HOSTS": "x"}, "SECRET_KEY"),
        ({"SECRET_KEY": "k" * 40}, "ALLOWED_HOSTS"),
        ({**DEV, "ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS"),
        ({**DEV, "DATABASE_URL": "mysql://root@localhost/hydra"}, "DATABASE_URL"),
        ({**DEV, "DATABASE_URL": "postgres://user@localhost:5432/"}, "DATABASE_URL"),
        ({**DEV, "REDIS_URL": "http://localhost:6379"}, "REDIS_URL"),
        ({**DEV, "REDIS_URL": "redis://localhost:notaport/0"}, "REDIS_URL"),
        ({**DEV, "HYDRA_SPILL_DIR": "relative/spill"}, "HYDRA_SPILL_DIR"),
        ({**DEV, "HYDRA_SPILL_DIR": "/etc/hostname"}, "HYDRA_SPILL_DIR"),
        ({**DEV, "HYDRA_DEVICES": "gpu:2"}, "HYDRA_DEVICES"),
        ({**DEV, "HYDRA_DEVICES": "cpu:0"}, "HYDRA_DEVICES"),
        ({**DEV, "HYDRA_WORKER_DEVICE": "tpu:0"}, "HYDRA_WORKER_DEVICE"),
        ({**DEV, "HYDRA_MAX_UPLOAD_MB": "lots"}, "HYDRA_MAX_UPLOAD_MB"),
        ({**DEV, "HYDRA_MAX_UPLOAD_MB": "0"}, "HYDRA_MAX_UPLOAD_MB"),
        ({**DEV, "HYDRA_MAX_DECODED_MB": "0"}, "HYDRA_MAX_DECODED_MB"),
        ({**DEV, "HYDRA_WEB_TASK_MEMORY_MB": "100"}, "HYDRA_WEB_TASK_MEMORY_MB"),
        ({**DEV, "HYDRA_WEB_TASK_MEMORY_MB": "4G"}, "HYDRA_WEB_TASK_MEMORY_MB"),
        ({**DEV, "HYDRA_HOST_ID": "bad host/name"}, "HYDRA_HOST_ID"),
        ({**DEV, "HYDRA_FAULT_OOM_ABOVE_BYTES": "1GB"}, "HYDRA_FAULT_OOM_ABOVE_BYTES"),
        ({**DEV, "HYDRA_FAULT_OOM_ABOVE_BYTES": "0"}, "HYDRA_FAULT_OOM_ABOVE_BYTES"),
        ({**DEV, "HYDRA_HTTPS": "sometimes"}, "HYDRA_HTTPS"),
        ({**DEV, "HYDRA_HTTPS": "1", "HYDRA_HSTS_SECONDS": "a year"}, "HYDRA_HSTS_SECONDS"),
        ({**DEV, "HYDRA_HTTPS": "1", "HYDRA_HSTS_SECONDS": "-1"}, "HYDRA_HSTS_SECONDS"),
        ({**DEV, "HYDRA_HSTS_SECONDS": "3600"}, "HYDRA_HSTS_SECONDS"),
        ({**DEV, "HYDRA_LOGIN_FAILURES_PER_USER": "five"}, "HYDRA_LOGIN_FAILURES_PER_USER"),
        ({**DEV, "HYDRA_LOGIN_FAILURES_PER_USER": "0"}, "HYDRA_LOGIN_FAILURES_PER_USER"),
        ({**DEV, "HYDRA_LOGIN_FAILURES_PER_ADDRESS": "0"}, "HYDRA_LOGIN_FAILURES_PER_ADDRESS"),
        ({**DEV, "HYDRA_LOGIN_FAILURES_PER_ADDRESS": "4"}, "HYDRA_LOGIN_FAILURES_PER_ADDRESS=4 is below"),
        ({**DEV, "HYDRA_TRUSTED_PROXY_COUNT": "-1"}, "HYDRA_TRUSTED_PROXY_COUNT"),
        ({**DEV, "HYDRA_TRUSTED_PROXY_COUNT": "nginx"}, "HYDRA_TRUSTED_PROXY_COUNT"),
    ],
)
def test_it_names_the_bad_variable(environ, named):
    with pytest.raises(ImproperlyConfigured, match=named):
        load(environ)


def test_it_reads_good_values():
    config = load(
        {
            "SECRET_KEY": "s" * 50,
            "ALLOWED_HOSTS": "hydra.lab.example, 10.0.0.5",
            "DATABASE_URL": "postgres://hydra:pw@db:5432/hydra",
            "REDIS_URL": "redis://redis:6379/2",
            "HYDRA_SPILL_DIR": "/mnt/nvme/hydra",
            "HYDRA_DEVICES": "cuda:0,1",
            "HYDRA_MAX_UPLOAD_MB": "5",
            "HYDRA_FAULT_OOM_ABOVE_BYTES": "400000",
        }
    )
    assert config.debug is False
    assert config.allowed_hosts == ["hydra.lab.example", "10.0.0.5"]
    assert config.database["NAME"] == "hydra" and config.database["HOST"] == "db"
    assert config.worker.spill_dir == Path("/mnt/nvme/hydra")
    assert config.worker.devices == "cuda:0,1"
    assert config.max_upload_bytes == 5 * 1024 * 1024
    assert config.worker.fault_oom_above_bytes == 400_000
    assert load(DEV).worker.fault_oom_above_bytes is None  # off unless asked for


def test_it_serves_production_over_https_with_hsts_and_development_over_http():
    production = {"SECRET_KEY": "s" * 50, "ALLOWED_HOSTS": "hydra.lab.example"}
    assert (load(production).https, load(production).hsts_seconds) == (True, 365 * 24 * 3600)
    assert load({**production, "HYDRA_HSTS_SECONDS": "0"}).hsts_seconds == 0
    plain = load({**production, "HYDRA_HTTPS": "off"})
    assert (plain.https, plain.hsts_seconds) == (False, 0)
    assert (load(DEV).https, load(DEV).hsts_seconds) == (False, 0)


def test_it_throttles_logins_per_username_and_address_and_per_address():
    assert load(DEV).login_throttle == LoginThrottle(failures_per_user=5, failures_per_address=50,
                                                     trusted_proxy_count=0)
    lab = load({**DEV, "HYDRA_LOGIN_FAILURES_PER_USER": "10", "HYDRA_LOGIN_FAILURES_PER_ADDRESS": "200",
                "HYDRA_TRUSTED_PROXY_COUNT": "1"})
    assert lab.login_throttle == LoginThrottle(failures_per_user=10, failures_per_address=200, trusted_proxy_count=1)


def test_it_bounds_what_a_dataset_file_decodes_to_and_what_a_web_task_may_take():
    assert (load(DEV).max_decoded_bytes, load(DEV).web_task_memory_bytes) == (1 << 30, None)
    lab = load({**DEV, "HYDRA_MAX_DECODED_MB": "8192", "HYDRA_WEB_TASK_MEMORY_MB": "16384"})
    assert (lab.max_decoded_bytes, lab.web_task_memory_bytes) == (8 << 30, 16 << 30)


def test_it_stops_manage_py_with_the_message():
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        env={"PATH": "/usr/bin:/bin", "DEBUG": "1", "HYDRA_DEVICES": "gpus please"},
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "HYDRA_DEVICES" in result.stderr
