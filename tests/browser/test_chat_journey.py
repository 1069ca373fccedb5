"""A lab tunes a chat model on its own conversations, in real Chromium against the real stack (`make run`'s
devstack): upload a JSONL file of conversations (one row of it bad), read its preview (the answers the loss
trains on marked, the bad row listed by line), sweep two LoRA ranks of SmolLM2-135M-Instruct on it (the web
worker renders the conversations with SmolLM2's own chat template), rank the trials by the bits per byte of the
held-out answers, read the best one's answers to held-out prompts beside the references and ask it a question
on its page, download it and load it with transformers and peft:
its tokenizer renders a conversation exactly as SmolLM2's does. No page may log an error.

Kept small for a 2-core machine: 2 steps per trial, 2 packed rows of 128 tokens a step.
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
from tests.browser.test_end_to_end import _checked, _log_in, _reload_until
from tests.browser.test_pretrained_journey import (
    FINISH_TIMEOUT_S,
    _add_smollm2,
    create_from_preview,
    download_model,
    preview_smollm2_grid,
)

pytestmark = [pytest.mark.browser, pytest.mark.processes]

RANKS = [4, 8]
STEPS = 2
SPACE = f"""lr: [0.001]
lora_r: [{", ".join(map(str, RANKS))}]
batch_size: [2]
max_seq_len: [128]
packing: [true]
warmup_steps: [0]
"""
QUESTION = "How do I reverse a list in Python?"
# The web worker generates one at a time: each trial's three held-out answers (SmolLM2 loaded each time), then
# the user's question.
GENERATION_TIMEOUT_MS = 300_000
CONVERSATION = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Call reversed()."}]


def _conversations(path: Path) -> Path:
    """60 short support conversations, some with a system turn or two rounds, and one bad row (line 7: a
    message without a role)."""
    topics = [("sort a list", "Use sorted(items)."), ("read a file", "Use open(path).read()."),
              ("join strings", "Use ', '.join(parts)."), ("count words", "Use len(text.split()).")]
    lines = []
    for n in range(60):
        ask, answer = topics[n % len(topics)]
        messages = [{"role": "user", "content": f"How do I {ask} in Python? ({n})"},
                    {"role": "assistant", "content": answer}]
        if n % 3 == 0:
            messages.insert(0, {"role": "system", "content": "You answer Python questions in one line."})
        if n % 5 == 0:
            messages += [{"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "Any time."}]
        lines.append(json.dumps({"messages": messages}))
    lines[6] = json.dumps({"messages": [{"content": "no role here"}, {"role": "assistant", "content": "Hm."}]})
    path.write_text("\n".join(lines) + "\n")
    return path


def _upload_and_preview(page, data: Path) -> None:
    upload_dataset(page, data, "Python support chats")
    assert page.inner_text("#dataset-kind") == "Chat messages"
    assert page.inner_text("#dataset-rows") == "60"
    assert page.inner_text("#dataset-examples").startswith("59:"), page.inner_text("#dataset-examples")
    assert page.inner_text("#dataset-bad-rows") == "1"
    bad = page.locator("#bad-rows tbody tr")
    assert bad.count() == 1 and bad.locator("td").nth(0).inner_text() == "7", page.inner_text("#bad-rows")
    marked = page.locator("#examples-preview pre mark").all_inner_texts()
    assert marked and all(text.endswith("<|im_end|>\n") for text in marked), marked


def _sweep_ranks(page) -> int:
    """From the dataset page: a grid over two LoRA ranks of SmolLM2 pasted as YAML; preview, create, launch."""
    preview_smollm2_grid(page, name="support chat ranks", space=SPACE, steps=STEPS)
    return create_from_preview(page)


def _ranked_by_answer_bits_per_byte(page, screenshots_dir: Path) -> int:
    """The leaderboard ranks both trials by the bits per byte of the held-out answers; returns the best's id."""
    page.click(".actions >> text=Leaderboard")
    page.wait_for_url(re.compile(r"/leaderboards/\d+/$"))
    assert "Chat messages" in page.inner_text("#board-kind")
    assert "scoring only the answers' tokens" in page.inner_text("#measured-on")
    rows = page.locator("#team-board tbody tr")
    deadline = time.monotonic() + 60
    while rows.count() < 2 or "No final evaluations" in page.inner_text("#team-board"):
        # a trial says finished once its last unit is done; its final figures reach the board with the ingest
        assert time.monotonic() < deadline, page.inner_text("#team-board")
        page.wait_for_timeout(1_000)
        page.reload()
    assert rows.count() == 2, page.inner_text("#team-board")
    values = [float(rows.nth(i).locator("td").nth(1).inner_text()) for i in range(2)]
    assert values == sorted(values) and all(0 < v < 8 for v in values), values
    ranks = sorted(int(re.search(r"lora_r=(\d+)", rows.nth(i).locator("td.params").inner_text())[1])
                   for i in range(2))
    assert ranks == RANKS, page.inner_text("#team-board")
    assert rows.nth(0).locator("[data-field=template]").inner_text() == "the model's own, else ChatML"
    _checked(page, screenshots_dir, "chat-3-leaderboard")
    href = rows.nth(0).locator("a[href*='/trials/']").get_attribute("href")
    return int(re.search(r"/trials/(\d+)/", href)[1])


def _see_held_out_answers(page, stack: DevStack, best: int) -> None:
    """The best trial's page answers its first held-out prompts (the web worker's greedy generations, made when
    the trial ended) beside the references."""
    page.goto(f"{stack.url}/trials/{best}/")
    rows = page.locator("#held-out [data-line]")
    assert rows.count() == 3, page.inner_text("main")
    page.wait_for_function("() => [...document.querySelectorAll('#held-out [data-line]')]"
                           ".every(row => row.dataset.status === 'done')", timeout=GENERATION_TIMEOUT_MS)
    for i in range(3):
        reference = rows.nth(i).locator(".held-out-reference").inner_text()
        answer = rows.nth(i).locator(".held-out-answer").inner_text()
        print(f"held-out line {rows.nth(i).get_attribute('data-line')}: {reference!r} -> {answer!r}")
        assert reference.strip() and answer.strip()


def _ask(page, stack: DevStack, best: int) -> None:
    page.goto(f"{stack.url}/trials/{best}/")
    for field, value in {"prompt": QUESTION, "max_new_tokens": "12", "temperature": "0", "top_p": "1",
                         "seed": "0"}.items():
        page.fill(f"#id_{field}", value)
    page.click("#generation-form button[type=submit]")
    page.wait_for_url(re.compile(rf"/trials/{best}/#generation-\d+$"))
    card = page.locator(".generation").first
    page.wait_for_selector(f"#{card.get_attribute('id')}[data-status=done]", timeout=GENERATION_TIMEOUT_MS)
    answer = page.text_content(f"#{card.get_attribute('id')} .generation-continuation")
    print(f"the best trial answers {QUESTION!r} with {answer!r}")
    assert answer and answer.strip() and "<|im_start|>" not in answer and "assistant\n" not in answer, answer


def _use_the_downloads(directory: Path, adapter: Path, smollm2_dir: Path) -> None:
    """The download's tokenizer renders a conversation as SmolLM2's own does; the adapter alone, which names
    its base by its Hub id, on SmolLM2 (peft) and the merged model (transformers) answer alike."""
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    original = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    for generation_prompt in (False, True):
        conversation = CONVERSATION[:1] if generation_prompt else CONVERSATION
        assert tokenizer.apply_chat_template(conversation, add_generation_prompt=generation_prompt) == \
            original.apply_chat_template(conversation, add_generation_prompt=generation_prompt)
    prompt = tokenizer.apply_chat_template(CONVERSATION[:1], add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    merged = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_dir, local_files_only=True),
                                      adapter).eval()
    with torch.no_grad():
        merged_logits = merged(**prompt).logits
        tuned_logits = tuned(**prompt).logits
    torch.testing.assert_close(merged_logits, tuned_logits, rtol=1e-4, atol=1e-4)


def test_a_lab_tunes_a_chat_model_on_its_conversations(page, devstack: DevStack, screenshots_dir, tmp_path):
    started = time.monotonic()
    _log_in(page, devstack)
    _add_smollm2(page, devstack)
    _upload_and_preview(page, _conversations(tmp_path / "support.jsonl"))
    _checked(page, screenshots_dir, "chat-1-preview")
    experiment_id = _sweep_ranks(page)
    _reload_until(page, "finish of both trials",
                  lambda now: all(row.status == "finished" for row in now.values()), FINISH_TIMEOUT_S)
    _checked(page, screenshots_dir, "chat-2-finished")
    best = _ranked_by_answer_bits_per_byte(page, screenshots_dir)
    _see_held_out_answers(page, devstack, best)
    _ask(page, devstack, best)
    _checked(page, screenshots_dir, "chat-4-answer")
    directory = download_model(page, best, tmp_path)
    assert not (directory / "adapter").exists()  # the merged model alone; the adapter is the other download
    adapter = download_model(page, best, tmp_path, kind="adapter")
    page.locator("#downloads").scroll_into_view_if_needed()
    _checked(page, screenshots_dir, "chat-5-downloads")
    _use_the_downloads(directory, adapter, devstack.data_dir / "models" / "smollm2-135m-instruct")
    print(f"experiment {experiment_id}: done at {time.monotonic() - started:.0f} s")
