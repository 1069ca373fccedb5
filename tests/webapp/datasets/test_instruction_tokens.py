"""A conversations file, read and tokenized through its chat template into the example set trials train on: the
token ids and marks by hand, bad rows and rows the template refuses reported with their lines."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from webapp.datasets.records import read_records
from worker.engine.chat import CHAT_SPECIAL_TOKENS, LAST_ANSWER, PROMPT, chat_tokenizer
from worker.engine.examples import encode_examples

WORDS = ["[UNK]", "user", "assistant", "hi", "hello", "bye", "ok", "forbidden"]
START, END = len(WORDS), len(WORDS) + 1
# ChatML, except that it refuses a message saying "forbidden", as some checkpoints' templates refuse roles
TEMPLATE = ("{% for m in messages %}{% if m['content'] == 'forbidden' %}{{ raise_exception('no forbidden turns') }}"
            "{% endif %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_a_conversations_file_becomes_examples_with_each_refused_row_on_its_line(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"messages": [{"role": "user", "content": "bye"}]},  # no assistant turn: a bad row
        {"messages": [{"role": "user", "content": "forbidden"}, {"role": "assistant", "content": "ok"}]},
        {"messages": [{"role": "user", "content": "bye"}, {"role": "assistant", "content": "ok"}]},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    vocabulary = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    vocabulary.pre_tokenizer = pre_tokenizers.Whitespace()
    vocabulary.add_special_tokens(list(CHAT_SPECIAL_TOKENS))

    records = read_records(path, max_decoded_bytes=1 << 30)
    encoded = encode_examples(chat_tokenizer(vocabulary, template=TEMPLATE),
                              ((e.line, e.text, e.messages) for e in records.examples))

    assert [(bad.line, "no assistant" in bad.reason) for bad in records.bad] == [(2, True)]
    assert encoded.failed == [(3, "the chat template fails: TemplateError: no forbidden turns")]
    assert encoded.lines == [1, 4]
    u, a = WORDS.index("user"), WORDS.index("assistant")
    assert encoded.examples.starts.tolist() == [0, 8, 16]
    assert encoded.examples.ids.tolist() == [START, u, 3, END, START, a, 4, END,
                                             START, u, 5, END, START, a, 6, END]
    p, last = PROMPT, LAST_ANSWER
    assert encoded.examples.marks.tolist() == [p, p, p, p, p, p, last, last] * 2
