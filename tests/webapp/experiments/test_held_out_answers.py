"""A finished chat trial's page shows its model's answers to the first held-out examples beside their own: the
finished event asks for them once an attempt, the web worker answers each conversation as rendered by the
export's chat template, the page shows them escaped and polls the pending ones, they take no place of the
team's generations, a corpus or text rows ask none, and another team sees none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from tests.webapp.datasets.factories import make_dataset, upload_and_build
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_chat_generation import chat_trained_export
from tests.webapp.experiments.test_generations import SETTINGS, finished
from webapp.accounts.models import Team
from webapp.datasets.models import Dataset
from webapp.experiments import events, generations
from webapp.ground.models import Generation, Trial

pytestmark = pytest.mark.django_db
ANSWERS = [("What is two plus two?", "Four."), ("Is <b>1</b> < 2?", "Yes: <b>1</b> < 2 & 2 > 1."),
           ("Say hello.", "Hello!")]


def conversation(k: int) -> list[dict[str, str]]:
    """The `k`th row's messages: one exchange, and every third row a second one, whose answer is the last."""
    question, answer = ANSWERS[k % len(ANSWERS)]
    turns = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    if k % 3 == 2:
        turns += [{"role": "user", "content": "Again?"}, {"role": "assistant", "content": answer}]
    return turns


ROWS = [conversation(k) for k in range(24)]  # line L of the file is ROWS[L - 1]


def chat_dataset(client: Client, rows: list[dict[str, object]], filename: str = "chat.jsonl") -> Dataset:
    dataset = upload_and_build(client, filename, "".join(json.dumps(row) + "\n" for row in rows).encode())
    assert dataset.is_ready, dataset.message
    return dataset


def validation_lines(dataset: Dataset) -> list[int]:
    """The lines of the dataset's validation examples, in its order (its records after the training ones)."""
    records = dataset.records_path.read_text(encoding="utf-8").splitlines()
    return [json.loads(record)["line"] for record in records[dataset.train_examples:]]


def running_with_export(trial: Trial) -> Trial:
    """`trial` running its first attempt, its export already written (an empty folder: no model reads it)."""
    finished(trial)
    Path(trial.export_path).mkdir(parents=True)
    trial.status = Trial.Status.RUNNING
    trial.save()
    return trial


def finish(trial: Trial) -> None:
    """Apply the scheduler's finished event to `trial`, as the ingest does."""
    assert events.trial_event_apply(trial_id=trial.queue_id, status=Trial.Status.FINISHED)


def greedy_reply(trial: Trial, messages: list[dict[str, str]], max_new_tokens: int) -> str:
    """The likeliest tokens, one at a time, after the conversation as the export's own tokenizer renders it
    with the assistant's turn opened, until the end of the turn or of the model's context: computed here
    with transformers alone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trial.export_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(trial.export_path, local_files_only=True).eval()
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    budget = min(max_new_tokens, model.config.max_position_embeddings - ids.shape[1])
    new: list[int] = []
    with torch.no_grad():
        while len(new) < budget and (not new or new[-1] != tokenizer.eos_token_id):
            new.append(int(model(ids).logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[new[-1]]])], dim=1)
    return tokenizer.decode(new, skip_special_tokens=True)


def test_a_finished_chat_trial_asks_once_for_its_answers_to_the_first_held_out_examples(alice_client, alice_team):
    dataset = chat_dataset(alice_client, [{"messages": row} for row in ROWS])
    trial = running_with_export(make_experiment(alice_team, dataset).trials.first())

    finish(trial)
    finish(trial)  # the same event delivered twice asks nothing more

    lines = validation_lines(dataset)[:generations.HELD_OUT_SHOWN]
    assert len(lines) == 3 and any(len(ROWS[line - 1]) > 2 for line in lines)  # a second exchange among them
    held_out = list(Generation.objects.order_by("held_out_line"))
    assert [g.held_out_line for g in held_out] == lines
    for generation in held_out:
        row = ROWS[generation.held_out_line - 1]
        assert generation.messages == row[:-1] and generation.reference == row[-1]["content"]
        assert generation.prompt == row[-2]["content"]  # the question the page shows
        assert (generation.status, generation.queue_id, generation.created_by) == (
            Generation.Status.PENDING, trial.queue_id, None)
        assert (generation.temperature, generation.seed, generation.max_new_tokens) == (0.0, 0, 64)
        assert generation.resend_at is not None  # sent to the web worker once the event commits


def test_the_web_worker_answers_each_conversation_as_a_greedy_decoding_of_its_template(alice_client, alice_team,
                                                                                       data_dir):
    dataset = chat_dataset(alice_client, [{"messages": row} for row in ROWS])
    trial = chat_trained_export(make_experiment(alice_team, dataset).trials.first(), data_dir / "spill")
    Trial.objects.filter(pk=trial.pk).update(status=Trial.Status.RUNNING)
    finish(trial)

    held_out = list(Generation.objects.order_by("held_out_line"))
    assert len(held_out) == generations.HELD_OUT_SHOWN
    for generation in held_out:
        generations.trial_generate(generation_id=generation.pk)  # as the web worker does
        generation.refresh_from_db()
        assert generation.status == Generation.Status.DONE, generation.message
        assert generation.text == greedy_reply(trial, generation.messages, generation.max_new_tokens)
        assert "<|im_end|>" not in generation.text and "assistant\n" not in generation.text
    page = alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    for generation in held_out:
        assert f'<pre class="corpus held-out-answer">{escape(generation.text)}</pre>' in page


def test_the_page_shows_each_question_reference_and_answer_escaped_and_polls_while_one_is_pending(
        alice_client, alice_team):
    dataset = chat_dataset(alice_client, [{"messages": row} for row in ROWS])
    trial = running_with_export(make_experiment(alice_team, dataset).trials.first())
    finish(trial)
    page_url = reverse("trial_detail", args=[trial.pk])

    page = alice_client.get(page_url).content.decode()
    assert 'id="held-out"' in page and f'data-poll="{page_url}"' in page and "poll_cards.js" in page
    assert page.count('data-status="pending"') == 1 + generations.HELD_OUT_SHOWN  # the card and each row
    assert 'class="card generation" id="generation-' not in page  # the ordinary list leaves them out

    first, second, third = Generation.objects.order_by("held_out_line")
    Generation.objects.filter(pk=first.pk).update(status=Generation.Status.DONE, text="<i>Yes</i> & <b>no</b>")
    Generation.objects.filter(pk=second.pk).update(status=Generation.Status.DONE, text="Four.")
    Generation.objects.filter(pk=third.pk).update(status=Generation.Status.FAILED, message="The <model> is gone.")
    page = alice_client.get(page_url).content.decode()
    assert "data-poll" not in page and "poll_cards.js" not in page
    for generation in (first, second, third):
        generation.refresh_from_db()
        assert f'data-line="{generation.held_out_line}" data-status="{generation.status}"' in page
        assert f"</span> {escape(generation.prompt)}</h3>" in page
        assert f'<pre class="corpus held-out-reference">{escape(generation.reference)}</pre>' in page
        if len(generation.messages) > 1:
            assert f"After {len(generation.messages) - 1} earlier turns of the conversation" in page
    assert '<pre class="corpus held-out-answer">&lt;i&gt;Yes&lt;/i&gt; &amp; &lt;b&gt;no&lt;/b&gt;</pre>' in page
    assert '<pre class="corpus held-out-answer">Four.</pre>' in page
    assert '<p class="message error held-out-answer">The &lt;model&gt; is gone.</p>' in page
    assert "<b>1</b>" not in page and "<i>Yes</i>" not in page


def test_held_out_answers_take_no_place_of_the_teams_generations(alice_client, alice_team):
    dataset = chat_dataset(alice_client, [{"messages": row} for row in ROWS])
    trial = running_with_export(make_experiment(alice_team, dataset).trials.first())
    finish(trial)
    assert Generation.objects.filter(status=Generation.Status.PENDING).count() == generations.HELD_OUT_SHOWN

    generate = reverse("trial_generate", args=[trial.pk])
    for _ in range(generations.MAX_PENDING_PER_TEAM):
        assert alice_client.post(generate, SETTINGS).status_code == 302
    refused = alice_client.post(generate, SETTINGS)
    assert refused.status_code == 400 and "already waits for" in refused.content.decode()
    assert Generation.objects.filter(held_out_line__isnull=True).count() == generations.MAX_PENDING_PER_TEAM


def test_a_corpus_or_text_rows_ask_for_no_held_out_answers(alice_client, alice_team):
    corpus = make_dataset(alice_team)
    text_rows = chat_dataset(alice_client, [{"text": f"Line {k} of plain text."} for k in range(24)], "text.jsonl")
    assert text_rows.kind == Dataset.Kind.TEXT
    for dataset in (corpus, text_rows):
        trial = running_with_export(make_experiment(alice_team, dataset, name=dataset.name).trials.first())
        finish(trial)
        assert 'id="held-out"' not in alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    assert not Generation.objects.exists()


def test_another_team_sees_no_held_out_answers(alice_client, bob_client, alice_team, bob_team: Team):
    dataset = chat_dataset(alice_client, [{"messages": row} for row in ROWS])
    trial = running_with_export(make_experiment(alice_team, dataset).trials.first())
    finish(trial)
    generation = Generation.objects.first()

    assert bob_client.get(reverse("trial_detail", args=[trial.pk])).status_code == 404
    assert bob_client.get(reverse("trial_generation", args=[trial.pk, generation.pk])).status_code == 404


def test_a_held_out_example_with_a_null_character_is_asked_for_with_a_replacement_character(alice_client, alice_team):
    """A dataset built before uploads refused NUL may hold one in a turn; PostgreSQL's text cannot, so the
    question is kept with U+FFFD and the trial's finished event applies."""
    dataset = chat_dataset(alice_client, [{"messages": row} for row in ROWS])
    records = dataset.records_path.read_text(encoding="utf-8").splitlines()
    first = json.loads(records[dataset.train_examples])
    question = len(first["messages"]) - 2  # the turn the last answer replies to
    first["messages"][question]["content"] = "What is \x00 plus two?"
    records[dataset.train_examples] = json.dumps(first)
    dataset.records_path.write_text("\n".join(records) + "\n", encoding="utf-8")
    trial = running_with_export(make_experiment(alice_team, dataset).trials.first())

    finish(trial)

    trial.refresh_from_db()
    asked = Generation.objects.get(held_out_line=first["line"])
    assert trial.status == Trial.Status.FINISHED
    assert asked.prompt == "What is \ufffd plus two?"
    if connection.vendor == "postgresql":  # SQLite keeps JSON as text, where the escape \u0000 is harmless
        assert asked.messages[question]["content"] == "What is \ufffd plus two?"
