"""Tokens and a client for the API tests, and the experiments tests' fixtures (data folder, datasets, the real
scheduler queue)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from tests.webapp.experiments.conftest import alice_dataset, bob_dataset, data_dir, scheduler  # noqa: F401
from webapp.api.tokens import token_create

BASE = "/api/v1"


class Api:
    """The API as a script calls it: a bearer token on every request, JSON in and out."""

    def __init__(self, secret: str, team: int | None = None) -> None:
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {secret}"}
        if team is not None:
            self.headers["X-Hydra-Team"] = str(team)

    def get(self, path: str, **params: Any):
        return self.client.get(BASE + path, params, headers=self.headers)

    def post(self, path: str, body: dict[str, Any] | None = None):
        return self.client.post(BASE + path, json.dumps(body or {}), content_type="application/json",
                                headers=self.headers)

    def upload(self, path: str, data: dict[str, Any]):
        return self.client.post(BASE + path, data, headers=self.headers)


def api_for(user, scope: str = "write", days: int = 30, team: int | None = None) -> Api:
    _, secret = token_create(user=user, name=f"{user.get_username()} {scope}", scope=scope, days=days)
    return Api(secret, team=team)


@pytest.fixture
def alice_api(alice) -> Api:
    return api_for(alice)


@pytest.fixture
def bob_api(bob) -> Api:
    return api_for(bob)
