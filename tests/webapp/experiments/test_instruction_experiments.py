"""Experiments on instruction and chat data, through the real pages: a sweep over packing and loss_on launches
trials whose specs train on the dataset's examples and declare the held-out rows the engine counts; the
pasted and downloaded YAML/JSON name max_seq_len, packing, loss_on and a chat template; a pretrained
checkpoint with a template of the experiment's own trains on the dataset tokenized with that template."""

from __future__ import annotations

import math

import pytest
from django.urls import reverse

from tests.webapp.experiments.checkpoints import ready_checkpoint
from tests.webapp.experiments.instruction import chat_checkpoint, chat_dataset, fitting_validation, templates_checked
from tests.webapp.experiments.test_forms import post_data
from webapp.catalog.selectors import checkpoint_dir
from webapp.datasets.models import DatasetTokens, template_sha256
from webapp.datasets.services import dataset_tokens_build
from webapp.experiments.reconcile import trials_reconcile
from webapp.experiments.space_text import chat_template_of_text, load_spec_text
from webapp.ground.models import Experiment
from worker.engine.chat import DEFAULT_CHAT_TEMPLATE
from worker.engine.config import TrialSpec
from worker.engine.examples import ExampleRows

pytestmark = pytest.mark.django_db

SWEEP = [{"name": "max_seq_len", "kind": "categorical", "values": "64"},
         {"name": "packing", "kind": "categorical", "values": "true, false"},
         {"name": "loss_on", "kind": "categorical", "values": "assistant, last"},
         {"name": "batch_size", "kind": "categorical", "values": "2"}]
# ChatML with a different turn header: renders every turn as the earlier turns did, so its spans are found
TEMPLATE = ("{% for m in messages %}{{ '### ' + m['role'] + ' <' + '\\n' + m['content'] + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '### assistant <\\n' }}{% endif %}")


@pytest.fixture
def chat(alice_team):
    return chat_dataset(alice_team)


def _created(client, data, capture) -> Experiment:
    """The experiment the form creates from `data`, posted again once the web worker checked a chat template
    the first post asked it to."""
    with capture(execute=True):
        response = client.post(reverse("experiment_create"), data)
        if templates_checked():
            response = client.post(reverse("experiment_create"), data)
    assert response.status_code == 302, response.content.decode()
    return Experiment.objects.get()


def test_a_sweep_over_packing_and_loss_on_launches_trials_on_the_datasets_examples(
        alice_client, chat, scheduler, django_capture_on_commit_callbacks):
    experiment = _created(alice_client, post_data(chat, rows=SWEEP, action="create", launch="1"),
                          django_capture_on_commit_callbacks)

    trials = list(experiment.trials.order_by("number"))
    assert [(t.params["packing"], t.params["loss_on"]) for t in trials] == [
        (True, "assistant"), (True, "last"), (False, "assistant"), (False, "last")]
    assert experiment.search_space["seq_len"] == {"kind": "categorical", "values": [64]}  # one parameter
    holdout = fitting_validation(chat.examples_dir, train_examples=chat.train_examples, seq_len=64)
    assert 0 < holdout < chat.val_examples  # 64 tokens drop some validation examples
    for trial in trials:
        assert trial.status == "planning" and trial.submitted, trial.message
        data = trial.spec["data"]
        assert {k: data[k] for k in ("examples_dir", "train_examples", "seq_len", "packing", "loss_on",
                                     "holdout_rows", "chat_template", "tokenizer_dir", "tokens_path")} == {
            "examples_dir": str(chat.examples_dir), "train_examples": chat.train_examples, "seq_len": 64,
            "packing": trial.params["packing"], "loss_on": trial.params["loss_on"], "holdout_rows": holdout,
            "chat_template": DEFAULT_CHAT_TEMPLATE, "tokenizer_dir": str(chat.directory), "tokens_path": ""}
        assert scheduler.trial(trial.queue_id).job["trial"] == trial.spec
        # The engine lays the rows out from the spec, and checks the declared held-out rows.
        spec = TrialSpec.from_dict(trial.spec)
        rows = ExampleRows.of(spec.data, vocab_size=spec.model.vocab_size)
        assert len(rows.val_examples) == holdout and spec.model.vocab_size == chat.vocab_size

    page = alice_client.get(reverse("experiment_detail", args=[experiment.pk])).content.decode()
    assert "Chat messages" in page and "every validation example that fits max_seq_len" in page
    assert ('<span class="param">max_seq_len=64</span> <span class="param">packing=searched</span> '
            '<span class="param">loss_on=searched</span>') in page
    # a trial's parameters in its row (in the order the database keeps them: PostgreSQL's jsonb sorts keys)
    assert any('<span class="param">packing=true</span>' in row and '<span class="param">loss_on=last</span>' in row
               for row in page.split("<tr"))


def test_an_epoch_budget_counts_the_training_examples_one_a_row(
        alice_client, chat, django_capture_on_commit_callbacks):
    experiment = _created(alice_client, post_data(chat, rows=SWEEP[1:], action="create", budget_unit="epochs",
                                                  budget=2), django_capture_on_commit_callbacks)
    assert {t.total_steps for t in experiment.trials.all()} == {math.ceil(2 * chat.train_examples / 2)}


def test_pasted_yaml_and_json_with_the_instruction_settings_round_trip(
        alice, alice_client, chat, django_capture_on_commit_callbacks):
    checkpoint = ready_checkpoint(alice)
    pasted = ("model: {checkpoint: " + checkpoint.name + "}\nmax_seq_len: {values: [48]}\n"
              "packing: [true, false]\nloss_on: {values: [all]}\nchat_template: |-\n  "
              + TEMPLATE + "\n")
    experiment = _created(alice_client, post_data(chat, action="create", space_text=pasted),
                          django_capture_on_commit_callbacks)
    assert experiment.chat_template == TEMPLATE
    assert experiment.search_space == {"seq_len": {"kind": "categorical", "values": [48]},
                                       "packing": {"kind": "categorical", "values": [True, False]},
                                       "loss_on": {"kind": "categorical", "values": ["all"]}}

    for fmt in ("yaml", "json"):
        text = alice_client.get(reverse("experiment_space", args=[experiment.pk, fmt])).content.decode()
        assert chat_template_of_text(text) == TEMPLATE
        assert load_spec_text(text)[1].to_dict() == experiment.search_space
        again = alice_client.post(reverse("experiment_create"), post_data(chat, action="preview", space_text=text))
        assert again.status_code == 200, again.content.decode()
        draft = again.context["form"].cleaned_data["draft"]
        assert (draft.chat_template, draft.space.to_dict(), draft.model) == (
            TEMPLATE, experiment.search_space, experiment.model)

    page = alice_client.get(reverse("experiment_detail", args=[experiment.pk])).content.decode()
    assert '<pre class="corpus" id="chat-template">{% for m in messages %}{{ &#x27;### &#x27; + m[&#x27;role' in page
    clone = alice_client.get(reverse("experiment_create") + f"?clone={experiment.pk}")
    assert clone.context["form"].initial["chat_template"] == TEMPLATE


def test_a_checkpoint_with_a_template_of_the_experiments_own_trains_on_the_dataset_rendered_with_it(
        alice, alice_client, chat, scheduler, django_capture_on_commit_callbacks):
    checkpoint = ready_checkpoint(alice)
    rows = [{"name": "max_seq_len", "kind": "categorical", "values": "64"},
            {"name": "batch_size", "kind": "categorical", "values": "2"}]
    data = post_data(chat, rows=rows, action="create", launch="1", model_kind="checkpoint",
                     checkpoint=checkpoint.pk, chat_template=TEMPLATE.replace("\n", "\r\n"))
    experiment = _created(alice_client, data, django_capture_on_commit_callbacks)
    assert experiment.chat_template == TEMPLATE  # the textarea's line ends, as a browser sends them, made Unix ones

    tokens = DatasetTokens.objects.get()
    assert (tokens.dataset, tokens.chat_template, tokens.template_sha256) == (chat, TEMPLATE,
                                                                             template_sha256(TEMPLATE))
    trial = experiment.trials.get()
    assert (trial.status, trial.submitted) == ("planning", False)
    assert trial.message == "Waiting for chat to be tokenized with tiny llama's tokenizer and the chat template."
    assert trial.spec["data"]["examples_dir"] == str(tokens.examples_dir)
    assert trial.spec["data"]["holdout_rows"] is None  # counted once the examples are made

    dataset_tokens_build(tokens_id=tokens.pk)  # as the web worker does
    tokens.refresh_from_db()
    assert tokens.is_ready, tokens.message
    assert trials_reconcile().submitted == [trial.queue_id]
    trial.refresh_from_db()
    holdout = fitting_validation(tokens.examples_dir, train_examples=tokens.train_examples, seq_len=64)
    assert holdout > 0
    data = trial.spec["data"]
    assert {k: data[k] for k in ("examples_dir", "train_examples", "holdout_rows", "chat_template",
                                 "tokenizer_dir")} == {
        "examples_dir": str(tokens.examples_dir), "train_examples": tokens.train_examples, "holdout_rows": holdout,
        "chat_template": TEMPLATE, "tokenizer_dir": str(checkpoint_dir(checkpoint))}
    assert scheduler.trial(trial.queue_id).job["trial"] == trial.spec
    spec = TrialSpec.from_dict(trial.spec)
    assert len(ExampleRows.of(spec.data, vocab_size=spec.model.vocab_size).val_examples) == holdout


@pytest.mark.parametrize(("own", "exported"), [(None, DEFAULT_CHAT_TEMPLATE), (TEMPLATE, None)])
def test_a_checkpoint_trains_on_its_own_template_else_on_chatml_which_its_export_then_carries(
        alice, alice_client, chat, scheduler, django_capture_on_commit_callbacks, own, exported):
    checkpoint = chat_checkpoint(alice, template=own)
    data = post_data(chat, rows=SWEEP[:1], action="create", launch="1", model_kind="checkpoint",
                     checkpoint=checkpoint.pk)
    experiment = _created(alice_client, data, django_capture_on_commit_callbacks)
    tokens = DatasetTokens.objects.get()
    assert (tokens.chat_template, tokens.template_sha256) == ("", "")  # the checkpoint's own, else ChatML
    dataset_tokens_build(tokens_id=tokens.pk)
    tokens.refresh_from_db()
    assert tokens.is_ready, tokens.message
    trials_reconcile()
    trial = experiment.trials.get()
    assert trial.submitted, trial.message
    assert trial.spec["data"]["chat_template"] == exported
    assert trial.spec["data"]["holdout_rows"] == fitting_validation(
        tokens.examples_dir, train_examples=tokens.train_examples, seq_len=64)


def test_a_trial_whose_max_seq_len_drops_every_example_of_a_split_fails_when_its_examples_are_made(
        alice, alice_client, chat, scheduler, django_capture_on_commit_callbacks):
    checkpoint = chat_checkpoint(alice)
    rows = [{"name": "max_seq_len", "kind": "categorical", "values": "8, 64"}]
    data = post_data(chat, rows=rows, action="create", launch="1", model_kind="checkpoint",
                     checkpoint=checkpoint.pk)
    experiment = _created(alice_client, data, django_capture_on_commit_callbacks)
    dataset_tokens_build(tokens_id=DatasetTokens.objects.get().pk)
    trials_reconcile()
    short, long = experiment.trials.order_by("number")
    assert (short.status, long.status, long.submitted) == ("failed", "planning", True)
    assert short.message.startswith("The trial's data cannot be trained on: max_seq_len 8 drops every training "
                                    "example (the shortest has ")
    assert [t.trial_id for t in scheduler.trials()] == [long.queue_id]
