"""The telemetry tests' fixtures: real Redis under a fresh host id, and a data directory per test."""

from tests.webapp.telemetry.conftest import data_dir, host_id  # noqa: F401 -- fixtures
