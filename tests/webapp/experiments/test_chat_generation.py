"""Generation on the page of a trial trained on chat data: the prompt is a user's turn, rendered with the chat
template the trial trained with (which its export carries), and the answer ends at the end of the turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.datasets.factories import upload_and_build
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.test_generations import SETTINGS, train_and_export
from webapp.experiments import generations
from webapp.ground.models import Generation, Trial

pytestmark = pytest.mark.django_db
QUESTIONS = [("What is two plus two?", "Four."), ("Name a colour.", "Blue."), ("Say hello.", "Hello!")] * 8
STEPS = 60  # enough for a tiny model to learn the three answers by heart


def chat_trained_export(trial: Trial, spill_dir: Path) -> Trial:
    """`trial` finished after the engine trained a tiny Llama on its chat dataset's examples, in this process,
    and exported it as a device worker does at the end of a trial."""
    from worker.engine import DataSpec, ModelSpec, OptimizerSpec, TrialSpec
    from worker.engine.chat import DEFAULT_CHAT_TEMPLATE

    dataset = trial.experiment.dataset
    spec = TrialSpec(
        model=ModelSpec(family="llama", n_layer=2, n_embd=32, n_head=2, vocab_size=dataset.vocab_size,
                        n_positions=64, dropout=0.0),
        data=DataSpec(examples_dir=str(dataset.examples_dir), train_examples=dataset.train_examples, seq_len=64,
                      packing=True, tokenizer_dir=str(dataset.directory), chat_template=DEFAULT_CHAT_TEMPLATE),
        optimizer=OptimizerSpec(kind="adamw", lr=1e-2), batch_size=4, micro_batches=1, steps=STEPS, seed=0)
    return train_and_export(trial, spec, spill_dir)


def greedy_answer(trial: Trial, question: str, max_new_tokens: int) -> str:
    """The likeliest tokens, one at a time, after the chat prompt the download's own tokenizer renders, until
    the end of the turn: computed here with transformers alone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trial.export_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(trial.export_path, local_files_only=True).eval()
    assert tokenizer.eos_token == "<|im_end|>"
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    new: list[int] = []
    with torch.no_grad():
        while len(new) < max_new_tokens and (not new or new[-1] != tokenizer.eos_token_id):
            new.append(int(model(ids).logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[new[-1]]])], dim=1)
    return tokenizer.decode(new, skip_special_tokens=True)


def test_a_chat_trial_answers_the_prompt_as_a_users_turn_of_its_template(alice, alice_team, data_dir):
    client = Client()
    client.force_login(alice)
    rows = "".join(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                   + "\n" for q, a in QUESTIONS)
    dataset = upload_and_build(client, "chat.jsonl", rows.encode())
    assert dataset.is_ready and dataset.is_instruction, dataset.message
    trial = chat_trained_export(make_experiment(alice_team, dataset).trials.first(), data_dir / "spill")

    response = client.post(reverse("trial_generate", args=[trial.pk]),
                           {**SETTINGS, "prompt": "What is two plus two?", "max_new_tokens": "6"})
    assert response.status_code == 302
    generation = Generation.objects.get()
    generations.trial_generate(generation_id=generation.pk)  # as the web worker does

    generation.refresh_from_db()
    assert generation.status == Generation.Status.DONE, generation.message
    assert generation.text == greedy_answer(trial, "What is two plus two?", 6) == "Four."
