"""The whole product as a new user meets it, in real Chromium against the real stack (`make run`'s devstack):
log in, upload a corpus, build a 3-trial search space, preview, launch, pause a trial, watch real CPU workers
train the others (units of different trials taking turns on one device), resume it, watch the live curves,
see every trial finish with falling losses, download the best model and generate text with it, see the
trials ranked, then clone the sweep into a long run and cancel it. No page may log an error."""

from __future__ import annotations

import math
import re
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from tests.browser.devstack import DevStack
from tests.browser.pages import upload_dataset
from worker.engine.config import DataSpec

pytestmark = [pytest.mark.browser, pytest.mark.processes]

LEARNING_RATES = ["0.0003", "0.001", "0.003"]
STEPS = 160
LONG_STEPS = 5_000  # the cloned run, cancelled long before it could finish
EVAL_EVERY = 20
BUDGET_MIB = 8
GROWTH_TIMEOUT_MS = 60_000
FINISH_TIMEOUT_S = 180.0
STATE_TIMEOUT_S = 90.0  # for a trial to reach a state the test waits for (paused, running, cancelled)

# Sum of the points drawn in the raw (unsmoothed) loss trace of every trial.
RAW_POINTS_JS = """() => document.getElementById('curves-plot').data
    .filter(t => t.meta && t.meta.role === 'raw').reduce((n, t) => n + t.x.length, 0)"""
# Per device lane of the timeline, the trials of its units in the order they started, a run of units of one
# trial counted once: [A, B, A] means B's units ran on that device between two of A's.
LANE_RUNS_JS = """() => {
    const units = [];
    for (const t of document.getElementById('timeline-plot').data) {
        if (!t.meta || t.meta.role !== 'units') continue;
        t.y.forEach((lane, i) => units.push([lane, t.base[i], t.meta.trial]));
    }
    units.sort((a, b) => a[1] - b[1]);
    const lanes = {};
    for (const [lane, , trial] of units) {
        const runs = lanes[lane] = lanes[lane] || [];
        if (runs[runs.length - 1] !== trial) runs.push(trial);
    }
    return lanes;
}"""
# Per trial, the train losses (raw, not smoothed) and validation losses the learning-curves page draws.
LOSSES_JS = """() => {
    const losses = {};
    for (const t of document.getElementById('curves-plot').data) {
        if (!t.meta || (t.meta.role !== 'raw' && t.meta.role !== 'eval')) continue;
        (losses[t.meta.trial] = losses[t.meta.trial] || {})[t.meta.role] = Array.from(t.y);
    }
    return losses;
}"""
# The experiment page's trial table, by trial id: status, steps done and best validation loss of each trial.
TRIAL_ROWS_JS = """rows => Object.fromEntries(rows.map(r => [r.dataset.trial, {
    status: r.dataset.status,
    step: parseInt(r.querySelector('td[data-field=step]').innerText, 10),
    best_val_loss: parseFloat(r.querySelector('td[data-field=best_val_loss]').innerText) || null,
}]))"""


@dataclass(frozen=True)
class Row:
    """A trial as the experiment page's table shows it."""

    status: str
    step: int  # steps done
    best_val_loss: float | None


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


def _upload_dataset(page, stack: DevStack, corpus: Path) -> int:
    """Upload `corpus`; returns the size of the vocabulary its tokenizer was trained to."""
    upload_dataset(page, corpus, "Python prose", vocab_size=384, ready_s=60)
    facts = page.inner_text("dl.facts")
    assert f"({corpus.stat().st_size} bytes)" in facts, facts
    tokens = re.search(r"Tokens\s+(\d+)", facts)
    split = re.search(r"Train / validation\s+(\d+) / (\d+) tokens", facts)
    vocabulary = re.search(r"Vocabulary\s+(\d+) tokens", facts)
    assert tokens and split and vocabulary, facts
    assert int(split[1]) + int(split[2]) == int(tokens[1]) > 0, facts
    assert 0 < int(split[2]) < int(split[1]), facts
    assert 256 < int(vocabulary[1]) <= 384, facts  # every byte, plus the merges the corpus allowed
    return int(vocabulary[1])


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


def _launch(page, *, trials: int) -> int:
    page.click("button.primary[name=action][value=create]")
    page.wait_for_url(re.compile(r"/experiments/\d+/$"))
    experiment_id = int(re.search(r"/experiments/(\d+)/$", page.url)[1])
    assert page.locator("#trial-table tbody tr[data-trial]").count() == trials
    return experiment_id


def _see_the_page_follow_its_trials(page) -> None:
    """Once launched, the experiment page shows its trials train by itself: a trial's status and steps move
    on the page it is, with no reload."""
    page.evaluate("() => { window.notReloaded = true; }")  # gone if the page reloads
    page.wait_for_function(
        "() => [...document.querySelectorAll('#trial-table tbody tr[data-trial]')].some(row => "
        "row.dataset.status === 'running' && parseInt(row.querySelector('td[data-field=step]').innerText, 10) > 0)",
        timeout=STATE_TIMEOUT_S * 1000)
    assert page.evaluate("() => window.notReloaded") is True
    assert page.inner_text("h1 .badge").strip() == "running"


def _trial_rows(page) -> dict[int, Row]:
    rows = page.eval_on_selector_all("#trial-table tbody tr[data-trial]", TRIAL_ROWS_JS)
    return {int(trial): Row(**row) for trial, row in rows.items()}


def _reload_until(page, what: str, until: Callable[[dict[int, Row]], bool],
                  timeout_s: float = STATE_TIMEOUT_S) -> dict[int, Row]:
    """Reload the experiment page until its trial table satisfies `until`; returns that table.

    Fails at once when a trial failed (nothing the test waits for includes a failure).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        rows = _trial_rows(page)
        assert all(row.status != "failed" for row in rows.values()), page.inner_text("#trial-table")
        if until(rows):
            return rows
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f} s: {rows}"
        page.wait_for_timeout(1_000)
        page.reload()


def _click_control(page, trial: int, control: str) -> None:
    page.locator(f'#trial-table tr[data-trial="{trial}"] button', has_text=control).click()
    page.wait_for_load_state()


def _stays_put_while_others_train(page, trial: int) -> Row:
    """`trial` has stopped (paused or cancelled): reload the experiment page until the other trials have
    trained `EVAL_EVERY` more steps and require that `trial` did not move meanwhile; returns its row.

    Steps reach the table through the telemetry ingest, which lags the statuses. Two ingest passes that
    added steps of the others settle it: the second began after the first ended, after `trial` stopped, so
    it read every step `trial` took.
    """
    def others(rows: dict[int, Row]) -> int:
        return sum(row.step for other, row in rows.items() if other != trial)

    rows = _trial_rows(page)
    for _ in range(2):
        before = others(rows)
        rows = _reload_until(page, "steps of the other trials", lambda now, before=before: others(now) > before)
    settled, target = rows[trial], others(rows) + EVAL_EVERY
    rows = _reload_until(page, f"{EVAL_EVERY} more steps of the other trials", lambda now: others(now) >= target)
    assert rows[trial] == settled, f"trial {trial} moved from {settled} to {rows[trial]} while stopped"
    return settled


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


def _pause_a_trial(page, screenshots_dir: Path) -> tuple[int, Row]:
    """From the experiment page: pause the trial that has done the fewest steps, once every trial trains (until
    then, two trials on two devices may each keep their own, and the third one's turn is what shows SHARP's turns
    on a device). It stops while the others train on. Returns the trial and its row as it stopped."""
    def under_way(rows: dict[int, Row]) -> list[int]:
        return [t for t, row in rows.items() if row.status in ("runnable", "running") and row.step > 0]

    rows = _reload_until(page, "every trial under way", lambda now: len(under_way(now)) == len(now))
    trial = min(under_way(rows), key=lambda t: rows[t].step)
    _click_control(page, trial, "Pause")
    _reload_until(page, f"pause of trial {trial}", lambda now: now[trial].status == "paused")
    paused = _stays_put_while_others_train(page, trial)
    assert 0 < paused.step < STEPS, paused
    _checked(page, screenshots_dir, "5-trial-paused")
    print(f"paused trial {trial} at step {paused.step} while the others trained on")
    return trial, paused


def _see_trials_take_turns_on_a_device(page) -> None:
    """SHARP: some device ran a unit of one trial, then of another, then of the first again.

    Seen while a trial is paused, so a pause cannot fake it: the paused trial runs nothing meanwhile.
    """
    page.click(".actions >> text=Devices")
    page.wait_for_selector("#timeline-plot .main-svg")
    page.wait_for_function(
        f"() => Object.values(({LANE_RUNS_JS})()).some(runs => new Set(runs).size < runs.length)",
        timeout=GROWTH_TIMEOUT_MS)
    lanes = page.evaluate(LANE_RUNS_JS)
    print("device timeline, trials in turn per lane: " + "; ".join(
        f"{lane}: {runs[:12]}{' ...' if len(runs) > 12 else ''}" for lane, runs in lanes.items()))


def _resume(page, stack: DevStack, experiment_id: int, trial: int, paused: Row) -> None:
    """Resume the paused trial: it trains again (and finishes with the others, see `_wait_until_finished`)."""
    page.click("nav.tabs >> text=Experiment")
    page.wait_for_url(f"{stack.url}/experiments/{experiment_id}/")
    assert _trial_rows(page)[trial] == paused
    _click_control(page, trial, "Resume")
    _reload_until(page, f"resume of trial {trial}", lambda now: now[trial].step > paused.step)


def _wait_until_finished(page, stack: DevStack, experiment_id: int) -> None:
    page.goto(f"{stack.url}/experiments/{experiment_id}/")
    _reload_until(page, "finish of every trial",
                         lambda now: all(row.status == "finished" for row in now.values()), FINISH_TIMEOUT_S)
    assert page.inner_text("h1 .badge").strip().lower() == "finished"
    for row in page.locator("#trial-table tbody tr[data-trial]").all():
        assert row.locator("td[data-field=step]").inner_text() == f"{STEPS} / {STEPS}"
        assert re.fullmatch(r"\d+\.\d{4}", row.locator("td[data-field=best_val_loss]").inner_text())
        # The plan the device measured when it profiled the trial replaced the pre-launch estimate.
        assert re.match(r"\d+ shards, peak ", row.locator("td[data-field=plan]").inner_text()), row.inner_text()
        assert "(est.)" not in row.locator("td[data-field=plan]").inner_text()


def _see_losses_fall(page, *, vocab_size: int) -> tuple[dict[int, Row], dict[int, dict[str, list[float]]]]:
    """Every trial learned: its last training loss is below its first, and the best validation loss the
    experiment page shows is the lowest of its curve and below both its first training loss and ln(vocabulary),
    the loss of a model that finds every token equally likely.

    Returns the experiment page's trials and the losses the learning-curves page draws, per trial
    (``{"raw": train losses, "eval": validation losses}``).
    """
    page.click(".actions >> text=Learning curves")
    page.wait_for_selector("#curves-plot .main-svg")
    # A trial's status can say finished before the ingest has stored its last evaluation.
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while not all(len(curve.get("eval", [])) == STEPS // EVAL_EVERY for curve in page.evaluate(LOSSES_JS).values()):
        assert time.monotonic() < deadline, f"not every evaluation drawn: {page.evaluate(LOSSES_JS)}"
        page.wait_for_timeout(1_000)
        page.reload()
        page.wait_for_selector("#curves-plot .main-svg")
    losses = {int(trial): curve for trial, curve in page.evaluate(LOSSES_JS).items()}
    page.go_back()
    page.reload()
    rows = _trial_rows(page)
    assert losses.keys() == rows.keys(), (losses.keys(), rows.keys())
    uniform = math.log(vocab_size)
    for trial, curve in losses.items():
        train, evals, best = curve["raw"], curve["eval"], rows[trial].best_val_loss
        print(f"trial {trial}: train loss {train[0]:.3f} -> {train[-1]:.3f}, validation "
              f"{', '.join(f'{v:.3f}' for v in evals)}; best {best}; ln(vocabulary) {uniform:.3f}")
        assert len(train) >= 2 and all(map(math.isfinite, train + evals)), curve
        assert train[-1] < train[0], f"trial {trial} did not learn: train loss {train[0]} -> {train[-1]}"
        assert best is not None and best == pytest.approx(min(evals), abs=1e-4), (best, evals)
        assert best < min(train[0], uniform), (best, train[0], uniform)
    return rows, losses


def _download_the_best_model(page, stack: DevStack, rows: dict[int, Row],
                             tmp_path: Path) -> tuple[int, Path, dict[str, Any]]:
    """The best trial's page: its own curves and its parameters as given, then its model downloaded and
    unpacked. Returns the trial, the model directory and the engine spec the stack trained it with."""
    best = min(rows, key=lambda trial: rows[trial].best_val_loss)
    page.locator(f'#trial-table tr[data-trial="{best}"] td a').first.click()
    page.wait_for_url(re.compile(rf"/trials/{best}/$"))
    page.wait_for_selector("#curves-plot .main-svg")
    evals = page.evaluate("() => document.getElementById('curves-plot').data.find(t => t.meta.role === 'eval').x")
    assert evals == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)), evals  # at the steps they were measured after
    settings = page.inner_text("#trial-settings")
    assert "dropout" in settings and "/" not in settings  # the defaults that applied, and no server path
    spec = stack.trial_spec(best)
    # The web worker packs the model; the download card shows its progress, then the link, by itself.
    page.click("#download-model >> text=Prepare model")
    page.wait_for_selector("#download-model >> text=Download model (.tar.gz)", timeout=60_000)
    with page.expect_download() as download:
        page.click("#download-model >> text=Download model (.tar.gz)")
    archive = tmp_path / download.value.suggested_filename
    download.value.save_as(archive)
    unpacked = tmp_path / "model"
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    (directory,) = unpacked.iterdir()
    return best, directory, spec


def _use_the_model(directory: Path, spec: dict[str, Any], *, final_val_loss: float) -> None:
    """transformers loads the download; on the held-out text the engine's final evaluation covered (every
    validation token, in blocks of the sequence length and a last shorter one) it scores the per-token loss the
    page drew for the last evaluation (so it holds the trained weights), and it writes text that the dataset's
    tokenizer decodes (the archive ships no tokenizer)."""
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    data = DataSpec(**spec["data"])
    tokenizer = Tokenizer.from_file(str(Path(data.tokens_path).with_name("tokenizer.json")))
    assert model.config.vocab_size == tokenizer.get_vocab_size()

    held_out = torch.from_numpy(np.load(data.tokens_path)[data.val_start:data.val_start + data.holdout_tokens]
                                .astype(np.int64))
    summed, predicted = 0.0, 0
    with torch.no_grad():
        for block in held_out.split(data.seq_len):
            if len(block) < 2:
                continue
            logits = model(block[None]).logits[0, :-1]
            summed += torch.nn.functional.cross_entropy(logits.float(), block[1:], reduction="sum").item()
            predicted += len(block) - 1
    loss = summed / predicted
    print(f"downloaded model: validation loss {loss:.5f}; the page's last evaluation {final_val_loss:.5f}")
    assert loss == pytest.approx(final_val_loss, abs=1e-3)

    prompt = tokenizer.encode("The while statement").ids
    new_tokens = 12
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
    assert out.shape == (1, len(prompt) + new_tokens)
    text = tokenizer.decode(out[0].tolist())
    print(f"downloaded model writes: {text!r}")
    assert text.startswith("The while statement") and len(text) > len("The while statement"), text


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
    _checked(page, screenshots_dir, "7-leaderboard")

    page.click("text=Chart")
    page.wait_for_selector("#leaderboard-plot .main-svg")
    assert page.locator("#leaderboard-table tbody tr").count() == 3
    _checked(page, screenshots_dir, "8-leaderboard-chart")


def _clone_into_a_long_run_and_cancel_it(page, stack: DevStack, experiment_id: int, screenshots_dir: Path) -> None:
    """Clone the sweep with two learning rates and a budget far beyond the test's patience, launch it, cancel
    one trial while it trains (it stops while the other trains on), then cancel the rest."""
    page.goto(f"{stack.url}/experiments/{experiment_id}/")
    page.click(".actions >> text=Clone")
    page.wait_for_url(re.compile(r"/experiments/new/\?clone="))
    page.fill("#id_name", "long run")
    page.fill("#id_budget", str(LONG_STEPS))
    rows = page.locator("#space-rows tbody tr.space-row")
    assert rows.count() == 1  # the sweep's one parameter, cloned
    rows.first.locator("input[name$='-values']").fill(", ".join(LEARNING_RATES[1:]))
    long_id = _launch(page, trials=2)
    # Its trials outlast the watch (the sweep's may all finish within a poll on an idle machine).
    _watch_curves_grow(page)
    _checked(page, screenshots_dir, "9-curves-live")
    page.goto(f"{stack.url}/experiments/{long_id}/")

    rows = _reload_until(page, "steps of both trials", lambda now: all(row.step > 0 for row in now.values()))
    trial = min(rows)
    _click_control(page, trial, "Cancel")
    _reload_until(page, f"cancel of trial {trial}", lambda now: now[trial].status == "cancelled")
    cancelled = _stays_put_while_others_train(page, trial)
    assert 0 < cancelled.step < LONG_STEPS, cancelled
    assert page.locator(f'#trial-table tr[data-trial="{trial}"] a.button', has_text="Model").count() == 0
    print(f"cancelled trial {trial} at step {cancelled.step} while the other trained on")

    page.click("button.danger >> text=Cancel all")
    page.wait_for_url(f"{stack.url}/experiments/{long_id}/")
    rows = _reload_until(page, "cancel of every trial",
                         lambda now: all(row.status == "cancelled" for row in now.values()))
    assert all(row.step < LONG_STEPS for row in rows.values()), rows
    assert page.inner_text("h1 .badge").strip().lower() == "stopped"
    _checked(page, screenshots_dir, "9-long-run-cancelled")


def test_a_new_user_trains_a_sweep_and_sees_it_ranked(page, devstack: DevStack, screenshots_dir, tmp_path):
    started = time.monotonic()
    _log_in(page, devstack)
    _checked(page, screenshots_dir, "1-home")

    vocab_size = _upload_dataset(page, devstack, _corpus(tmp_path / "python-prose.txt", min_bytes=6_000))
    _checked(page, screenshots_dir, "2-dataset")

    _build_experiment(page)
    _checked(page, screenshots_dir, "3-preview")
    experiment_id = _launch(page, trials=3)
    _checked(page, screenshots_dir, "4-experiment-launched")
    _see_the_page_follow_its_trials(page)

    trial, paused = _pause_a_trial(page, screenshots_dir)
    _see_trials_take_turns_on_a_device(page)
    _checked(page, screenshots_dir, "5-devices")
    _resume(page, devstack, experiment_id, trial, paused)

    _wait_until_finished(page, devstack, experiment_id)
    _checked(page, screenshots_dir, "6-experiment-finished")
    rows, losses = _see_losses_fall(page, vocab_size=vocab_size)
    best, model_dir, spec = _download_the_best_model(page, devstack, rows, tmp_path)
    _use_the_model(model_dir, spec, final_val_loss=losses[best]["eval"][-1])
    page.click("h1 a")  # the trial page's way back to its experiment
    _see_leaderboard(page, screenshots_dir)

    _clone_into_a_long_run_and_cancel_it(page, devstack, experiment_id, screenshots_dir)
    print(f"end to end: {time.monotonic() - started:.0f} s in the browser")
