"""The experiment page in real Chromium keeps itself current: launched from the page, its trials' statuses,
steps and best values move as the scheduler and the ingest report them, without a reload, and the page stops
asking once they have ended."""

from __future__ import annotations

import pytest
from django.conf import settings

from tests.conftest import PASSWORD
from tests.webapp.datasets.factories import make_dataset
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.telemetry.factories import write_steps
from webapp.experiments.ingest import telemetry_ingest
from webapp.ground.models import Trial

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROW = '#trial-table tr[data-trial="{}"]'


def _row_is(page, trial: Trial, status: str) -> None:
    page.wait_for_selector(f'{ROW.format(trial.pk)}[data-status="{status}"]', timeout=15_000)


def test_the_experiment_page_follows_its_trials_without_a_reload(page, live_server, alice, alice_team, scheduler,
                                                                 redis_client, db_lock, screenshots_dir):
    with db_lock:
        experiment = make_experiment(alice_team, make_dataset(alice_team), budget=10, eval_every=5)
    first, second = experiment.trials.order_by("number")
    page.goto(f"{live_server.url}/login/?next=/experiments/{experiment.pk}/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/experiments/{experiment.pk}/")

    page.click("button:has-text('Launch 2 trials')")
    page.wait_for_url(f"{live_server.url}/experiments/{experiment.pk}/")
    _row_is(page, first, "planning")
    page.evaluate("() => { window.notReloaded = true; }")  # gone if the page reloads

    # A device plans both trials and runs a unit of the first: the page says so by itself.
    for _ in range(2):
        job = scheduler.claim_plan("cpu0")
        scheduler.plan_done(job, remaining_units=10, unit_s=0.1, plan={"shards": []})
    scheduler.device_start("cpu0", "e")
    first.refresh_from_db()
    lease = scheduler.claim(first.queue_id, "cpu0")
    _row_is(page, first, "running")
    _row_is(page, second, "runnable")
    assert page.inner_text("#experiment-state") == "running"

    # The ingest stores its 10 steps and their evaluation: steps done and best value follow.
    host = settings.HYDRA.worker.host_id
    write_steps(redis_client, host, first, range(0, 10))
    with db_lock:
        telemetry_ingest(host_id=host)
    cells = ROW.format(first.pk)
    page.wait_for_function(f"() => document.querySelector('{cells} td[data-field=step]').innerText === '10 / 10'",
                           timeout=15_000)
    first.refresh_from_db()
    assert page.inner_text(f"{cells} td[data-field=best_val_loss]") == f"{first.best_val_loss:.4f}"
    page.screenshot(path=str(screenshots_dir / "experiment-live.png"), full_page=True)

    # Both trials end: the page says finished and stops asking.
    scheduler.complete(lease, remaining_units=0, unit_s=0.1, steps_done=10)
    second.refresh_from_db()
    scheduler.complete(scheduler.claim(second.queue_id, "cpu0"), remaining_units=0, unit_s=0.1, steps_done=10)
    _row_is(page, second, "finished")
    page.wait_for_function("() => document.getElementById('experiment-state').innerText === 'finished'",
                           timeout=15_000)
    assert page.get_attribute("#experiment-state", "data-running") == "false"
    assert page.evaluate("() => window.notReloaded") is True
    asked = []
    page.on("request", lambda request: asked.append(request.url) if "/experiments/" in request.url else None)
    page.wait_for_timeout(3 * 3000 + 1500)  # past the settling polls
    settled = len(asked)
    page.wait_for_timeout(4000)
    assert len(asked) == settled, asked
    assert page.errors == []
