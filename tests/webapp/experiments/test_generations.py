"""Text generation on a finished trial's page: the web worker continues a prompt with the trained model and the
tokenizer its tokens were made with; only the trial's team asks or sees; bad settings are refused by field."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from tests.webapp.experiments.factories import make_experiment
from tests.webapp.team_factories import join
from tests.webapp.web_worker import CLOSED_PORT_URL, redis_at
from webapp.background.reconcile import WebWorkReconciled, web_work_reconcile
from webapp.experiments import archives, generations
from webapp.ground.models import Generation, Trial, TrialArchive

pytestmark = pytest.mark.django_db
PROMPT = "The quick brown fox"
SETTINGS = {"prompt": PROMPT, "max_new_tokens": "8", "temperature": "0", "top_p": "1", "seed": "0"}


def finished(trial: Trial) -> Trial:
    """`trial` as a finished first attempt whose export the worker wrote (or will: the test writes it)."""
    trial.queue_id, trial.attempt, trial.status = str(trial.pk), 1, Trial.Status.FINISHED
    trial.export_path = str(trial.export_dir_for(trial.queue_id))
    trial.save()
    return trial


def random_export(trial: Trial, *, n_positions: int = 64) -> Trial:
    """`trial` finished with an untrained tiny GPT-2 of its dataset's vocabulary as its export (no tokenizer
    in it, like the exports the engine wrote before it copied the tokenizer)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    finished(trial)
    torch.manual_seed(0)  # the same weights every run
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=n_positions,
                        vocab_size=trial.experiment.dataset.vocab_size)
    GPT2LMHeadModel(config).save_pretrained(trial.export_path)
    return trial


def trained_export(trial: Trial, spill_dir: Path) -> Trial:
    """`trial` finished after training a 2-layer GPT-2 for real with the engine, in this process, on its
    dataset's token ids, and exported with the dataset's tokenizer as the device worker does at the end of a
    trial."""
    from worker.engine import DataSpec, ModelSpec, OptimizerSpec, TrialSpec

    dataset = trial.experiment.dataset
    spec = TrialSpec(
        model=ModelSpec(n_layer=2, n_embd=32, n_head=2, vocab_size=dataset.vocab_size, n_positions=64, dropout=0.0),
        data=DataSpec(tokens_path=str(dataset.tokens_path), seq_len=32, val_fraction=dataset.val_fraction,
                      tokenizer_dir=str(dataset.directory)),
        optimizer=OptimizerSpec(kind="adamw", lr=1e-2), batch_size=4, micro_batches=1, steps=6, eval_every=3,
        eval_batches=1, seed=0)
    return train_and_export(trial, spec, spill_dir)


def train_and_export(trial: Trial, spec: Any, spill_dir: Path) -> Trial:
    """`trial` finished after the engine trained `spec` (a ``TrialSpec``) in this process, in one shard, and
    exported it as a device worker does at the end of a trial."""
    import torch

    from worker.engine import TrialSession, trial_create

    finished(trial)
    trial.spec = spec.to_dict()
    trial.save()
    cpu = torch.device("cpu")
    trial_create(spec=spec, spill_dir=spill_dir, trial_id=trial.queue_id, device=cpu, cuts=[0])
    session = TrialSession.open(spill_dir=spill_dir, trial_id=trial.queue_id, device=cpu)
    while session.next_unit() is not None:
        session.run_unit()
    session.export(Path(trial.export_path))
    session.close()
    return trial


def greedy_continuation(trial: Trial, prompt: str, max_new_tokens: int) -> str:
    """What the trial's model continues `prompt` with, taking the likeliest token each time until the end of
    text, computed here with transformers on the export and the dataset's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(trial.experiment.dataset.tokenizer_path),
                                        eos_token="<|endoftext|>")
    model = AutoModelForCausalLM.from_pretrained(trial.export_path, local_files_only=True).eval()
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    new: list[int] = []
    with torch.no_grad():
        while len(new) < max_new_tokens and (not new or new[-1] != tokenizer.eos_token_id):
            new.append(int(model(ids).logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[new[-1]]])], dim=1)
    return tokenizer.decode(new, skip_special_tokens=True)


def generate(client: Client, trial: Trial, **settings: str):
    return client.post(reverse("trial_generate", args=[trial.pk]), {**SETTINGS, **settings})


def test_the_web_worker_continues_a_prompt_with_the_trained_model(alice, alice_team, alice_dataset, data_dir,
                                                                   web_worker):
    client = Client()
    client.force_login(alice)
    trial = trained_export(make_experiment(alice_team, alice_dataset).trials.first(), data_dir / "spill")
    assert (Path(trial.export_path) / "tokenizer_config.json").is_file()  # the export's own tokenizer serves
    response = generate(client, trial)
    greedy = Generation.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("trial_detail", args=[trial.pk]) + f"#generation-{greedy.pk}"
    for _ in range(2):
        assert generate(client, trial, temperature="0.9", top_p="0.8", seed="5").status_code == 302
    web_worker.wait(lambda: not Generation.objects.filter(status=Generation.Status.PENDING).exists(), 120,
                    "the generations")

    greedy.refresh_from_db()
    assert greedy.status == Generation.Status.DONE, greedy.message
    assert greedy.text == greedy_continuation(trial, PROMPT, 8) and greedy.text.strip()
    first, second = Generation.objects.exclude(pk=greedy.pk)
    assert first.status == second.status == Generation.Status.DONE
    assert first.text == second.text  # the same settings and seed give the same text
    page = client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    assert page.count('class="card generation"') == 3 and "data-poll" not in page
    assert "greedy (temperature 0) · seed 0" in page and "temperature 0.9 · top-p 0.8 · seed 5" in page
    assert f'<span class="generation-continuation">{escape(greedy.text)}</span>' in page


def test_a_generation_is_asked_for_in_the_request_and_done_outside_it(alice_client, alice_team, alice_dataset):
    trial = random_export(make_experiment(alice_team, alice_dataset).trials.first())
    response = generate(alice_client, trial, temperature="0.7", top_p="0.9", seed="42")
    generation = Generation.objects.get()
    # This test runs without a web worker: the request only recorded the wish.
    assert (generation.status, generation.text, generation.created_by, generation.queue_id) == (
        Generation.Status.PENDING, "", trial.experiment.team.members.get(), trial.queue_id)
    page = alice_client.get(response["Location"]).content.decode()
    poll = reverse("trial_generation", args=[trial.pk, generation.pk])
    assert f'data-poll="{poll}"' in page and "poll_cards.js" in page and "Generating…" in page
    assert "temperature 0.7 · top-p 0.9 · seed 42" in page
    assert 'value="42"' in page  # the prompt box keeps the last settings, to try a variation
    fragment = alice_client.get(poll).content.decode()
    assert f'id="generation-{generation.pk}"' in fragment and 'http-equiv="refresh"' in fragment

    for _ in range(generations.MAX_PENDING_PER_TEAM - 1):
        assert generate(alice_client, trial).status_code == 302
    refused = generate(alice_client, trial)
    assert refused.status_code == 400 and "already waits for" in refused.content.decode()
    assert Generation.objects.count() == generations.MAX_PENDING_PER_TEAM


def test_another_teams_user_can_neither_generate_nor_see_generations(alice, alice_client, bob_client, alice_team,
                                                                     alice_dataset, bob_team, bob_dataset):
    bobs = random_export(make_experiment(bob_team, bob_dataset).trials.first())
    assert generate(bob_client, bobs).status_code == 302
    generation = Generation.objects.get()
    assert generate(alice_client, bobs).status_code == 404
    assert alice_client.get(reverse("trial_generation", args=[bobs.pk, generation.pk])).status_code == 404
    assert PROMPT not in alice_client.get(reverse("trial_detail", args=[bobs.pk])).content.decode()
    alices = make_experiment(alice_team, alice_dataset).trials.first()  # bob's generation under alice's trial
    assert alice_client.get(reverse("trial_generation", args=[alices.pk, generation.pk])).status_code == 404
    assert Generation.objects.count() == 1
    with pytest.raises(generations.PermissionDenied):  # the service checks the actor whatever calls it
        generations.generation_request(trial=bobs, actor=alice, settings=generations.Settings(
            prompt=PROMPT, max_new_tokens=4, temperature=0.0, top_p=1.0, seed=0))


@pytest.mark.parametrize(("field", "value", "error"), [
    ("prompt", "   ", "Write some text for the model to continue."),
    ("prompt", "x" * (Generation.PROMPT_MAX_CHARS + 1), "at most 4000 characters"),
    ("prompt", "a\x00b", "Null characters are not allowed."),
    ("max_new_tokens", "0", "greater than or equal to 1"),
    ("max_new_tokens", "257", "less than or equal to 256"),
    ("max_new_tokens", "64", "This model reads at most 64 tokens at once"),
    ("max_new_tokens", "ten", "Enter a whole number."),
    ("temperature", "-0.1", "greater than or equal to 0"),
    ("temperature", "2.5", "less than or equal to 2"),
    ("temperature", "nan", "Enter a number."),
    ("top_p", "0", "greater than or equal to 0.01"),
    ("top_p", "1.5", "less than or equal to 1"),
    ("seed", "-1", "greater than or equal to 0"),
    ("seed", str(2**31), "less than or equal to 2147483647"),
])
def test_bad_settings_are_refused_with_field_errors(alice_client, alice_team, alice_dataset, field, value, error):
    trial = random_export(make_experiment(alice_team, alice_dataset).trials.first(), n_positions=64)
    response = generate(alice_client, trial, **{field: value})
    assert response.status_code == 400
    form = response.context["generation_form"]
    assert any(error in message for message in form.errors[field]), form.errors
    assert error in response.content.decode().replace("&#x27;", "'")
    assert not Generation.objects.exists()


def test_a_trial_without_an_exported_model_says_why_it_cannot_generate(alice_client, alice_team, alice_dataset):
    trial = make_experiment(alice_team, alice_dataset).trials.first()
    page = alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    assert "Text generation needs a finished trial with an exported model; trial #1 is not launched." in page
    assert 'id="generation-form"' not in page
    response = generate(alice_client, trial)
    assert response.status_code == 400 and "trial #1 is not launched" in response.content.decode()

    finished(trial)  # finished, but its export is not there
    response = generate(alice_client, trial)
    assert response.status_code == 400
    assert "Trial #1 has no exported model to generate with" in response.content.decode()
    assert not Generation.objects.exists()


def test_a_generation_of_a_retried_trial_fails_with_a_message(alice_client, alice_team, alice_dataset):
    trial = random_export(make_experiment(alice_team, alice_dataset).trials.first())
    generate(alice_client, trial)
    trial.queue_id, trial.attempt = f"{trial.pk}.2", 2  # retried before the web worker got to it
    trial.save()
    generation = Generation.objects.get()
    generations.trial_generate(generation_id=generation.pk)
    generation.refresh_from_db()
    assert generation.status == Generation.Status.FAILED
    assert generation.message == "The trial's model is gone (deleted or retried)."


def test_the_download_carries_the_tokenizer_that_made_the_tokens(alice, alice_team, alice_dataset, tmp_path):
    from transformers import AutoTokenizer
    from transformers import PreTrainedTokenizerFast as Fast

    trial = random_export(make_experiment(alice_team, alice_dataset).trials.first())
    assert not (Path(trial.export_path) / "tokenizer.json").exists()
    archive = archives.trial_archive_request(trial=trial)
    archives.trial_archive_build(archive_id=archive.pk)  # what the web worker runs
    archive.refresh_from_db()
    assert archive.status == TrialArchive.Status.READY, archive.message
    with tarfile.open(fileobj=io.BytesIO(archive.path.read_bytes()), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    unpacked = tmp_path / archives.download_name(trial, "model")
    assert json.loads((unpacked / "tokenizer_config.json").read_text())["model_max_length"] == 64
    tokenizer = AutoTokenizer.from_pretrained(unpacked, local_files_only=True)
    assert tokenizer.eos_token == "<|endoftext|>"
    ids = Fast(tokenizer_file=str(alice_dataset.tokenizer_path))(PROMPT)["input_ids"]
    assert tokenizer(PROMPT)["input_ids"] == ids and tokenizer.decode(ids) == PROMPT


def test_every_member_of_the_team_may_generate_not_only_who_may_change_the_trial(alice, alice_team, alice_dataset,
                                                                                 bob, bob_client):
    join(alice_team, alice, bob)  # bob is a member of Alice lab: he may not control alice's trial
    trial = random_export(make_experiment(alice_team, alice_dataset).trials.first())
    page = bob_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    assert 'id="generation-form"' in page and "Delete…" not in page
    assert generate(bob_client, trial).status_code == 302
    assert Generation.objects.get().created_by == bob


def test_a_model_too_large_for_the_web_workers_memory_is_refused_before_it_loads(alice_client, alice_team,
                                                                                  alice_dataset, monkeypatch):
    trial = random_export(make_experiment(alice_team, alice_dataset).trials.first())
    generate(alice_client, trial)
    monkeypatch.setattr(generations, "MEMORY_FACTOR", 2**40)  # as if the host had a millionth of its memory free
    generation = Generation.objects.get()
    generations.trial_generate(generation_id=generation.pk)
    generation.refresh_from_db()
    assert generation.status == Generation.Status.FAILED
    assert "would not fit in the web worker's free memory" in generation.message


def test_a_model_that_does_not_load_fails_its_generation_with_why(alice_client, alice_team, alice_dataset):
    trial = random_export(make_experiment(alice_team, alice_dataset).trials.first())
    (Path(trial.export_path) / "model.safetensors").write_bytes(b"not a safetensors file")
    generate(alice_client, trial)
    generation = Generation.objects.get()
    generations.trial_generate(generation_id=generation.pk)
    generation.refresh_from_db()
    assert generation.status == Generation.Status.FAILED and generation.message.startswith("Generating failed: ")
    page = alice_client.get(reverse("trial_detail", args=[trial.pk])).content.decode()
    assert escape(generation.message) in page


def test_a_llama_family_export_generates_with_the_tokenizer_saved_in_it(alice_client, alice_team, alice_dataset):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    trial = finished(make_experiment(alice_team, alice_dataset).trials.first())
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=alice_dataset.vocab_size, max_position_embeddings=64,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(trial.export_path)
    PreTrainedTokenizerFast(tokenizer_file=str(alice_dataset.tokenizer_path), eos_token="<|endoftext|>",
                            bos_token="<|endoftext|>").save_pretrained(trial.export_path)
    assert generate(alice_client, trial, max_new_tokens="5").status_code == 302
    generation = Generation.objects.get()
    generations.trial_generate(generation_id=generation.pk)  # what the web worker runs
    generation.refresh_from_db()
    assert generation.status == Generation.Status.DONE, generation.message
    assert generation.text


def test_a_generation_asked_for_while_redis_is_down_says_so_and_is_sent_once_it_is_back(
        alice_client, alice_team, alice_dataset, settings, django_capture_on_commit_callbacks, scheduler):
    """The send lands in the web queue of `scheduler`'s throw-away host, which is deleted afterwards."""
    trial = random_export(make_experiment(alice_team, alice_dataset).trials.first())
    with redis_at(settings, CLOSED_PORT_URL):
        with django_capture_on_commit_callbacks(execute=True):  # the send, once the request's writes commit
            response = generate(alice_client, trial)
        assert response.status_code == 302
        page = alice_client.get(response["Location"]).content.decode()
    generation = Generation.objects.get()
    assert generation.status == Generation.Status.PENDING and generation.send_error
    assert "The background worker could not be reached (" in page
    assert web_work_reconcile() == WebWorkReconciled(sent=1, failed=0)  # Redis is back: the ingest's pass
    generation.refresh_from_db()
    assert generation.send_error == "" and generation.send_attempts == 2
