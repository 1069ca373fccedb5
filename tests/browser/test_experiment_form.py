"""The experiment form in real Chromium: it shows only the fields the current choices use."""

from __future__ import annotations

import pytest

from tests.conftest import PASSWORD
from tests.webapp.conftest import web_worker  # noqa: F401 -- fixture
from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.checkpoints import ready_checkpoint
from tests.webapp.experiments.test_previews import DEEP, LEARNING_RATES

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


# The text of a select's chosen option fits the select: its width is at least the text's, as drawn in the select's
# own font, plus room for the arrow.
OPTION_FITS_JS = """select => {
    const context = document.createElement("canvas").getContext("2d");
    context.font = getComputedStyle(select).font;
    return context.measureText(select.selectedOptions[0].text).width + 24 <= select.clientWidth;
}"""


def test_pasted_text_sets_the_rows_aside_and_the_preview_comes_into_view(page, live_server, alice, alice_team,
                                                                         screenshots_dir):
    dataset = make_dataset(alice_team)
    page.goto(f"{live_server.url}/login/?next=/experiments/new/%3Fdataset%3D{dataset.pk}")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/experiments/new/?dataset={dataset.pk}")

    kinds = page.locator("#space-rows select[name$='-kind']")
    for value, label in (("categorical", "categorical (values)"), ("logfloat", "log-float range")):
        kinds.first.select_option(value)
        assert kinds.first.evaluate("select => select.selectedOptions[0].text") == label
        assert kinds.first.evaluate(OPTION_FITS_JS), f"{label!r} is cut in the Kind menu"
    kinds.first.select_option("categorical")

    assert not page.is_visible("#rows-set-aside")
    page.click("details.space-help summary")
    page.fill("#id_space_text", "lr: 0.002\nbatch_size: [2, 4]\n")
    assert page.is_visible("#rows-set-aside")
    assert page.locator("#space-rows").evaluate("table => table.inert") and page.is_disabled("#add-space-row")
    page.fill("#id_space_text", "")
    assert not page.is_visible("#rows-set-aside") and page.is_enabled("#add-space-row")
    page.fill("#id_space_text", "lr: 0.002\nbatch_size: [2, 4]\n")

    page.fill("#id_name", "pasted")
    page.click("button[name=action][value=preview]")
    page.wait_for_load_state()
    assert page.locator("#preview").count() == 1, page.locator(".errorlist, .errors").all_inner_texts()
    assert page.inner_text("#preview h2").startswith("Preview: 2 trials")
    # In view: its heading and first rows inside the window (as far down as the page scrolls).
    top, bottom = page.locator("#preview").evaluate(
        "section => [section.getBoundingClientRect().top, section.getBoundingClientRect().bottom]")
    window = page.evaluate("() => window.innerHeight")
    assert top >= 0 and (top < 100 or bottom <= window), f"the preview spans {top:.0f}..{bottom:.0f} px of {window}"
    # The rows stay set aside after the answer, as long as the text is there.
    assert page.is_visible("#rows-set-aside") and page.is_disabled("#add-space-row")
    page.screenshot(path=str(screenshots_dir / "experiment-form-preview.png"))

    page.fill("#id_space_text", "lora_rank: [8]\noptimizer: adam\n")
    page.click("button[name=action][value=preview]")
    page.wait_for_load_state()
    errors = page.locator("#id_space_text ~ .errorlist li, .errorlist li").all_inner_texts()
    assert any(e.startswith("Unknown parameter 'lora_rank'; did you mean lora_r?") for e in errors), errors
    assert "optimizer: 'adam' is not one of adamw, sgd." in errors
    first_error = page.locator(".errorlist").first.evaluate("list => list.getBoundingClientRect().top")
    assert 0 <= first_error < 900, "the first error is out of view"
    # The refused form answers 400, which Chromium logs; nothing else may be logged.
    assert [e for e in page.errors if "status of 400 (Bad Request)" not in e] == []


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


@pytest.mark.usefixtures("web_worker")
def test_a_large_preview_planned_by_the_web_worker_comes_in_place_of_its_placeholder(page, live_server, alice,
                                                                                     alice_team):
    dataset = make_dataset(alice_team)
    page.goto(f"{live_server.url}/login/?next=/experiments/new/%3Fdataset%3D{dataset.pk}")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/experiments/new/?dataset={dataset.pk}")
    page.fill("#id_name", "deep sweep")
    page.check("input[name=model_kind][value=custom]")
    for field, value in DEEP.items():
        if field != "model_kind":
            page.fill(f"#id_{field}", str(value))
    page.click("details.space-help summary")
    page.fill("#id_space_text", f"lr: {LEARNING_RATES}\nbatch_size: 2\n")
    page.click("button[name=action][value=preview]")
    page.wait_for_load_state()
    assert "Preparing preview" in page.inner_text("#preview")
    page.fill("#id_name", "typed while it plans")

    page.wait_for_selector("#preview[data-status=ready]", timeout=90_000)  # in place, not a reload
    assert page.inner_text("#preview h2").startswith("Preview: 20 trials")
    assert page.input_value("#id_name") == "typed while it plans"
    assert page.errors == []
