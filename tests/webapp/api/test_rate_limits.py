"""The API's two limits in Redis: requests per token in any 60 seconds, however they fall around a clock
minute's turn; and wrong tokens per client address in 15 minutes, past which the address is refused whatever
token it sends. The web servers' clock is set by the test (`clock`), Redis is the real one."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from tests.webapp.api.conftest import Api, api_for
from webapp.api.auth import TokenAuth, TokenRateThrottle

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock(monkeypatch):
    """The web servers' time, in epoch seconds: set ``clock.now``. It starts half a second before a clock
    minute turns, far from any real time, so that no other test's counts are in its windows."""

    class Clock:
        now = (1_000_000_000 + uuid.uuid4().int % 1_000_000) * 60 - 0.5

    for owner in (TokenRateThrottle, TokenAuth):
        monkeypatch.setattr(owner, "clock", staticmethod(lambda: Clock.now))
    return Clock


def test_a_token_gets_its_rate_in_any_60_seconds_not_twice_it_around_a_minutes_turn(alice, settings, clock):
    settings.HYDRA = dataclasses.replace(settings.HYDRA, api_rate_per_minute=3)
    api = api_for(alice)
    assert [api.get("/me").status_code for _ in range(3)] == [200, 200, 200]
    clock.now += 1.0  # the clock's minute has turned
    refused = api.get("/me")
    assert refused.status_code == 429 and refused["Retry-After"] == "59"
    clock.now += 58.6  # 59.6 s after the first three: not yet
    assert api.get("/me").status_code == 429
    clock.now += 0.5  # 60.1 s after them: their places are free again
    assert [api.get("/me").status_code for _ in range(4)] == [200, 200, 200, 429]


def test_an_address_that_sends_too_many_wrong_tokens_is_refused_whatever_it_sends(alice, settings, clock):
    settings.HYDRA = dataclasses.replace(settings.HYDRA, api_auth_failures_per_address=3)
    address = f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.7"
    guesser, live = Api("hyd_guess"), api_for(alice)

    for _ in range(3):
        assert guesser.client.get("/api/v1/me", headers=guesser.headers, REMOTE_ADDR=address).status_code == 401
    clock.now += 60
    refused = live.client.get("/api/v1/me", headers=live.headers, REMOTE_ADDR=address)
    assert refused.status_code == 429 and "Too many wrong tokens" in refused.json()["detail"]
    assert refused["Retry-After"] == str(15 * 60 - 60)
    assert live.client.get("/api/v1/me", headers=live.headers, REMOTE_ADDR="10.255.0.1").status_code == 200
    clock.now += 15 * 60 - 60  # the first failure is 15 minutes old
    assert live.client.get("/api/v1/me", headers=live.headers, REMOTE_ADDR=address).status_code == 200
