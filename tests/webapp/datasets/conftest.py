from __future__ import annotations

import pytest

from tests.webapp.datasets.factories import use_data_dir


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    use_data_dir(settings, tmp_path)
    return tmp_path
