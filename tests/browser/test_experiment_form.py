"""The experiment form in real Chromium: it shows only the fields the current choices use."""

from __future__ import annotations

import pytest

from tests.conftest import PASSWORD
from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.checkpoints import ready_checkpoint

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

    assert not page.is_visible("#id_base_dtype")
    page.check("input[name=model_kind][value=checkpoint]")
    assert page.is_visible("#id_checkpoint") and not page.is_visible("#id_family")
    assert page.is_visible("#id_base_dtype")
    assert page.locator("input[name=model_kind][value=pretrained]").count() == 0  # older experiments' only

    page.check("input[name=memory_budget][value=explicit]")
    assert page.is_visible("#id_memory_budget_mib")
    assert page.errors == []


def test_a_lora_sweep_keeps_its_base_in_nf4_and_the_preview_says_what_it_takes(page, live_server, alice, alice_team):
    dataset = make_dataset(alice_team)
    checkpoint = ready_checkpoint(alice)
    page.goto(f"{live_server.url}/login/?next=/experiments/new/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/experiments/new/")
    page.fill("#id_name", "nf4 ranks")
    page.select_option("#id_dataset", str(dataset.pk))
    page.check("input[name=model_kind][value=checkpoint]")
    page.select_option("#id_checkpoint", str(checkpoint.pk))
    page.select_option("#id_base_dtype", "nf4")
    page.click(".space-help summary")
    page.fill("#id_space_text", "lora_r: [4, 8]\nlora_targets: ['q_proj,v_proj']\n")
    page.click("button[name=action][value=preview]")
    page.wait_for_load_state()
    errors = "\n".join(page.locator(".errorlist, .errors").all_inner_texts())
    assert page.locator("#preview").count() == 1, errors or page.inner_text("main")
    said = page.inner_text("#preview-base-dtype")
    assert said.startswith("Base in nf4: ") and " instead of " in said and " in fp32" in said, said
    assert page.input_value("#id_base_dtype") == "nf4"  # the form keeps the choice for the create
    assert page.errors == []
