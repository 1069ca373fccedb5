"""Every catalog test gets its own data folder, so its models root (``<data>/models``) is its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.webapp.datasets.factories import use_data_dir


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path: Path) -> Path:
    use_data_dir(settings, tmp_path)
    return tmp_path


@pytest.fixture
def models_root(settings, data_dir: Path) -> Path:
    root = settings.HYDRA.models_root
    root.mkdir(parents=True, exist_ok=True)
    return root
