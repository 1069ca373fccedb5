"""The experiment form in real Chromium: it shows only the fields the current choices use."""

from __future__ import annotations

import pytest

from tests.conftest import PASSWORD
from tests.webapp.datasets.factories import make_dataset

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_it_shows_only_the_chosen_models_fields(page, live_server, alice, alice_team):
    make_dataset(alice_team)
    page.goto(f"{live_server.url}/login/?next=/experiments/new/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/experiments/new/")

    # The custom size's fields sit in a grid row: the hidden attribute must still hide them.
    assert page.is_visible("#id_preset")
    assert not page.is_visible("#id_n_layer")
    assert not page.is_visible("#id_memory_budget_mib")

    page.check("input[name=model_kind][value=custom]")
    assert page.is_visible("#id_n_layer") and page.is_visible("#id_n_positions")
    assert page.is_visible("#id_family") and page.is_visible("#id_n_kv_head")
    assert not page.is_visible("#id_preset")

    page.check("input[name=model_kind][value=checkpoint]")
    assert page.is_visible("#id_checkpoint") and not page.is_visible("#id_family")
    assert page.locator("input[name=model_kind][value=pretrained]").count() == 0  # older experiments' only

    page.check("input[name=memory_budget][value=explicit]")
    assert page.is_visible("#id_memory_budget_mib")
    assert page.errors == []
