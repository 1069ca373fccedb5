"""The board of an instruction dataset says what it ranks: the dataset's kind, that only the answers' tokens of
the held-out examples are scored, and each experiment's chat template."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.datasets.factories import upload_and_build
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.leaderboards.test_leaderboards import finish

pytestmark = pytest.mark.django_db
ROWS = [{"messages": [{"role": "user", "content": f"What is {n} plus {n}?"},
                      {"role": "assistant", "content": f"{2 * n}."}]} for n in range(40)]


def test_an_instruction_board_says_its_kind_what_it_scores_and_each_experiments_template(alice):
    client = Client()
    client.force_login(alice)
    dataset = upload_and_build(client, "sums.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    assert dataset.is_ready, dataset.message
    plain = make_experiment(alice.memberships.get().team, dataset, name="own template")
    custom = make_experiment(alice.memberships.get().team, dataset, name="custom template")
    custom.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    custom.save()
    finish(plain.trials.first(), loss=1.0, minutes_ago=2)
    finish(custom.trials.first(), loss=2.0, minutes_ago=1)

    page = client.get(reverse("leaderboard", args=[dataset.pk])).content.decode()

    assert "Instruction data: <strong>Chat messages</strong>" in page
    assert f"the {dataset.val_examples} held-out examples of sums.jsonl (Chat messages" in page
    assert "scoring only the answers&#x27; tokens" in page
    templates = [cell.split("</td>")[0] for cell in page.split('<td data-field="template">')[1:]]
    assert templates == ["the model&#x27;s own, else ChatML", "its own (custom)"]
