"""Ids in URLs and query strings: only ASCII digits within the database's integer range name an object;
anything else (unicode digits, numbers no row can have) is a 404 or a 400, never a server error."""

from __future__ import annotations

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tests.webapp.datasets.factories import make_dataset, use_data_dir
from tests.webapp.experiments.factories import make_experiment
from webapp.ids import MAX_ID, parse_id

pytestmark = pytest.mark.django_db

BAD_IDS = ["²", "10²³", "99999999999999999999", str(MAX_ID + 1), "١٢", "0x10", "-1", "1_0", " 1"]
PARAMETER = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")
# What the other parts of a route take, so that only the id is wrong.
FILLERS = {"action": "cancel", "fmt": "yaml"}


def _routes(patterns: list, prefix: str = "") -> list[str]:
    routes = []
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            routes += _routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            routes.append(route)
    return routes


def id_routes() -> list[str]:
    """Every route of the site that takes an object id (admin's own excepted)."""
    return [r for r in _routes(get_resolver().url_patterns)
            if not r.startswith("admin/") and any(m["name"].endswith("_id") for m in PARAMETER.finditer(r))]


def _fill(route: str, bad: str) -> str:
    return "/" + PARAMETER.sub(lambda m: bad if m["name"].endswith("_id") else FILLERS[m["name"]], route)


def test_every_id_route_is_found():
    # The walk above must see the routes it is meant to check, or the tests below would pass on nothing.
    routes = id_routes()
    assert "experiments/<id:experiment_id>/" in routes
    assert "dashboards/trials/<id:trial_id>/plan/" in routes
    assert "teams/<id:team_id>/members/add/" in routes
    assert len(routes) >= 20


@pytest.mark.parametrize("bad", BAD_IDS)
def test_a_malformed_or_huge_id_in_a_url_is_not_found(alice_client, bad):
    for route in id_routes():
        url = _fill(route, bad)
        assert alice_client.get(url).status_code == 404, url
        assert alice_client.post(url).status_code == 404, url


def test_the_largest_id_is_simply_not_found(alice_client):
    url = reverse("experiment_detail", args=[MAX_ID])
    assert alice_client.get(url).status_code == 404


@pytest.mark.parametrize("bad", ["²", "10²³", "99999999999999999999"])
def test_a_malformed_or_huge_id_in_a_query_string_is_refused(alice_client, alice_team, settings, tmp_path, bad):
    use_data_dir(settings, tmp_path)
    experiment = make_experiment(alice_team, make_dataset(alice_team))
    curves = reverse("dashboard_curves_data", args=[experiment.pk])
    devices = reverse("dashboard_devices_data", args=[experiment.pk])
    assert alice_client.get(reverse("experiment_create"), {"clone": bad}).status_code == 404
    assert alice_client.get(reverse("dashboard_curves", args=[experiment.pk]), {"compare": bad}).status_code == 400
    assert alice_client.get(curves, {"after_step": bad}).status_code == 400
    assert alice_client.get(devices, {"after": bad}).status_code == 400


def test_parse_id_takes_ascii_digits_in_range_only():
    assert parse_id("0") == 0
    assert parse_id("42") == 42
    assert parse_id(str(MAX_ID)) == MAX_ID
    for bad in [*BAD_IDS, "", "+1", "1.0", "1e3"]:
        assert parse_id(bad) is None, bad
