"""Every rendering of a chat template that is not our own ChatML happens in the sandbox's child process: the same
text as transformers' ``apply_chat_template``, and a template that loops, fills the memory or swells its text
stops at a limit with a clear error, after which the next rendering works again."""

from __future__ import annotations

import time

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from worker.engine import template_sandbox
from worker.engine.chat import DEFAULT_CHAT_TEMPLATE, TemplateError, answer_spans, chat_tokenizer, render
from worker.engine.examples import encode_examples
from worker.engine.template_sandbox import TemplateLimitError

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Two plus two?"},
                {"role": "assistant", "content": "Four."}, {"role": "user", "content": "BOOM?"}]
LLAMA_LIKE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
              "{% elif m['role'] == 'assistant' %} {{ m['content'] }}{{ eos_token }}{% else %}<<SYS>>{{ m['content'] }}"
              "<</SYS>>{% endif %}{% endfor %}")
# Each passes a conversation without the guarded word, and loops or swells on one with it.
LOOPS_ON_BOOM = ("{% for m in messages %}{% if 'BOOM' in m['content'] %}{% for i in range(100000) %}"
                 "{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}{{ m['content'] }}{% endfor %}")
SWELLS_ON_BOOM = ("{% set s = 'x' * 50000 %}{% for m in messages %}{% if 'BOOM' in m['content'] %}"
                  "{% for i in range(100000) %}{{ s }}{% endfor %}{% endif %}{{ m['content'] }}{% endfor %}")
LONG_ON_BOOM = ("{% for m in messages %}{% if 'BOOM' in m['content'] %}{{ 'y' * 3000000 }}{% endif %}"
                "{{ m['content'] }}{% endfor %}")


def tokenizer(template: str) -> PreTrainedTokenizerFast:
    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token="<s>", eos_token="</s>")
    bare.chat_template = template
    return bare


@pytest.fixture
def quick(monkeypatch):
    """Limits that a test reaches in seconds: 2 s, 1 GiB."""
    monkeypatch.setattr(template_sandbox, "RENDER_SECONDS", 2.0)
    monkeypatch.setattr(template_sandbox, "RENDER_MEMORY_BYTES", 1 << 30)


@pytest.mark.parametrize("template", [LLAMA_LIKE, DEFAULT_CHAT_TEMPLATE])
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_it_renders_what_apply_chat_template_renders(template: str, generation_prompt: bool) -> None:
    chat = tokenizer(template)
    assert render(chat, CONVERSATION, add_generation_prompt=generation_prompt) == chat.apply_chat_template(
        CONVERSATION, add_generation_prompt=generation_prompt, tokenize=False)


def test_the_sandbox_starting_up_does_not_count_against_the_render_limit(monkeypatch) -> None:
    """A busy host may take seconds to start the child (Python and transformers' Jinja rendering): a template
    that renders in milliseconds is never refused for that."""
    template_sandbox.SANDBOX._stop()
    monkeypatch.setattr(template_sandbox, "RENDER_SECONDS", 0.4)  # less than the child's own start-up
    chat = tokenizer(LLAMA_LIKE)
    assert render(chat, CONVERSATION) == chat.apply_chat_template(CONVERSATION, tokenize=False)


def test_a_template_that_fails_says_why_as_it_did_in_process() -> None:
    with pytest.raises(TemplateError, match="the chat template fails: TemplateError: no system turns here"):
        render(tokenizer("{{ raise_exception('no system turns here') }}"), CONVERSATION)
    with pytest.raises(TemplateError, match="the chat template fails: TemplateSyntaxError"):
        render(tokenizer("{% for m in messages %}"), CONVERSATION)


@pytest.mark.parametrize(("template", "message"), [
    (LOOPS_ON_BOOM, "the chat template takes over 2 s to render a 4-turn conversation; a template must not loop"),
    (SWELLS_ON_BOOM, "the chat template cannot render a 4-turn conversation within 1,024 MiB of memory"),
    (LONG_ON_BOOM, "the chat template renders 3,000,032 characters from a 4-turn conversation, more than twice "
                   "its text plus 1,048,576 (1,048,640); a template must not swell its text"),
])
def test_a_template_that_passes_its_check_stops_at_a_limit_on_other_data(quick, template: str, message: str) -> None:
    chat = chat_tokenizer(tokenizer(template), template=template)  # the check's probe has no BOOM: it passes
    start = time.monotonic()
    with pytest.raises(TemplateLimitError) as refused:
        answer_spans(chat, CONVERSATION)
    assert str(refused.value).startswith(message)
    assert time.monotonic() - start < 2.0 + 5.0  # the limit, and the time to kill and report
    assert render(chat, CONVERSATION[:3]).endswith("Four.")  # a new child renders the next conversation


def test_a_dataset_stops_at_the_first_example_past_a_limit_and_names_its_line(quick) -> None:
    """A limit is the template's fault, not one example's: leaving the example out would meet the same wait
    at the next one, so encoding stops there, and says where."""
    chat = chat_tokenizer(tokenizer(LOOPS_ON_BOOM), template=LOOPS_ON_BOOM)
    rows = [(1, None, CONVERSATION[:3]), (2, None, CONVERSATION), (3, None, CONVERSATION)]
    start = time.monotonic()
    with pytest.raises(TemplateLimitError, match=r"^line 2: the chat template takes over 2 s"):
        encode_examples(chat, rows)
    assert time.monotonic() - start < 2.0 + 5.0  # one wait, not one per example
