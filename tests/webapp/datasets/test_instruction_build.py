"""Instruction and chat files uploaded through the dataset page and built as the web worker builds them: each
format becomes the examples a hand-written ChatML rendering gives, trained on the answers alone; bad rows are
counted with their lines and shown; the preview marks what the loss trains on and escapes what users wrote;
a pretrained tokenizer encodes the same examples with its chat template."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.files.base import ContentFile
from django.test import Client
from django.urls import reverse
from django.utils.html import escape
from tokenizers import Tokenizer

from tests.webapp.datasets.factories import pretrained_tokenizer_dir, upload, upload_and_build
from webapp.datasets import services
from webapp.datasets.instruction import LENGTH_LIMITS, split_examples
from webapp.datasets.models import Dataset, DatasetTokens
from webapp.datasets.records import Example
from webapp.datasets.sample_chat import CONVERSATIONS
from worker.engine.chat import PROMPT
from worker.engine.examples import ExampleSet
from worker.engine.tokenizer import END_OF_TEXT

pytestmark = pytest.mark.django_db

END = "<|im_end|>\n"


def chatml(*turns: tuple[str, str]) -> str:
    return "".join(f"<|im_start|>{role}\n{content}{END}" for role, content in turns)


def jsonl(*rows: object) -> bytes:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows).encode()


def messages(*turns: tuple[str, str]) -> dict[str, list[dict[str, str]]]:
    return {"messages": [{"role": role, "content": content} for role, content in turns]}


CHAT_JSONL = jsonl(
    messages(("user", "What is 2 + 2?"), ("assistant", "4.")),
    "{not json",
    messages(("system", "Be brief."), ("user", "Capital of France?"), ("assistant", "Paris.")),
    {"messages": [{"content": "hi"}, {"role": "assistant", "content": "hello"}]},
    messages(("user", "Name a colour."), ("assistant", "Blue."), ("user", "Another?"), ("assistant", "Green.")),
    messages(("user", "Only a question")),
    messages(("user", "Say yes."), ("assistant", "Yes.")),
)
CHAT_EXPECTED = {  # line: (the text the model sees, the text it is trained on)
    1: (chatml(("user", "What is 2 + 2?"), ("assistant", "4.")), "4." + END),
    3: (chatml(("system", "Be brief."), ("user", "Capital of France?"), ("assistant", "Paris.")), "Paris." + END),
    5: (chatml(("user", "Name a colour."), ("assistant", "Blue."), ("user", "Another?"), ("assistant", "Green.")),
        "Blue." + END + "Green." + END),
    7: (chatml(("user", "Say yes."), ("assistant", "Yes.")), "Yes." + END),
}
CHAT_BAD = [(2, "not valid JSON: Expecting property name enclosed in double quotes at column 2"),
            (4, "missing role in message 1"), (6, "no assistant message")]

ALPACA_JSON = json.dumps([
    {"instruction": "Add 2 and 3.", "output": "5"},
    {"instruction": "Translate to French.", "input": "cat", "output": "chat"},
    7,
    {"instruction": "Reverse 'abc'.", "input": "", "output": "cba"},
    {"instruction": "Spell 'dog'.", "output": ""},
    {"instruction": "Say hi.", "output": "hi"},
], indent=1).encode()
ALPACA_EXPECTED = {
    1: (chatml(("user", "Add 2 and 3."), ("assistant", "5")), "5" + END),
    2: (chatml(("user", "Translate to French.\n\ncat"), ("assistant", "chat")), "chat" + END),
    4: (chatml(("user", "Reverse 'abc'."), ("assistant", "cba")), "cba" + END),
    6: (chatml(("user", "Say hi."), ("assistant", "hi")), "hi" + END),
}
ALPACA_BAD = [(3, "row is an int, not an object"), (5, "empty output")]

PROMPTS_CSV = (b'prompt,completion\nWhat is 1+1?,2\n"Write two lines.","line one\nline two"\nEmpty answer,\n'
               b"too,many,fields\nCapital of Italy?,Rome\nLargest planet?,Jupiter\n")
PROMPTS_EXPECTED = {
    2: (chatml(("user", "What is 1+1?"), ("assistant", "2")), "2" + END),
    3: (chatml(("user", "Write two lines."), ("assistant", "line one\nline two")), "line one\nline two" + END),
    7: (chatml(("user", "Capital of Italy?"), ("assistant", "Rome")), "Rome" + END),
    8: (chatml(("user", "Largest planet?"), ("assistant", "Jupiter")), "Jupiter" + END),
}
PROMPTS_BAD = [(5, "empty completion"), (6, "3 fields, the header has 2")]


def parquet_bytes() -> bytes:
    conversations = [
        messages(("user", "Hello?"), ("assistant", "Hi there."))["messages"],
        messages(("system", "Count."), ("user", "One?"), ("assistant", "Two."))["messages"],
        None,
        messages(("user", "Red?"), ("assistant", "Yes, red."))["messages"],
        messages(("user", "Up?"), ("assistant", "Down."))["messages"],
    ]
    kind = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    table = pa.table({"id": list(range(5)), "messages": pa.array(conversations, type=kind)})
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


PARQUET_EXPECTED = {
    1: (chatml(("user", "Hello?"), ("assistant", "Hi there.")), "Hi there." + END),
    2: (chatml(("system", "Count."), ("user", "One?"), ("assistant", "Two.")), "Two." + END),
    4: (chatml(("user", "Red?"), ("assistant", "Yes, red.")), "Yes, red." + END),
    5: (chatml(("user", "Up?"), ("assistant", "Down.")), "Down." + END),
}
PARQUET_BAD = [(3, "missing 'messages'")]

TEXT_JSONL = jsonl({"text": "Once upon a time."}, {"text": "The end."}, {"text": " "}, {"text": "Again."},
                   {"text": "Fin."})
TEXT_EXPECTED = {line: (text + END_OF_TEXT,) * 2
                 for line, text in {1: "Once upon a time.", 2: "The end.", 4: "Again.", 5: "Fin."}.items()}
TEXT_BAD = [(3, "empty text")]

FORMATS = {  # file: (content, kind, expected examples by line, bad rows)
    "chat.jsonl": (CHAT_JSONL, "messages", CHAT_EXPECTED, CHAT_BAD),
    "alpaca.json": (ALPACA_JSON, "alpaca", ALPACA_EXPECTED, ALPACA_BAD),
    "prompts.csv": (PROMPTS_CSV, "prompt_completion", PROMPTS_EXPECTED, PROMPTS_BAD),
    "chat.parquet": (parquet_bytes(), "messages", PARQUET_EXPECTED, PARQUET_BAD),
    "stories.jsonl": (TEXT_JSONL, "text", TEXT_EXPECTED, TEXT_BAD),
}


def seen_and_trained(dataset: Dataset) -> dict[int, tuple[str, str]]:
    """Each example of the dataset's own set, by line: its decoded tokens, and the decoded tokens it trains on
    under loss_on "assistant"."""
    examples = ExampleSet.load(dataset.examples_dir)
    tokenizer = Tokenizer.from_file(str(dataset.tokenizer_path))
    lines = [json.loads(row)["line"] for row in dataset.records_path.read_text().splitlines()]
    assert len(lines) == len(examples)
    decoded = {}
    for k, line in enumerate(lines):
        ids = np.asarray(examples.ids[examples.starts[k]:examples.starts[k + 1]])
        marks = np.asarray(examples.marks[examples.starts[k]:examples.starts[k + 1]])
        decoded[line] = (tokenizer.decode(ids.tolist(), skip_special_tokens=False),
                         tokenizer.decode(ids[marks != PROMPT].tolist(), skip_special_tokens=False))
    return decoded


@pytest.mark.parametrize("filename", FORMATS)
def test_each_format_becomes_the_examples_its_chatml_rendering_gives(alice_client, filename):
    content, kind, expected, bad = FORMATS[filename]

    dataset = upload_and_build(alice_client, filename, content)

    assert dataset.status == Dataset.Status.READY, dataset.message
    assert (dataset.kind, dataset.filename, dataset.source_path.name) == (kind, filename,
                                                                         "source" + Path(filename).suffix)
    assert dataset.source_path.read_bytes() == content
    assert seen_and_trained(dataset) == expected
    # Four good rows, a quarter validates: the seed-0 permutation of 4 is [2, 0, 1, 3], so the fourth.
    assert [json.loads(row)["line"] for row in dataset.records_path.read_text().splitlines()] == list(expected)
    assert (dataset.n_rows, dataset.n_examples, dataset.train_examples, dataset.n_bad_rows) == (
        len(expected) + len(bad), 4, 3, len(bad))
    assert json.loads(dataset.bad_rows_path.read_text()) == [list(row) for row in bad]
    examples = ExampleSet.load(dataset.examples_dir)
    assert dataset.n_tokens == len(examples.ids) and examples.token_bytes is not None

    page = alice_client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert 'data-status="ready"' in page
    assert f'<dd id="dataset-bad-rows">{len(bad)}</dd>' in page
    assert f'<dd id="dataset-rows">{len(expected) + len(bad)}</dd>' in page
    assert "4: 3 train / 1 validation" in page
    for line, reason in bad:
        assert f"<tr><td>{line}</td><td>{escape(reason)}</td></tr>" in page


def test_the_validation_examples_are_the_last_of_a_seed_0_permutation():
    examples = [Example(line=line, text=f"row {line}", messages=()) for line in range(1, 11)]
    split = split_examples(examples, val_fraction=0.3)
    # permutation(10) with seed 0 is [4 6 2 7 3 5 9 0 8 1]: its last three, 0, 8 and 1, validate.
    assert [e.line for e in split.validation] == [1, 2, 9]
    assert [e.line for e in split.train] == [3, 4, 5, 6, 7, 8, 10]


def test_a_file_with_no_usable_row_fails_with_the_reason_on_its_page(alice_client):
    content = jsonl(messages(("user", "no answer")), "[1, 2]", messages(("user", "again no answer")))

    dataset = upload_and_build(alice_client, "broken.jsonl", content)

    assert dataset.status == Dataset.Status.FAILED
    assert dataset.message == ("broken.jsonl: no usable row: 3 rows, all bad; first: line 1: no assistant message")
    page = alice_client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert 'data-status="failed"' in page and escape(dataset.message) in page
    assert dataset.source_path.read_bytes() == content  # the file is kept


def test_one_usable_row_cannot_split_and_fails_saying_so(alice_client):
    dataset = upload_and_build(alice_client, "one.jsonl", jsonl(messages(("user", "Hi"), ("assistant", "Hello"))))
    assert dataset.status == Dataset.Status.FAILED
    assert "1 usable row cannot split into training and validation examples" in dataset.message


def test_the_preview_marks_the_answers_and_escapes_what_users_wrote(alice_client):
    rows = [messages(("user", "<script>alert(1)</script>"), ("assistant", "<b>bold</b> & done"))]
    rows += [messages(("user", f"Question {n}?"), ("assistant", f"Answer {n}.")) for n in range(7)]

    dataset = upload_and_build(alice_client, "html.jsonl", jsonl(*rows))

    assert dataset.status == Dataset.Status.READY, dataset.message
    page = alice_client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert "<script>alert(1)</script>" not in page and "<b>bold</b>" not in page
    assert ('<span data-role="user">&lt;|im_start|&gt;user\n&lt;script&gt;alert(1)&lt;/script&gt;&lt;|im_end|&gt;\n'
            '</span><span data-role="assistant">&lt;|im_start|&gt;assistant\n</span>'
            '<mark data-role="assistant">&lt;b&gt;bold&lt;/b&gt; &amp; done&lt;|im_end|&gt;\n</mark>') in page
    preview = json.loads(dataset.preview_path.read_text())
    assert len(preview["examples"]) == 5  # the first five training examples, in file order
    assert preview["examples"][0]["segments"][-1] == {"text": "<b>bold</b> & done" + END, "role": "assistant",
                                                      "trained": True}
    lengths = ExampleSet.load(dataset.examples_dir).lengths
    assert [example["tokens"] for example in preview["examples"]] == lengths[:5].tolist()
    assert [row["max_seq_len"] for row in preview["too_long"]] == list(LENGTH_LIMITS)
    assert {(row["train"], row["validation"]) for row in preview["too_long"]} == {(0, 0)}


def test_it_counts_the_examples_too_long_for_each_max_seq_len(alice_client):
    long_answer = " ".join(f"w{n}" for n in range(400))  # hundreds of tokens at any vocabulary
    rows = [messages(("user", f"Q{n}"), ("assistant", long_answer if n % 2 else "short")) for n in range(8)]

    dataset = upload_and_build(alice_client, "long.jsonl", jsonl(*rows))

    lengths = ExampleSet.load(dataset.examples_dir).lengths
    n_train = dataset.train_examples
    too_long = json.loads(dataset.preview_path.read_text())["too_long"]
    assert too_long == [{"max_seq_len": limit, "train": int((lengths[:n_train] > limit).sum()),
                         "validation": int((lengths[n_train:] > limit).sum())} for limit in LENGTH_LIMITS]
    assert too_long[0]["train"] + too_long[0]["validation"] == 4 and too_long[-1]["train"] == 0
    page = alice_client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert f"<tr><td>128</td><td>{too_long[0]['train']}</td><td>{too_long[0]['validation']}</td></tr>" in page


def test_the_sample_chat_data_builds_and_previews(alice_client):
    response = alice_client.post(reverse("dataset_list"), {"source": "sample_chat", "vocab_size": 1000,
                                                           "val_fraction": 0.1, "kind": ""})
    assert response.status_code == 302
    dataset = Dataset.objects.get()
    services.dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()

    assert dataset.status == Dataset.Status.READY, dataset.message
    assert (dataset.source, dataset.kind, dataset.n_rows, dataset.n_bad_rows) == ("sample_chat", "messages",
                                                                                  CONVERSATIONS, 0)
    assert (dataset.n_examples, dataset.train_examples) == (CONVERSATIONS, CONVERSATIONS - 40)
    page = alice_client.get(response["Location"]).content.decode()
    assert page.count('<pre class="example">') == 5 and "<mark" in page
    assert '<dd id="dataset-kind">Chat messages</dd>' in page
    assert "<section class=\"card\" id=\"bad-rows\">" not in page


def test_building_again_replaces_the_files(alice_client):
    dataset = upload_and_build(alice_client, "chat.jsonl", CHAT_JSONL)
    first = seen_and_trained(dataset)
    Dataset.objects.filter(pk=dataset.pk).update(status=Dataset.Status.TOKENIZING)

    services.dataset_tokenize(dataset_id=dataset.pk)

    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.READY and seen_and_trained(dataset) == first
    assert not [path.name for path in dataset.directory.iterdir() if path.name.startswith(".")]


def test_another_team_cannot_see_the_preview(alice_client, bob_client):
    dataset = upload_and_build(alice_client, "chat.jsonl", CHAT_JSONL)
    assert bob_client.get(reverse("dataset_detail", args=[dataset.pk])).status_code == 404


TEMPLATE = ("{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}### assistant:\n{% endif %}")


def test_a_pretrained_tokenizer_encodes_the_examples_with_its_chat_template(alice_client, tmp_path):
    from transformers import AutoTokenizer

    dataset = upload_and_build(alice_client, "chat.jsonl", CHAT_JSONL)
    directory = pretrained_tokenizer_dir(tmp_path / "pretrained")

    tokens = services.dataset_tokens_request(dataset=dataset, tokenizer_sha256="a" * 64,
                                             tokenizer_dir=str(directory), model_name="tiny", chat_template=TEMPLATE)
    services.dataset_tokens_build(tokens_id=tokens.pk)

    tokens.refresh_from_db()
    assert tokens.status == DatasetTokens.Status.READY, tokens.message
    reference = AutoTokenizer.from_pretrained(directory)
    examples = ExampleSet.load(tokens.examples_dir)
    records = [json.loads(row) for row in dataset.records_path.read_text().splitlines()]
    assert len(examples) == len(records) == 4 and tokens.train_examples == dataset.train_examples == 3
    for k, record in enumerate(records):
        expected = reference.apply_chat_template(record["messages"], chat_template=TEMPLATE, tokenize=True,
                                                 return_dict=True)["input_ids"]
        assert examples.ids[examples.starts[k]:examples.starts[k + 1]].tolist() == list(expected)
    assert (tokens.n_tokens, tokens.max_id) == (len(examples.ids), int(examples.ids.max()))
    # The answers alone are trained: "Paris.\n" after "### assistant:\n".
    paris = next(k for k, record in enumerate(records) if record["line"] == 3)
    marks = examples.marks[examples.starts[paris]:examples.starts[paris + 1]]
    ids = examples.ids[examples.starts[paris]:examples.starts[paris + 1]]
    assert reference.decode(ids[np.asarray(marks) != PROMPT].tolist()) == "Paris.\n"

    # The same tokenizer with its own (default) template is another row; the same template is this one.
    assert services.dataset_tokens_request(dataset=dataset, tokenizer_sha256="a" * 64, tokenizer_dir=str(directory),
                                           model_name="tiny", chat_template=TEMPLATE) == tokens
    default = services.dataset_tokens_request(dataset=dataset, tokenizer_sha256="a" * 64,
                                              tokenizer_dir=str(directory), model_name="tiny")
    assert default != tokens and default.template_sha256 == "" and len(tokens.template_sha256) == 64
    services.dataset_tokens_build(tokens_id=default.pk)
    default.refresh_from_db()
    assert default.status == DatasetTokens.Status.READY, default.message
    assert default.examples_dir != tokens.examples_dir


def test_a_template_that_fails_fails_the_pretrained_tokens_with_its_message(alice_client, tmp_path):
    dataset = upload_and_build(alice_client, "chat.jsonl", CHAT_JSONL)
    directory = pretrained_tokenizer_dir(tmp_path / "pretrained")
    tokens = services.dataset_tokens_request(dataset=dataset, tokenizer_sha256="b" * 64,
                                             tokenizer_dir=str(directory), model_name="tiny",
                                             chat_template="{{ raise_exception('no chat here') }}")
    services.dataset_tokens_build(tokens_id=tokens.pk)
    tokens.refresh_from_db()
    assert tokens.status == DatasetTokens.Status.FAILED
    assert tokens.message == ("tiny's chat template cannot be used: the chat template fails: TemplateError: "
                              "no chat here")


def test_a_corpus_is_stored_and_tokenized_as_before(alice_team):
    dataset = services.dataset_create(team=alice_team, user=None, name="plain", corpus=ContentFile(b"a b c\n" * 200),
                                      source=Dataset.Source.UPLOAD, vocab_size=300, val_fraction=0.1,
                                      filename="plain.txt")
    services.dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()
    assert (dataset.kind, dataset.status, dataset.is_instruction) == ("corpus", Dataset.Status.READY, False)
    assert dataset.corpus_path.exists() and not dataset.examples_dir.exists()


def test_the_web_worker_builds_an_uploaded_chat_file(alice, web_worker):
    client = Client()
    client.force_login(alice)
    response = upload(client, "chat.jsonl", CHAT_JSONL)
    assert response.status_code == 302
    web_worker.wait(lambda: Dataset.objects.get().status != Dataset.Status.TOKENIZING, 60, "the examples")
    dataset = Dataset.objects.get()
    assert dataset.status == Dataset.Status.READY, dataset.message
    assert seen_and_trained(dataset) == CHAT_EXPECTED
    page = client.get(response["Location"]).content.decode()
    assert page.count('<pre class="example">') == 3 and '<dd id="dataset-bad-rows">3</dd>' in page
