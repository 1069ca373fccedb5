"""The experiment form's errors for instruction settings, through the real page: packing and loss_on on a text
corpus, values they do not take, chat templates that cannot be used (broken, unsafe, too long, rendering earlier
turns differently, on a corpus, on a model from scratch), and sequences that drop every example. Pasted
YAML/JSON gets the same checks and messages as the fields."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.experiments.checkpoints import ready_checkpoint
from tests.webapp.experiments.instruction import chat_dataset, templates_checked
from tests.webapp.experiments.test_forms import post_data
from webapp.ground.models import Experiment

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(alice_team):
    return chat_dataset(alice_team)


def errors(client, data) -> str:
    """The form's error messages, all of them, after a refused post (posted again once the web worker checked
    a chat template the first post asked it to)."""
    response = client.post(reverse("experiment_create"), data)
    if templates_checked():
        response = client.post(reverse("experiment_create"), data)
    assert response.status_code == 400
    assert not Experiment.objects.exists()
    form = response.context["form"]
    messages = [m for ms in form.errors.values() for m in ms]
    messages += [m for row in form.rows.forms for ms in row.errors.values() for m in ms]
    return " ".join([*messages, *form.rows.non_form_errors()])


def on_checkpoint(checkpoint, dataset, **fields):
    return post_data(dataset, action="preview", model_kind="checkpoint", checkpoint=checkpoint.pk, **fields)


def test_it_refuses_packing_and_loss_on_on_a_text_corpus(alice_client, alice_dataset):
    for row in ({"name": "packing", "kind": "categorical", "values": "true, false"},
                {"name": "loss_on", "kind": "categorical", "values": "last"}):
        assert errors(alice_client, post_data(alice_dataset, rows=[row], action="preview")) == (
            f"{row['name']}: packing and loss_on apply to instruction and chat datasets; alice corpus is a text "
            "corpus, trained as token blocks. Remove this row.")
    pasted = "lr: {values: [0.001]}\npacking: {values: [true]}\n"
    assert "packing and loss_on apply to instruction and chat datasets" in errors(
        alice_client, post_data(alice_dataset, action="preview", space_text=pasted))


def test_it_takes_their_defaults_on_a_text_corpus(alice_client, alice_dataset):
    rows = [{"name": "packing", "kind": "categorical", "values": "false"},
            {"name": "loss_on", "kind": "categorical", "values": "assistant"}]
    assert alice_client.post(reverse("experiment_create"), post_data(alice_dataset, rows=rows,
                                                                     action="preview")).status_code == 200


def test_it_refuses_values_packing_and_loss_on_do_not_take(alice_client, chat):
    for rows, pasted, message in (
            ([{"name": "loss_on", "kind": "categorical", "values": "everything"}], "loss_on: {values: [everything]}",
             "loss_on: 'everything' is not one of assistant, last, all."),
            ([{"name": "packing", "kind": "categorical", "values": "maybe"}], "packing: {values: [true, 2]}",
             "packing: {} is not true or false."),
            ([{"name": "packing", "kind": "int", "low": "0", "high": "1"}], "packing: {kind: int, low: 0, high: 1}",
             "packing: kind 'int' is not allowed; use categorical.")):
        from_rows = errors(alice_client, post_data(chat, rows=rows, action="preview"))
        from_text = errors(alice_client, post_data(chat, action="preview", space_text=pasted))
        assert from_rows == message.format("'maybe'")
        assert from_text == message.format("2")


def test_max_seq_len_and_seq_len_are_one_parameter(alice_client, chat):
    pasted = "seq_len: {values: [64]}\nmax_seq_len: {values: [128]}\n"
    assert errors(alice_client, post_data(chat, action="preview", space_text=pasted)) == (
        "'max_seq_len' is another name of seq_len, which the space already has; give it once.")
    rows = [{"name": "seq_len", "kind": "categorical", "values": "64"},
            {"name": "max_seq_len", "kind": "categorical", "values": "128"}]
    assert errors(alice_client, post_data(chat, rows=rows, action="preview")) == (
        "'max_seq_len' and 'seq_len' are one parameter; give it one row.")


def test_it_refuses_a_max_seq_len_that_drops_every_validation_example(alice_client, chat):
    # The shortest training example has 28 tokens of the dataset's own tokenizer; the shortest validation one 29.
    rows = [{"name": "max_seq_len", "kind": "categorical", "values": "28, 64"}]
    assert errors(alice_client, post_data(chat, rows=rows, action="preview")) == (
        "seq_len: max_seq_len 28 drops every validation example (the shortest has 29 tokens; longer examples are "
        "dropped, never cut). Raise seq_len (max_seq_len) to at least 29.")


@pytest.mark.parametrize(("template", "reason"), [
    ("{% for m in messages %}{{ m['content'] }", "the chat template fails: TemplateSyntaxError: "),
    ("{{ ''.__class__.__mro__ }}", "the chat template fails: SecurityError: access to attribute '__class__' of "
                                   "'str' object is unsafe."),
    ("{{ raise_exception('no system turns here') }}", "the chat template fails: TemplateError: no system turns "
                                                      "here"),
    ("{% for m in messages|reverse %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}",
     "the chat template renders turns 1-2 differently once turn 3 follows, so the assistant's tokens cannot be "
     "found; train with loss_on 'all' or choose another template"),
    ("{# pad #}" + " " * (64 * 1024), "the chat template has 65545 characters; at most 65536"),
])
def test_it_refuses_a_chat_template_that_cannot_be_used_with_the_engines_reason(
        alice, alice_client, chat, template, reason):
    checkpoint = ready_checkpoint(alice)
    from_field = errors(alice_client, on_checkpoint(checkpoint, chat, chat_template=template))
    assert from_field.startswith(reason[:1].upper() + reason[1:])
    pasted = errors(alice_client, on_checkpoint(checkpoint, chat, space_text=f"lr: {{values: [0.001]}}\nchat_template: "
                                                                       f"{_quoted(template)}\n"))
    assert pasted.startswith(f"chat_template: {reason}")


def _quoted(text: str) -> str:
    """`text` as a YAML double-quoted scalar."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_it_refuses_a_chat_template_on_a_text_corpus_or_a_model_from_scratch(alice_client, alice_dataset, chat):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert errors(alice_client, post_data(alice_dataset, action="preview", chat_template=template)) == (
        "A chat template renders conversations: it applies to instruction and chat datasets, and alice corpus is a "
        "text corpus. Leave chat_template empty.")
    assert errors(alice_client, post_data(chat, action="preview", chat_template=template)) == (
        "A model trained from scratch uses the dataset's ChatML rendering; templates apply to pretrained "
        "checkpoints. Leave chat_template empty, or choose a checkpoint.")
    pasted = f"lr: {{values: [0.001]}}\nchat_template: {_quoted(template)}"
    assert errors(alice_client, post_data(chat, action="preview", space_text=pasted)) == (
        "chat_template: A model trained from scratch uses the dataset's ChatML rendering; templates apply to "
        "pretrained checkpoints. Leave chat_template empty, or choose a checkpoint.")
    assert errors(alice_client, post_data(chat, action="preview", space_text="lr: {values: [0.001]}\n"
                                                                             "chat_template: [1, 2]")) == (
        "chat_template: a list is not a template; give the Jinja template as text (a quoted string, or a YAML "
        "block after |).")


def test_it_refuses_a_held_out_byte_count_on_instruction_data(alice_client, chat):
    assert errors(alice_client, post_data(chat, action="preview", holdout_bytes=1000)) == (
        "holdout_bytes applies to text corpora: on instruction and chat data the final evaluation covers every "
        "validation example that fits max_seq_len. Leave it empty.")


def test_a_chat_template_that_loops_or_swells_is_stopped_and_refused(alice, alice_client, chat, monkeypatch):
    """Jinja's sandbox bounds each range, not loops in loops: the check stops a template that would hang the
    web worker, or fill its memory, and says so."""
    from worker.engine import template_sandbox

    monkeypatch.setattr(template_sandbox, "RENDER_SECONDS", 3)
    checkpoint = ready_checkpoint(alice)
    looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    assert errors(alice_client, on_checkpoint(checkpoint, chat, chat_template=looping)).startswith(
        "The chat template takes over 3 s to render a 5-turn conversation")
    monkeypatch.setattr(template_sandbox, "RENDER_MEMORY_BYTES", 1 << 30)
    swelling = "{% set s = 'x' * 50000 %}{% for i in range(100000) %}{{ s }}{% endfor %}"
    assert errors(alice_client, on_checkpoint(checkpoint, chat, chat_template=swelling)).startswith(
        "The chat template cannot render a 5-turn conversation within 1,024 MiB of memory")
