"""A lab tunes a chat model on its preferences, in real Chromium against the real stack (`make run`'s devstack):
upload a JSONL file of preference pairs (one row of it bad), read its pairs on the dataset's page (the chosen
answer marked beside the rejected one, the bad row listed by line), sweep two DPO betas of SmolLM2-135M-Instruct
with LoRA on it, watch the chosen and rejected rewards appear on a trial's page as it trains, rank the trials by
preference accuracy on the leaderboard, ask the best one a question on its page, download its adapter and load it
on SmolLM2 with transformers and peft. No page may log an error.

Kept small for a 2-core machine: 2 steps per trial, one pair (two rows of 96 tokens at most) a step.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.browser.devstack import DevStack
from tests.browser.pages import upload_dataset
from tests.browser.test_chat_journey import QUESTION, _ask
from tests.browser.test_end_to_end import _checked, _log_in, _reload_until, _trial_rows
from tests.browser.test_pretrained_journey import (
    FINISH_TIMEOUT_S,
    _add_smollm2,
    create_from_preview,
    download_model,
    preview_smollm2_grid,
)

pytestmark = [pytest.mark.browser, pytest.mark.processes]

BETAS = [0.1, 0.5]
STEPS = 2
SPACE = f"""lr: [0.0005]
lora_r: [8]
dpo_beta: [{", ".join(map(str, BETAS))}]
batch_size: [2]
max_seq_len: [96]
warmup_steps: [0]
"""
PAIRS = 24
BAD_LINE = 5  # a row with no rejected answer
# Per trial, the rewards (chosen, rejected) and preference accuracy the trial page's reward figure draws.
REWARDS_JS = """() => {
    const plot = document.getElementById('rewards-plot');
    const curves = {};
    for (const t of (plot && plot.data) || []) {
        if (t.meta && ['chosen', 'rejected', 'accuracy'].includes(t.meta.role)) curves[t.meta.role] = Array.from(t.y);
    }
    return curves;
}"""


def _pairs(path: Path) -> Path:
    """`PAIRS` questions with a right, polite answer chosen over a wrong or rude one; line `BAD_LINE` lacks its
    rejected answer."""
    lines = []
    for n in range(PAIRS):
        a, b = 3 + n, 4 + 2 * n
        row = {"prompt": f"What is {a} plus {b}?", "chosen": f"{a} plus {b} is {a + b}.",
               "rejected": f"{a} plus {b} is {a + b + 1}." if n % 2 else "Work it out yourself."}
        lines.append(json.dumps(row))
    lines[BAD_LINE - 1] = json.dumps({"prompt": "What is 1 plus 1?", "chosen": "2."})
    path.write_text("\n".join(lines) + "\n")
    return path


def _upload_pairs(page, data: Path) -> None:
    """Upload the pairs through the dataset form; their page lists them, the chosen answer marked."""
    upload_dataset(page, data, "Sums, right or wrong")
    assert page.inner_text("#dataset-kind") == "Preference pairs"
    assert page.inner_text("#dataset-rows") == str(PAIRS)
    assert page.inner_text("#dataset-examples").startswith(f"{PAIRS - 1}:"), page.inner_text("#dataset-examples")
    assert page.inner_text("#dataset-bad-rows") == "1"
    bad = page.locator("#bad-rows tbody tr")
    assert bad.count() == 1 and bad.locator("td").nth(0).inner_text() == str(BAD_LINE), page.inner_text("#bad-rows")
    pairs = page.locator("#pairs-preview .pair")
    assert pairs.count() > 0, page.inner_text("main")
    first = pairs.first
    prompt = first.locator(".pair-prompt").inner_text()
    chosen = first.locator(".pair-chosen mark").inner_text()
    rejected = first.locator(".pair-rejected").inner_text()
    numbers = re.search(r"What is (\d+) plus (\d+)\?", prompt)
    assert numbers, prompt
    assert f"is {int(numbers[1]) + int(numbers[2])}." in chosen, (prompt, chosen)
    assert rejected.strip() and rejected != chosen, rejected


def _sweep_betas(page) -> int:
    """From the dataset page: DPO on SmolLM2 with LoRA, a grid over two betas pasted as YAML; preview, create,
    launch. Returns the experiment's id."""
    preview_smollm2_grid(page, name="dpo betas", space=SPACE, steps=STEPS, objective="dpo")
    plan_rows = page.locator("#preview tbody tr")
    assert plan_rows.count() == 2
    for i, beta in enumerate(BETAS):
        assert f"dpo_beta={beta}" in plan_rows.nth(i).locator("td").nth(1).inner_text(), plan_rows.nth(i).inner_text()
    return create_from_preview(page)


def _watch_rewards_appear(page, stack: DevStack, experiment_id: int) -> int:
    """The first trial's page, opened as the sweep starts, draws its rewards by itself once its first step is
    done; returns the trial's id, back on the experiment's page."""
    trial = min(_trial_rows(page))
    page.goto(f"{stack.url}/trials/{trial}/")
    page.wait_for_selector("#rewards-plot .main-svg", timeout=FINISH_TIMEOUT_S * 1000)
    assert page.evaluate(REWARDS_JS)["chosen"], page.evaluate(REWARDS_JS)
    page.goto(f"{stack.url}/experiments/{experiment_id}/")
    return trial


def _see_rewards(page, stack: DevStack, trial: int, screenshots_dir: Path) -> None:
    """The trial's page draws its chosen and rejected rewards and its preference accuracy at every step, beside
    its DPO loss."""
    page.goto(f"{stack.url}/trials/{trial}/")
    deadline = time.monotonic() + 60
    while True:  # a trial can say finished before the ingest stored its last step's figures
        curves = page.evaluate(REWARDS_JS)
        if len(curves) == 3 and all(len(values) == STEPS for values in curves.values()):
            break
        assert time.monotonic() < deadline, f"not every reward drawn: {curves}"
        page.wait_for_timeout(1_000)
        page.reload()
    print(f"trial {trial}: rewards {curves}")
    assert all(0 <= accuracy <= 1 for accuracy in curves["accuracy"]), curves
    # The first step's policy is its reference, whose implicit rewards are 0.
    assert abs(curves["chosen"][0]) < 1e-3 and abs(curves["rejected"][0]) < 1e-3, curves
    loss_axis = page.evaluate("() => document.getElementById('curves-plot').layout.yaxis.title.text")
    assert loss_axis == "DPO loss (nats/pair)", loss_axis
    page.locator("#trial-rewards").scroll_into_view_if_needed()
    _checked(page, screenshots_dir, "preference-3-rewards")


def _ranked_by_preference_accuracy(page, stack: DevStack, dataset_url: str, screenshots_dir: Path) -> int:
    """The dataset's leaderboard, switched to preference accuracy, says so and ranks both trials highest first,
    ties to the higher reward margin; returns the best's id."""
    page.goto(dataset_url)
    page.click("section.card a.button:text-is('Leaderboard')")
    page.wait_for_url(re.compile(r"/leaderboards/\d+/$"))
    assert "DPO loss" in page.inner_text("#ranked-by")  # a preference dataset's default
    page.select_option("#board-metric", "reward_accuracy")
    page.wait_for_url(re.compile(r"/leaderboards/\d+/\?metric=reward_accuracy$"))
    ranked_by = page.inner_text("#ranked-by")
    assert ranked_by.startswith("Ranked by Preference accuracy (chosen answer rewarded higher): higher is better; "
                                "ties go to the higher reward margin"), ranked_by
    assert page.get_attribute("#team-board th.ranked", "aria-sort") == "descending"
    rows = page.locator("#team-board tbody tr")
    deadline = time.monotonic() + 60
    while rows.count() < 2 or "No final evaluations" in page.inner_text("#team-board"):
        # a trial says finished once its last unit is done; its final figures reach the board with the ingest
        assert time.monotonic() < deadline, page.inner_text("#team-board")
        page.wait_for_timeout(1_000)
        page.reload()
    assert rows.count() == 2, page.inner_text("#team-board")
    accuracies = [float(rows.nth(i).locator("td.ranked").inner_text()) for i in range(2)]
    assert accuracies == sorted(accuracies, reverse=True) and all(0 <= a <= 1 for a in accuracies), accuracies
    # On 2 held-out pairs the accuracy is 0, 1/2 or 1: a tie is usual, and the larger margin breaks it.
    margins = [float(rows.nth(i).locator("td[data-field=reward_margin]").inner_text()) for i in range(2)]
    assert accuracies[0] > accuracies[1] or margins[0] >= margins[1], (accuracies, margins)
    betas = sorted(float(re.search(r"dpo_beta=([\d.]+)", rows.nth(i).locator("td.params").inner_text())[1])
                   for i in range(2))
    assert betas == BETAS, page.inner_text("#team-board")
    for field in ("val_loss", "reward_margin", "bpb"):
        assert re.fullmatch(r"-?\d+\.\d{4}", rows.nth(0).locator(f"td[data-field={field}]").inner_text()), field
    _checked(page, screenshots_dir, "preference-4-leaderboard")
    href = rows.nth(0).locator("a[href*='/trials/']").get_attribute("href")
    return int(re.search(r"/trials/(\d+)/", href)[1])


def _use_the_adapter(adapter: Path, smollm2_dir: Path) -> None:
    """peft loads the downloaded adapter on SmolLM2, with the download's tokenizer; the tuned model answers."""
    tokenizer = AutoTokenizer.from_pretrained(adapter, local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, local_files_only=True)
    tuned = PeftModel.from_pretrained(base, adapter).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = tuned.generate(**prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             pad_token_id=tokenizer.eos_token_id)
    new = out[0, prompt["input_ids"].shape[1]:]
    text = tokenizer.decode(new, skip_special_tokens=True)
    print(f"the downloaded adapter on SmolLM2 answers {QUESTION!r} with {text!r}")
    assert len(new) == 6 and text.strip(), text


def test_a_lab_tunes_a_chat_model_on_its_preferences(page, devstack: DevStack, screenshots_dir, tmp_path):
    started = time.monotonic()
    marks: dict[str, float] = {}
    _log_in(page, devstack)
    _add_smollm2(page, devstack)
    _upload_pairs(page, _pairs(tmp_path / "sums.jsonl"))
    dataset_url = page.url
    marks["dataset"] = time.monotonic()
    _checked(page, screenshots_dir, "preference-1-pairs")
    experiment_id = _sweep_betas(page)
    first = _watch_rewards_appear(page, devstack, experiment_id)
    _reload_until(page, "finish of both trials",
                  lambda now: all(row.status == "finished" for row in now.values()), FINISH_TIMEOUT_S)
    marks["trained"] = time.monotonic()
    _checked(page, screenshots_dir, "preference-2-finished")
    _see_rewards(page, devstack, first, screenshots_dir)
    best = _ranked_by_preference_accuracy(page, devstack, dataset_url, screenshots_dir)
    _ask(page, devstack, best)
    marks["generated"] = time.monotonic()
    _checked(page, screenshots_dir, "preference-5-answer")
    adapter = download_model(page, best, tmp_path, kind="adapter")
    marks["downloaded"] = time.monotonic()
    _use_the_adapter(adapter, devstack.data_dir / "models" / "smollm2-135m-instruct")
    steps = ", ".join(f"{name} at {at - started:.0f} s" for name, at in marks.items())
    print(f"experiment {experiment_id}: {steps}; done at {time.monotonic() - started:.0f} s")
