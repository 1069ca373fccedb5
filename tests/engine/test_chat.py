"""Chat templates and the tokens a trial trains on, against hand-written expectations on a word-level vocabulary
(one token per word, so every expected id is readable), and against SmolLM2's own tokenizer and template."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer

from worker.engine.chat import (
    ANSWER,
    CHAT_SPECIAL_TOKENS,
    DEFAULT_CHAT_TEMPLATE,
    LAST_ANSWER,
    PROMPT,
    LossOn,
    TemplateError,
    chat_tokenizer,
    encode_conversation,
    render,
    trained,
)
from worker.engine.export import export_tokenizer

WORDS = ["[UNK]", "user", "assistant", "system", "hi", "hello", "bye", "ok", "be", "brief"]
START, END = len(WORDS), len(WORDS) + 1  # the special tokens come after the words
CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "bye"},
    {"role": "assistant", "content": "ok"},
]


def word_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(list(CHAT_SPECIAL_TOKENS))
    return tokenizer


def prompt_ids(tokenizer, messages) -> list[int]:
    """The ids a model continues to answer `messages`: the conversation and the generation prompt."""
    return tokenizer(render(tokenizer, messages, add_generation_prompt=True), add_special_tokens=False)["input_ids"]


def test_it_renders_chatml_by_default_and_marks_each_assistant_turn_with_its_end_of_turn() -> None:
    tokenizer = chat_tokenizer(word_tokenizer())
    assert tokenizer.chat_template == DEFAULT_CHAT_TEMPLATE
    assert render(tokenizer, CONVERSATION[1:3]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n")

    ids, marks = encode_conversation(tokenizer, CONVERSATION)

    u, a, s = WORDS.index("user"), WORDS.index("assistant"), WORDS.index("system")
    assert ids.tolist() == [START, s, 8, 9, END,
                            START, u, 4, END,
                            START, a, 5, END,
                            START, u, 6, END,
                            START, a, 7, END]
    p, n, last = PROMPT, ANSWER, LAST_ANSWER
    assert marks.tolist() == [p, p, p, p, p,
                              p, p, p, p,
                              p, p, n, n,
                              p, p, p, p,
                              p, p, last, last]
    assert ids.dtype == np.int32 and marks.dtype == np.uint8


def test_loss_on_chooses_every_answer_the_last_or_all_tokens() -> None:
    marks = np.array([PROMPT, ANSWER, ANSWER, PROMPT, LAST_ANSWER], dtype=np.uint8)
    assert trained(marks, "assistant").tolist() == [False, True, True, False, True]
    assert trained(marks, LossOn.LAST).tolist() == [False, False, False, False, True]
    assert trained(marks, "all").tolist() == [True] * 5
    with pytest.raises(ValueError, match="'everything'"):
        trained(marks, "everything")


def test_an_experiments_template_overrides_the_default_and_the_generation_prompt_follows_it() -> None:
    template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                "{% if add_generation_prompt %}assistant {% endif %}")
    tokenizer = chat_tokenizer(word_tokenizer(), template=template)

    ids, marks = encode_conversation(tokenizer, CONVERSATION[1:3])

    assert ids.tolist() == [WORDS.index(w) for w in ("user", "hi", "assistant", "hello")]
    assert marks.tolist() == [PROMPT, PROMPT, PROMPT, LAST_ANSWER]
    assert prompt_ids(tokenizer, CONVERSATION[1:2]) == [WORDS.index(w) for w in ("user", "hi", "assistant")]


@pytest.mark.parametrize(("template", "message"), [
    ("{% for m in messages %}{{ m['content'] }", "TemplateSyntaxError"),
    ("{{ raise_exception('no system turns here') }}", "no system turns here"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    # The last turn rendered apart from the others: earlier turns' text changes once a turn follows.
    ("{% for m in messages %}{% if loop.last %}[{{ m['content'] }}]{% else %}{{ m['content'] }} {% endif %}"
     "{% endfor %}", "renders turns"),
])
def test_a_template_that_fails_or_hides_its_turns_is_refused_with_the_reason(template: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        chat_tokenizer(word_tokenizer(), template=template)


def test_smollm2s_own_template_gives_the_prompt_transformers_gives(smollm2_dir: Path) -> None:
    reference = AutoTokenizer.from_pretrained(smollm2_dir)
    tokenizer = chat_tokenizer(reference)
    conversation = CONVERSATION[1:]

    ids, marks = encode_conversation(tokenizer, conversation)

    assert ids.tolist() == reference.apply_chat_template(conversation, tokenize=True, return_dict=True)["input_ids"]
    answer = reference.decode(ids[marks == LAST_ANSWER].tolist())
    assert answer == "ok<|im_end|>\n"
    assert reference.decode(ids[marks == ANSWER].tolist()) == "hello<|im_end|>\n"
    assert prompt_ids(tokenizer, conversation[:1]) == reference.apply_chat_template(
        conversation[:1], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def test_an_export_carries_the_template_a_trial_trained_with_and_ends_generation_at_its_turns_end(
    tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    word_tokenizer().save(str(bare / "tokenizer.json"))  # what a dataset's own tokenizer directory holds
    (tmp_path / "export").mkdir()
    export_tokenizer(bare, tmp_path / "export", chat_template=DEFAULT_CHAT_TEMPLATE)

    exported = AutoTokenizer.from_pretrained(tmp_path / "export")
    ids, _ = encode_conversation(chat_tokenizer(word_tokenizer()), CONVERSATION)
    assert exported.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True)["input_ids"] == ids.tolist()
    assert exported.eos_token == "<|im_end|>"

    # a checkpoint's own tokenizer, trained with another template: the export renders with that one
    template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    exported.save_pretrained(tmp_path / "checkpoint")
    (tmp_path / "again").mkdir()
    export_tokenizer(tmp_path / "checkpoint", tmp_path / "again", chat_template=template)
    again = AutoTokenizer.from_pretrained(tmp_path / "again")
    assert again.chat_template == template
    assert again.eos_token == "<|im_end|>"  # the checkpoint's own, kept


def test_an_answer_whose_first_token_carries_the_prompts_last_space_is_trained_whole(smollm2_dir: Path) -> None:
    """Llama-2-style templates end the generation prompt with a space; byte-level BPE joins it to the answer's
    first word, and that token is the answer's."""
    template = ("{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST] "
                "{% else %}{{ m['content'] }}</s>{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}{{ '' }}{% endif %}")
    tokenizer = chat_tokenizer(AutoTokenizer.from_pretrained(smollm2_dir), template=template)

    ids, marks = encode_conversation(tokenizer, [{"role": "user", "content": "Capital of France?"},
                                                 {"role": "assistant", "content": "Paris."}])

    assert tokenizer.decode(ids[marks == LAST_ANSWER].tolist()) == " Paris.</s>"
