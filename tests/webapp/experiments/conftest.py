from __future__ import annotations

import pytest

from tests.webapp.datasets.factories import make_dataset, use_data_dir


@pytest.fixture(autouse=True)
def data_dir(settings, tmp_path):
    use_data_dir(settings, tmp_path)
    return tmp_path


@pytest.fixture
def alice_dataset(alice_team):
    return make_dataset(alice_team, name="alice corpus")


@pytest.fixture
def bob_dataset(bob_team):
    return make_dataset(bob_team, name="bob corpus")


@pytest.fixture
def submitted(monkeypatch):
    """Replace the scheduler's submit and control calls with recorders (the real ones need Redis)."""
    calls: list[tuple[str, dict]] = []
    from worker import api

    monkeypatch.setattr(api, "trial_submit", lambda **kw: calls.append(("submit", kw)))
    for name, state in [("trial_pause", "paused"), ("trial_resume", "runnable"), ("trial_cancel", "cancelled")]:
        monkeypatch.setattr(api, name, lambda state=state, name=name, **kw: calls.append((name, kw)) or state)
    return calls
