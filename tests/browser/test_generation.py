"""Generating text on a trial's page in real Chromium: the page polls the web worker's result and shows it in
place, leaving the prompt box as it is."""

from __future__ import annotations

import re

import pytest

from tests.conftest import PASSWORD
from tests.webapp.conftest import web_worker  # noqa: F401 -- fixture
from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_generations import random_export
from webapp.ground.models import Generation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.usefixtures("web_worker")
def test_the_page_shows_the_generation_once_the_web_worker_is_done(page, live_server, alice, alice_team,
                                                                    screenshots_dir):
    trial = random_export(make_experiment(alice_team, make_dataset(alice_team)).trials.first())
    page.goto(f"{live_server.url}/login/?next=/trials/{trial.pk}/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/trials/{trial.pk}/")

    page.fill("#id_prompt", "A hydra has")
    page.fill("#id_max_new_tokens", "6")
    page.fill("#id_temperature", "0.9")
    page.fill("#id_seed", "7")
    page.click("#generation-form button[type=submit]")
    page.wait_for_url(re.compile(rf"/trials/{trial.pk}/#generation-[0-9]+$"))
    generation = Generation.objects.get()
    page.fill("#id_prompt", "typed while it generates")

    card = f"#generation-{generation.pk}[data-status=done]"
    page.wait_for_selector(card, timeout=90_000)  # replaced in place by the page's poll, not a reload
    generation.refresh_from_db()
    assert page.input_value("#id_prompt") == "typed while it generates"
    assert page.inner_text(f"{card} .generation-prompt") == "A hydra has"
    assert page.inner_text(f"{card} .generation-settings") == (
        "6 new tokens at most · temperature 0.9 · top-p 0.95 · seed 7")
    assert generation.text and page.text_content(f"{card} .generation-continuation") == generation.text
    path = screenshots_dir / "trial-generation.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    assert page.errors == []
