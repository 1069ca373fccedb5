"""A chat template is checked by the web worker, never in a request, once per template text; and every later
rendering of a template that is not ours (a dataset's build for a checkpoint, a generation's prompt, a
held-out answer) runs under the same limits as the check, so that a template that passes the check and then
loops or swells on other data fails that dataset or that generation with why, and nothing else."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.api.conftest import api_for
from tests.webapp.datasets.factories import upload_and_build
from tests.webapp.experiments.checkpoints import ready_checkpoint
from tests.webapp.experiments.factories import make_experiment
from tests.webapp.experiments.instruction import chat_checkpoint, chat_dataset, templates_checked
from tests.webapp.experiments.test_chat_generation import QUESTIONS, chat_trained_export
from tests.webapp.experiments.test_forms import post_data
from tests.webapp.experiments.test_generations import SETTINGS
from webapp.catalog.selectors import checkpoint_dir
from webapp.datasets.models import DatasetTokens, template_sha256
from webapp.datasets.services import dataset_tokens_build, dataset_tokens_request
from webapp.experiments import generations
from webapp.ground.models import ChatTemplateCheck, Experiment, Generation
from worker.engine import template_sandbox

pytestmark = pytest.mark.django_db
TEMPLATE = ("{% for m in messages %}{{ '### ' + m['role'] + ' <' + '\\n' + m['content'] + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '### assistant <\\n' }}{% endif %}")
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def guarded(condition: str) -> str:
    """`TEMPLATE`, looping for ever on a conversation where `condition` holds."""
    return f"{{% if {condition} %}}{LOOP}{{% endif %}}" + TEMPLATE


@pytest.fixture
def chat(alice_team):
    return chat_dataset(alice_team)


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(template_sandbox, "RENDER_SECONDS", 2.0)


def on_checkpoint(checkpoint, dataset, **fields):
    return post_data(dataset, action="preview", model_kind="checkpoint", checkpoint=checkpoint.pk,
                     rows=[{"name": "max_seq_len", "kind": "categorical", "values": "64"},
                           {"name": "batch_size", "kind": "categorical", "values": "2"}], **fields)


def test_the_form_asks_the_web_worker_to_check_a_template_and_keeps_its_verdict(
        alice, alice_client, chat, django_capture_on_commit_callbacks):
    checkpoint = ready_checkpoint(alice)
    data = on_checkpoint(checkpoint, chat, chat_template=TEMPLATE)
    started = time.monotonic()
    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(reverse("experiment_create"), data)
    assert time.monotonic() - started < 5  # nothing rendered in the request

    assert response.status_code == 400
    assert response.context["form"].errors["chat_template"] == [
        "The web worker is checking this chat template: it renders a sample conversation with it, within 20 s and "
        "2 GiB of memory. Submit again in a few seconds."]
    check = ChatTemplateCheck.objects.get()
    assert (check.digest, check.status, check.send_attempts) == (template_sha256(TEMPLATE), "checking", 1)
    poll = reverse("chat_template_check", args=[check.digest])
    assert f'data-poll="{poll}"' in response.content.decode()
    assert alice_client.get(poll).json() == {"status": "checking", "message": ""}

    assert templates_checked() == 1  # the web worker's task
    assert alice_client.get(poll).json() == {
        "status": "ok", "message": "The chat template passed its check: submit the form again."}
    assert alice_client.post(reverse("experiment_create"), data).status_code == 200
    assert alice_client.post(reverse("experiment_create"), on_checkpoint(  # another form, the same text: no wait
        checkpoint, chat, chat_template=TEMPLATE, name="again")).status_code == 200
    assert ChatTemplateCheck.objects.count() == 1 and templates_checked() == 0


def test_a_refused_template_says_why_on_the_form_and_in_the_poll(alice, alice_client, chat):
    checkpoint = ready_checkpoint(alice)
    broken = "{% for m in messages %}"
    data = on_checkpoint(checkpoint, chat, chat_template=broken)
    alice_client.post(reverse("experiment_create"), data)
    templates_checked()

    response = alice_client.post(reverse("experiment_create"), data)
    assert response.status_code == 400
    [error] = response.context["form"].errors["chat_template"]
    assert error.startswith("The chat template fails: TemplateSyntaxError")
    verdict = alice_client.get(reverse("chat_template_check", args=[template_sha256(broken)])).json()
    assert verdict["status"] == "refused" and verdict["message"].startswith("the chat template fails")
    assert alice_client.get(reverse("chat_template_check", args=["0" * 64])).status_code == 404
    assert Client().get(reverse("chat_template_check", args=[template_sha256(broken)])).status_code == 302


def test_the_api_answers_400_while_the_template_is_checked_then_creates(alice, alice_team, chat):
    checkpoint = ready_checkpoint(alice)
    body = {"name": "templated", "dataset": chat.pk, "space": {
        "model": {"checkpoint": checkpoint.name}, "max_seq_len": [64], "batch_size": [2]},
        "chat_template": TEMPLATE, "budget": 5, "eval_every": 5, "memory_budget_mib": 256}
    api = api_for(alice)
    waiting = api.post("/experiments", body)
    assert waiting.status_code == 400
    assert waiting.json()["errors"]["chat_template"][0].startswith("The web worker is checking this chat template")
    templates_checked()
    created = api.post("/experiments", body)
    assert created.status_code == 201, created.content
    assert Experiment.objects.get().chat_template == TEMPLATE


def test_a_checkpoints_template_that_loops_once_it_meets_an_eos_token_fails_its_datasets_build(
        alice, chat, quick):
    """A checkpoint's own template, typed by nobody here: the probe alone has no eos_token, every real
    tokenizer has one. The build stops at the limit, with the template's fault in the dataset's message."""
    checkpoint = chat_checkpoint(alice, template=guarded("eos_token"))
    tokens = dataset_tokens_request(dataset=chat, tokenizer_sha256=checkpoint.tokenizer_sha256,
                                    tokenizer_dir=str(checkpoint_dir(checkpoint)), model_name=checkpoint.name)
    started = time.monotonic()
    dataset_tokens_build(tokens_id=tokens.pk)  # as the web worker does
    assert time.monotonic() - started < 30

    tokens.refresh_from_db()
    assert tokens.status == DatasetTokens.Status.FAILED
    assert "TemplateLimitError: the chat template takes over 2 s to render a 5-turn conversation" in tokens.message


def test_an_experiments_template_that_passes_its_check_and_loops_on_a_row_fails_its_datasets_build(
        alice, chat, quick):
    """The check's probe conversation never says "kilogram"; rows of the dataset do."""
    template = guarded("'kilogram' in messages | map(attribute='content') | join")
    checkpoint = chat_checkpoint(alice)
    first_row = next(json.loads(line) for line in chat.records_path.read_text().splitlines()
                     if "kilogram" in line)
    tokens = dataset_tokens_request(dataset=chat, tokenizer_sha256=checkpoint.tokenizer_sha256,
                                    tokenizer_dir=str(checkpoint_dir(checkpoint)), model_name=checkpoint.name,
                                    chat_template=template)
    dataset_tokens_build(tokens_id=tokens.pk)

    tokens.refresh_from_db()
    assert tokens.status == DatasetTokens.Status.FAILED
    assert f"TemplateLimitError: line {first_row['line']}: the chat template takes over 2 s" in tokens.message


def test_a_generation_whose_prompt_makes_the_template_loop_fails_alone(alice, alice_team, alice_client, data_dir,
                                                                      quick):
    """The export carries the template its trial trained with; one that loops on some prompt fails that
    generation at the limit, and the next generation renders in a new sandbox."""
    rows = "".join(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                   + "\n" for q, a in QUESTIONS)
    dataset = upload_and_build(alice_client, "chat.jsonl", rows.encode())
    trial = chat_trained_export(make_experiment(alice_team, dataset).trials.first(), data_dir / "spill")
    template_file = Path(trial.export_path) / "chat_template.jinja"
    assert template_file.is_file()
    template_file.write_text(guarded("'BOOM' in messages[-1]['content']"))

    for prompt in ("BOOM?", "What is two plus two?"):
        response = alice_client.post(reverse("trial_generate", args=[trial.pk]),
                                     {**SETTINGS, "prompt": prompt, "max_new_tokens": "4"})
        assert response.status_code == 302
    boom, fine = Generation.objects.order_by("pk")
    for generation in (boom, fine):
        generations.trial_generate(generation_id=generation.pk)  # as the web worker does
        generation.refresh_from_db()
    assert boom.status == Generation.Status.FAILED
    assert boom.message.startswith("The model's chat template cannot render this conversation: the chat template "
                                   "takes over 2 s to render a 1-turn conversation")
    assert fine.status == Generation.Status.DONE, fine.message  # the next one, in a new sandbox


def test_the_web_worker_checks_the_template_and_the_forms_poll_sees_the_verdict(alice, alice_team, web_worker):
    client = Client()
    client.force_login(alice)
    checkpoint, dataset = ready_checkpoint(alice), chat_dataset(alice_team)
    data = on_checkpoint(checkpoint, dataset, chat_template=TEMPLATE)
    assert client.post(reverse("experiment_create"), data).status_code == 400
    poll = reverse("chat_template_check", args=[template_sha256(TEMPLATE)])

    web_worker.wait(lambda: client.get(poll).json()["status"] != "checking", 90, "the chat template's check")

    assert client.get(poll).json()["status"] == "ok"
    assert client.post(reverse("experiment_create"), data).status_code == 200
