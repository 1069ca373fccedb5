"""The whole product as a new user meets it, in real Chromium against the real stack (`make run`'s devstack):
log in, upload a corpus, build a 3-trial search space, preview, launch, watch real CPU workers train it on
the live dashboards, see every trial finish and rank on the leaderboard. No page may log an error."""

from __future__ import annotations

import re
import tarfile
import time
from pathlib import Path
from pydoc_data.topics import topics

import pytest

from tests.browser.devstack import DevStack

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LEARNING_RATES = ["0.0003", "0.001", "0.003"]
STEPS = 160
EVAL_EVERY = 20
BUDGET_MIB = 8
GROWTH_TIMEOUT_MS = 60_000
FINISH_TIMEOUT_S = 180.0

# Sum of the points drawn in the raw (unsmoothed) loss trace of every trial.
RAW_POINTS_JS = """() => document.getElementById('curves-plot').data
    .filter(t => t.meta && t.meta.role === 'raw').reduce((n, t) => n + t.x.length, 0)"""
# Per device lane of the timeline, the trials that have a unit drawn on it.
LANE_TRIALS_JS = """() => {
    const lanes = {};
    for (const t of document.getElementById('timeline-plot').data) {
        if (!t.meta || t.meta.role !== 'units') continue;
        for (const lane of t.y) (lanes[lane] = lanes[lane] || new Set()).add(t.meta.trial);
    }
    return Object.fromEntries(Object.entries(lanes).map(([lane, trials]) => [lane, trials.size]));
}"""


def _corpus(path: Path, *, min_bytes: int) -> Path:
    """Real English prose (the Python reference's topics, which ship with Python) of at least `min_bytes`."""
    parts: list[str] = []
    for name in ("if", "while", "for", "try", "with", "function", "class", "assignment", "lambda", "import"):
        parts.append(topics[name].strip())
        if sum(map(len, parts)) >= min_bytes:
            break
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    return path


def _checked(page, screenshots_dir: Path, name: str) -> None:
    """Screenshot the page (printing the path) and require that no page so far logged an error."""
    path = screenshots_dir / f"e2e-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    assert page.errors == [], page.errors


def _log_in(page, stack: DevStack) -> None:
    username, password = stack.demo_login()
    page.goto(f"{stack.url}/")
    page.wait_for_url(re.compile(r"/login/"))
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{stack.url}/")


def _upload_dataset(page, stack: DevStack, corpus: Path) -> None:
    page.click("nav.mainnav >> text=Datasets")
    page.check("input[name=source][value=upload]")
    page.set_input_files("input[name=file]", str(corpus))
    page.fill("input[name=name]", "Python prose")
    page.fill("input[name=vocab_size]", "384")
    page.click("#dataset-form button[type=submit]")
    page.wait_for_url(re.compile(r"/datasets/\d+/$"), timeout=60_000)
    facts = page.inner_text("dl.facts")
    assert f"({corpus.stat().st_size} bytes)" in facts, facts
    tokens = re.search(r"Tokens\s+(\d+)", facts)
    split = re.search(r"Train / validation\s+(\d+) / (\d+) tokens", facts)
    assert tokens and split, facts
    assert int(split[1]) + int(split[2]) == int(tokens[1]) > 0, facts
    assert 0 < int(split[2]) < int(split[1]), facts


def _build_experiment(page) -> None:
    """From the dataset page: a micro GPT-2, a grid over 3 learning rates built in the rows, then preview."""
    page.click("text=New experiment on this dataset")
    page.wait_for_url(re.compile(r"/experiments/new/"))
    page.fill("#id_name", "first sweep")
    page.check("input[name=model_kind][value=preset]")
    page.select_option("#id_preset", "gpt2-micro")
    assert not page.is_visible("#id_n_layer")  # only the chosen model's fields show
    page.select_option("#id_strategy", "grid")
    page.fill("#id_budget", str(STEPS))
    page.select_option("#id_budget_unit", "steps")
    page.fill("#id_eval_every", str(EVAL_EVERY))
    # A small explicit budget, so that every trial is cut into several shards that take turns on a device.
    page.check("input[name=memory_budget][value=explicit]")
    page.fill("#id_memory_budget_mib", str(BUDGET_MIB))
    # The form starts with example rows: remove them, then add the learning-rate grid as a new row.
    rows = page.locator("#space-rows tbody tr.space-row")
    examples = rows.count()
    for i in range(examples):
        rows.nth(i).locator("input[name$='-DELETE']").check()
    page.click("#add-space-row")
    added = rows.nth(examples)
    added.locator("select[name$='-name']").select_option("lr")
    added.locator("select[name$='-kind']").select_option("categorical")
    added.locator("input[name$='-values']").fill(", ".join(LEARNING_RATES))
    page.click("button[name=action][value=preview]")
    page.wait_for_load_state()
    assert page.locator("#preview").count() == 1, _form_errors(page)
    assert page.inner_text("#preview h2").startswith("Preview: 3 trials")
    plan_rows = page.locator("#preview tbody tr")
    assert plan_rows.count() == 3
    for i in range(3):
        cells = plan_rows.nth(i).locator("td")
        assert cells.nth(1).inner_text().strip() == f"lr={LEARNING_RATES[i]}"
        assert cells.nth(2).inner_text() == str(STEPS)
        assert int(cells.nth(3).inner_text()) >= 2  # shards
        assert re.search(r"\d", cells.nth(4).inner_text())  # device peak, a size


def _form_errors(page) -> str:
    return "\n".join(page.locator(".errorlist, .errors").all_inner_texts()) or page.inner_text("main, body")


def _launch(page) -> int:
    page.click("button.primary[name=action][value=create]")
    page.wait_for_url(re.compile(r"/experiments/\d+/$"))
    experiment_id = int(re.search(r"/experiments/(\d+)/$", page.url)[1])
    assert page.locator("#trial-table tbody tr[data-trial]").count() == 3
    return experiment_id


def _watch_curves_grow(page) -> None:
    """The curves draw, then grow twice more with the live polls while the workers train."""
    page.click(".actions >> text=Learning curves")
    page.wait_for_selector("#curves-plot .main-svg")
    page.wait_for_function(f"() => ({RAW_POINTS_JS})() > 0", timeout=GROWTH_TIMEOUT_MS)
    seen = [page.evaluate(RAW_POINTS_JS)]
    live = []
    for _ in range(2):
        page.wait_for_function(f"() => ({RAW_POINTS_JS})() > {seen[-1]}", timeout=GROWTH_TIMEOUT_MS)
        seen.append(page.evaluate(RAW_POINTS_JS))
        live.append(page.is_visible("#live-indicator"))  # hidden again once the last trial finished
    print(f"learning curves: {seen} points across polls; live indicator {live}")
    assert live[0], "the page did not say it is live while the curves grew"


def _see_trials_share_a_device(page) -> None:
    page.click("nav.tabs >> text=Devices")
    page.wait_for_selector("#timeline-plot .main-svg")
    page.wait_for_function(f"() => Object.values(({LANE_TRIALS_JS})()).some(n => n >= 2)",
                           timeout=GROWTH_TIMEOUT_MS)
    print(f"device timeline: trials per lane {page.evaluate(LANE_TRIALS_JS)}")


def _wait_until_finished(page, stack: DevStack, experiment_id: int) -> None:
    page.click("nav.tabs >> text=Experiment")
    page.wait_for_url(f"{stack.url}/experiments/{experiment_id}/")
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    statuses: list[str] = []
    while True:
        statuses = page.eval_on_selector_all("#trial-table tbody tr[data-trial]",
                                             "rows => rows.map(r => r.dataset.status)")
        if statuses == ["finished"] * 3 or time.monotonic() > deadline:
            break
        assert not {"failed", "cancelled"} & set(statuses), page.inner_text("#trial-table")
        page.wait_for_timeout(2_000)
        page.reload()
    assert statuses == ["finished"] * 3, f"{statuses} after {FINISH_TIMEOUT_S:.0f} s\n{stack.log()}"
    assert page.inner_text("h1 .badge").strip().lower() == "finished"
    for row in page.locator("#trial-table tbody tr[data-trial]").all():
        assert row.locator("td").nth(3).inner_text() == f"{STEPS} / {STEPS}"
        assert re.fullmatch(r"\d+\.\d{4}", row.locator("td").nth(5).inner_text())  # best validation loss
        # The plan the device measured when it profiled the trial replaced the pre-launch estimate.
        assert re.match(r"\d+ shards, peak ", row.locator("td").nth(7).inner_text()), row.inner_text()
        assert "(est.)" not in row.locator("td").nth(7).inner_text()


def _download_a_model(page, tmp_path: Path) -> None:
    """A finished trial's model directory comes down as an archive that transformers could load."""
    page.locator("#trial-table tbody tr[data-trial]").first.locator("a.button", has_text="Model").click()
    page.wait_for_url(re.compile(r"/trials/\d+/$"))
    # The web worker packs the model; the page reloads itself until the download link is there.
    page.click(".actions >> text=Prepare model download")
    page.wait_for_selector(".actions >> text=Download model (.tar.gz)", timeout=60_000)
    with page.expect_download() as download:
        page.click(".actions >> text=Download model (.tar.gz)")
    archive = tmp_path / download.value.suggested_filename
    download.value.save_as(archive)
    with tarfile.open(archive) as tar:
        names = {Path(name).name for name in tar.getnames()}
    assert "config.json" in names and any(name.endswith(".safetensors") for name in names), names


def _see_leaderboard(page, screenshots_dir: Path) -> None:
    page.click(".actions >> text=Leaderboard")
    page.wait_for_url(re.compile(r"/leaderboards/\d+/$"))
    rows = page.locator("#team-board tbody tr")
    assert rows.count() == 3
    ranks = [rows.nth(i).locator("td").nth(0).inner_text() for i in range(3)]
    values = [float(rows.nth(i).locator("td").nth(1).inner_text()) for i in range(3)]
    assert ranks == ["1", "2", "3"] and values == sorted(values), (ranks, values)
    assert {rows.nth(i).locator("td.params").inner_text().strip() for i in range(3)} == {
        f"lr={lr}" for lr in LEARNING_RATES}
    _checked(page, screenshots_dir, "6-leaderboard")

    page.click("text=Chart")
    page.wait_for_selector("#leaderboard-plot .main-svg")
    assert page.locator("#leaderboard-table tbody tr").count() == 3
    _checked(page, screenshots_dir, "7-leaderboard-chart")


def test_a_new_user_trains_a_sweep_and_sees_it_ranked(page, devstack: DevStack, screenshots_dir, tmp_path):
    started = time.monotonic()
    _log_in(page, devstack)
    _checked(page, screenshots_dir, "1-home")

    _upload_dataset(page, devstack, _corpus(tmp_path / "python-prose.txt", min_bytes=6_000))
    _checked(page, screenshots_dir, "2-dataset")

    _build_experiment(page)
    _checked(page, screenshots_dir, "3-preview")
    experiment_id = _launch(page)
    _checked(page, screenshots_dir, "4-experiment-launched")

    _watch_curves_grow(page)
    _checked(page, screenshots_dir, "5-curves-live")
    _see_trials_share_a_device(page)
    _checked(page, screenshots_dir, "5-devices")

    _wait_until_finished(page, devstack, experiment_id)
    _checked(page, screenshots_dir, "5-experiment-finished")
    _download_a_model(page, tmp_path)
    _see_leaderboard(page, screenshots_dir)
    print(f"end to end: {time.monotonic() - started:.0f} s in the browser")
