"""What a caller sends beyond any bound is a clear 4xx, never a 500: every integer the API takes (read from its
own schema, so a parameter added later is tried too) with a value no column holds, and null characters in the
text it filters by."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from tests.webapp.api.conftest import BASE, Api
from tests.webapp.experiments.factories import make_experiment

pytestmark = pytest.mark.django_db
HUGE = ["99999999999999999999", "-99999999999999999999"]


def _integer(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "integer" or any(_integer(option) for option in schema.get("anyOf", []))


def _operations(client: Client) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(method, path, operation, its JSON body's properties) of every operation of the schema."""
    schema = client.get(f"{BASE}/openapi.json").json()
    components = schema["components"]["schemas"]
    found = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            properties = components[body["$ref"].rsplit("/", 1)[-1]]["properties"] if "$ref" in body else {}
            found.append((method, path, operation, properties))
    return found


def _bodies(dataset_id: int) -> dict[str, dict[str, Any]]:
    """A body each operation with a JSON body would take, by operation id, to change one integer of."""
    experiment = {"name": "n", "dataset": dataset_id, "space": {"lr": {"values": [0.001]}}}
    return {"experiment_create": experiment, "experiment_preview": experiment, "experiment_clone": {},
            "trial_continue": {"steps": 10, "lr": 0.001}, "trial_generate": {"prompt": "Once"}}


def test_every_integer_out_of_range_is_a_400_or_a_404(alice_api: Api, alice_team, alice_dataset):
    experiment = make_experiment(alice_team, alice_dataset)
    trial = experiment.trials.first()
    ids = {"dataset_id": alice_dataset.pk, "experiment_id": experiment.pk, "trial_id": trial.pk,
           "checkpoint_id": 1, "preview_id": 1, "generation_id": 1}
    bodies = _bodies(alice_dataset.pk)
    tried = []
    for method, path, operation, properties in _operations(alice_api.client):
        body = next((b for key, b in bodies.items() if operation["operationId"].endswith(key)), None)
        for parameter in operation.get("parameters", []):
            if not _integer(parameter["schema"]):
                continue
            for value in HUGE:
                where = {**ids, parameter["name"]: value} if parameter["in"] == "path" else ids
                url = path.format(**where)
                query = {parameter["name"]: value} if parameter["in"] == "query" else {}
                response = _call(alice_api, method, url, query, body)
                expected = 404 if parameter["in"] == "path" else 400
                assert response.status_code == expected, (method, url, query, response.content)
                if expected == 400:
                    assert parameter["name"] in response.json()["errors"], response.content
                tried.append(parameter["name"])
        for field, schema in properties.items():
            if not _integer(schema):
                continue
            assert body is not None, f"no body to try {operation['operationId']}'s {field} with"
            for value in HUGE:
                response = _call(alice_api, method, path.format(**ids), {}, {**body, field: int(value)})
                assert response.status_code == 400, (method, path, field, response.content)
                assert field in response.json()["errors"], (method, path, field, response.content)
                tried.append(field)
    assert {"offset", "limit", "page", "since", "trial_id", "n_trials", "seed", "steps", "max_new_tokens"} <= set(tried)


def _call(api: Api, method: str, path: str, query: dict[str, str], body: dict[str, Any] | None):
    url = path.removeprefix(BASE)
    if method == "get":
        return api.get(url, **query)
    suffix = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
    return api.client.post(BASE + url + suffix, json.dumps(body or {}), content_type="application/json",
                           headers=api.headers)


@pytest.mark.parametrize("path", ["/datasets", "/experiments"])
def test_a_huge_offset_is_a_400_that_says_the_bound(alice_api: Api, path):
    response = alice_api.get(path, offset="99999999999999999999")
    assert response.status_code == 400
    assert response.json()["errors"] == {"offset": ["Input should be less than or equal to 1000000000"]}


@pytest.mark.parametrize("field", ["q", "tag", "model", "dataset", "status", "sort"])
def test_a_null_character_in_an_experiment_filter_is_a_400_under_its_name(alice_api: Api, field):
    response = alice_api.get("/experiments", **{field: "a\x00b"})
    assert response.status_code == 400
    assert response.json()["errors"] == {field: ["Null characters are not allowed."]}


def test_a_dataset_status_filter_is_one_of_the_statuses(alice_api: Api):
    for status in ("a\x00b", "exploded"):
        response = alice_api.get("/datasets", status=status)
        assert response.status_code == 400
        assert response.json()["errors"] == {"status": ["Give one of tokenizing, ready, failed."]}
    assert alice_api.get("/datasets", status="ready").status_code == 200


def test_a_file_of_many_unknown_columns_is_refused_in_a_few_lines(alice_api: Api, data_dir):
    columns = ["x" * 100_000] + [f"column_{k}" for k in range(40_000)]
    row = json.dumps(dict.fromkeys(columns, 1)) + "\n"
    response = alice_api.upload("/datasets", {"source": "upload", "vocab_size": 300, "val_fraction": 0.25,
                                              "file": SimpleUploadedFile("wide.jsonl", row.encode())})
    assert response.status_code == 400
    message = response.json()["errors"]["file"][0]
    assert message.startswith(f"wide.jsonl: no known columns: found '{'x' * 60}… (100,000 characters)', 'column_0', ")
    assert "'column_18' and 39,981 more; accepted:" in message
    assert len(response.content) < 2_000
