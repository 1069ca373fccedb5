"""Without Chromium the browser tests skip on a developer's machine and fail in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser.conftest import require_chromium


def test_it_skips_without_chromium_outside_ci(tmp_path: Path):
    with pytest.raises(pytest.skip.Exception, match="no Chromium"):
        require_chromium(tmp_path / "chromium", {})
    with pytest.raises(pytest.skip.Exception):
        require_chromium(tmp_path / "chromium", {"CI": "false"})


def test_it_fails_without_chromium_in_ci(tmp_path: Path):
    with pytest.raises(pytest.fail.Exception, match="CI=true requires the browser tests"):
        require_chromium(tmp_path / "chromium", {"CI": "true"})


def test_it_runs_with_chromium_in_ci(tmp_path: Path):
    chromium = tmp_path / "chromium"
    chromium.touch()
    require_chromium(chromium, {"CI": "true"})
