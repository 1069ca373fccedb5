"""Preference pairs uploaded through the dataset page's form and built as the web worker builds them: each format
and layout (strings, conversations, UltraFeedback's) becomes a pair set the engine loads, whose pairs decode back
to the rows' ChatML text; each kind of bad pair is counted with its line and reason; the page shows the pairs and
the pairs each max_seq_len drops; a pretrained tokenizer builds a pair set too; the built-in sample builds."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape
from tokenizers import Tokenizer

from tests.webapp.datasets.factories import make_preference_dataset, pretrained_tokenizer_dir, upload, upload_and_build
from webapp.datasets import services
from webapp.datasets.instruction import LENGTH_LIMITS
from webapp.datasets.models import Dataset, DatasetTokens
from webapp.datasets.sample_preference import PAIRS
from worker.engine.chat import PROMPT
from worker.engine.pairs import load_pairs

pytestmark = pytest.mark.django_db

END = "<|im_end|>\n"


def chatml(*turns: tuple[str, str]) -> str:
    return "".join(f"<|im_start|>{role}\n{content}{END}" for role, content in turns)


def jsonl(*rows: object) -> bytes:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows).encode()


def user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


QUESTIONS = [("What is 2 + 2?", "4.", "5."), ("Capital of France?", "Paris.", "Go away."),
             ("Name a colour.", "Blue.", "Seven."), ("Say yes.", "Yes.", "No."), ("Is ice cold?", "Yes, it is.", "No.")]
EXPECTED = {  # line: (the chosen sequence, the rejected one, the prompt they share), as the model sees them
    line: (chatml(("user", q), ("assistant", chosen)), chatml(("user", q), ("assistant", rejected)),
           chatml(("user", q)) + "<|im_start|>assistant\n")
    for line, (q, chosen, rejected) in enumerate(QUESTIONS, 1)}


def strings() -> list[dict[str, object]]:
    return [{"prompt": q, "chosen": c, "rejected": r} for q, c, r in QUESTIONS]


def conversations() -> list[dict[str, object]]:  # TRL's implicit prompt: the answers repeat the prompt's turns
    return [{"chosen": [user(q), assistant(c)], "rejected": [user(q), assistant(r)]} for q, c, r in QUESTIONS]


def explicit() -> list[dict[str, object]]:  # TRL's explicit prompt: a message list, and answers of their own
    return [{"prompt": [user(q)], "chosen": [assistant(c)], "rejected": [assistant(r)]} for q, c, r in QUESTIONS]


def ultrafeedback() -> list[dict[str, object]]:  # a prompt string, and answers that repeat it as their first turn
    return [{"prompt": q, "prompt_id": str(k), "chosen": [user(q), assistant(c)], "rejected": [user(q), assistant(r)],
             "messages": [user(q), assistant(c)], "score_chosen": 8.0, "score_rejected": 3.0}
            for k, (q, c, r) in enumerate(QUESTIONS)]


def parquet(rows: list[dict[str, object]]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def csv(rows: list[dict[str, object]]) -> bytes:
    return ("prompt,chosen,rejected\n" + "".join(f'"{r["prompt"]}","{r["chosen"]}","{r["rejected"]}"\n'
                                                 for r in rows)).encode()


def decoded_pairs(dataset: Dataset) -> dict[int, tuple[str, str, str]]:
    """Each pair of the dataset's own pair set, loaded by the engine, by line: its chosen and rejected sequences
    decoded, and the prompt they share."""
    tokenizer = Tokenizer.from_file(str(dataset.tokenizer_path))
    pairs = load_pairs(dataset.examples_dir)
    lines = [json.loads(row)["line"] for row in dataset.records_path.read_text().splitlines()]
    assert len(pairs) == 2 * len(lines) == 2 * dataset.n_examples
    decoded = {}
    for k, line in enumerate(lines):
        sequences = []
        for which in (2 * k, 2 * k + 1):
            start, end = int(pairs.starts[which]), int(pairs.starts[which + 1])
            sequences.append((np.asarray(pairs.ids[start:end]), np.asarray(pairs.marks[start:end])))
        (chosen, chosen_marks), (rejected, _) = sequences
        prompt = chosen[chosen_marks == PROMPT]
        decoded[line] = (tokenizer.decode(chosen.tolist(), skip_special_tokens=False),
                         tokenizer.decode(rejected.tolist(), skip_special_tokens=False),
                         tokenizer.decode(prompt.tolist(), skip_special_tokens=False))
    return decoded


@pytest.mark.parametrize(("filename", "content", "header"), [
    ("strings.jsonl", jsonl(*strings()), 0),
    ("conversations.json", json.dumps(conversations()).encode(), 0),
    ("strings.csv", csv(strings()), 1),  # a CSV row's line counts the header's
    ("explicit.parquet", parquet(explicit()), 0),
    ("ultrafeedback.parquet", parquet(ultrafeedback()), 0),
    ("ultrafeedback.jsonl", jsonl(*ultrafeedback()), 0),
])
def test_each_format_and_layout_becomes_a_pair_set_of_the_rows_chatml_text(alice_client, filename, content, header):
    dataset = upload_and_build(alice_client, filename, content)
    assert dataset.status == Dataset.Status.READY, dataset.message
    assert (dataset.kind, dataset.n_rows, dataset.n_bad_rows, dataset.n_examples) == ("preference", 5, 0, 5)
    assert (dataset.train_examples, dataset.val_examples) == (4, 1)  # whole pairs: a quarter validates
    assert decoded_pairs(dataset) == {line + header: pair for line, pair in EXPECTED.items()}
    assert dataset.n_tokens == len(load_pairs(dataset.examples_dir).ids)


BAD_JSONL = jsonl(
    strings()[0],
    {"prompt": "Q?", "chosen": "A."},
    {"prompt": "Q?", "chosen": "", "rejected": "B."},
    {"prompt": "Q?", "chosen": 7, "rejected": "B."},
    {"chosen": "A.", "rejected": "B."},
    {"chosen": [user("Q?"), assistant("A.")], "rejected": [user("Other?"), assistant("B.")]},
    {"prompt": "Q?", "chosen": [assistant("A."), user("More?")], "rejected": "B."},
    {"chosen": [user("Q?")], "rejected": [user("Q?"), assistant("B.")]},
    {"prompt": "Q?", "chosen": "Same.", "rejected": "Same."},
    {"prompt": "Q?", "chosen": [{"role": "bot", "content": "A."}], "rejected": "B."},
    "{not json",
    *strings()[1:],
)
BAD_REASONS = [
    (2, "missing 'rejected'"),
    (3, "empty chosen"),
    (4, "'chosen' is an int, not a string or a list of messages"),
    (5, "missing 'prompt': answers given as strings need a prompt"),
    (6, "the prompt turns of 'chosen' and 'rejected' differ: both must begin with the same messages before their "
        "answers"),
    (7, "'chosen' does not end with an assistant turn"),
    (8, "'chosen' does not end with an assistant turn"),
    (9, "'chosen' and 'rejected' are the same answer"),
    (10, "'chosen': unknown role 'bot' in message 1 (use system, user or assistant)"),
    (11, "not valid JSON: Expecting property name enclosed in double quotes at column 2"),
]
BAD_KEPT = {line: EXPECTED[line - 10 if line > 10 else line] for line in (1, 12, 13, 14, 15)}


def test_each_bad_pair_is_counted_with_its_line_and_reason_and_shown(alice_client):
    dataset = upload_and_build(alice_client, "bad.jsonl", BAD_JSONL)
    assert dataset.status == Dataset.Status.READY, dataset.message
    assert (dataset.kind, dataset.n_rows, dataset.n_bad_rows, dataset.n_examples) == ("preference", 15, 10, 5)
    assert [tuple(row) for row in json.loads(dataset.bad_rows_path.read_text())] == BAD_REASONS
    assert decoded_pairs(dataset) == BAD_KEPT
    page = alice_client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert '<dd id="dataset-bad-rows">10</dd>' in page and "could not become a pair" in page
    for line, reason in BAD_REASONS:
        assert f"<tr><td>{line}</td><td>{escape(reason)}</td></tr>" in page


def test_a_file_of_no_usable_pair_fails_with_the_first_reason_on_its_page(alice_client):
    dataset = upload_and_build(alice_client, "same.jsonl", jsonl({"prompt": "Q", "chosen": "A", "rejected": "A"}))
    assert dataset.status == Dataset.Status.FAILED
    assert dataset.message == ("same.jsonl: no usable row: 1 rows, all bad; first: line 1: 'chosen' and 'rejected' "
                               "are the same answer")


def test_the_page_shows_the_first_pairs_their_tokens_and_the_pairs_each_length_drops(alice_client):
    long_answer = " ".join(f"word{k}" for k in range(300))
    rows = [*strings(), {"prompt": "Tell a long story.", "chosen": "Once.", "rejected": long_answer},
            {"prompt": "<b>Bold?</b>", "chosen": "Fine & well.", "rejected": "No."}]
    dataset = upload_and_build(alice_client, "pairs.jsonl", jsonl(*rows), val_fraction=0.3)
    assert dataset.status == Dataset.Status.READY, dataset.message
    page = alice_client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    pairs = load_pairs(dataset.examples_dir)
    longest = pairs.lengths.reshape(-1, 2).max(axis=1)
    n_train = dataset.train_examples
    for limit in LENGTH_LIMITS:
        train, validation = int((longest[:n_train] > limit).sum()), int((longest[n_train:] > limit).sum())
        assert f"<tr><td>{limit}</td><td>{train}</td><td>{validation}</td></tr>" in page
    assert int((longest > LENGTH_LIMITS[0]).sum()) == 1  # the long story drops at the shortest length
    records = [json.loads(row) for row in dataset.records_path.read_text().splitlines()]
    assert page.count('<pre class="example pair-chosen">') == min(5, n_train)
    for k, record in enumerate(records[: min(5, n_train)]):
        start, prompt_end = int(pairs.starts[2 * k]), int(pairs.starts[2 * k + 1])
        prompt_tokens = int((np.asarray(pairs.marks[start:prompt_end]) == PROMPT).sum())
        chosen_tokens = prompt_end - start - prompt_tokens
        rejected_tokens = int(pairs.starts[2 * k + 2]) - prompt_end - prompt_tokens
        assert (f"Line {record['line']} <span class=\"muted\">(prompt {prompt_tokens} tokens; chosen answer "
                f"{chosen_tokens}, rejected answer {rejected_tokens})</span>") in page
        assert escape(record["chosen"][0]["content"][:2000]) in page
        assert escape(record["rejected"][0]["content"][:2000]) in page
    assert "<b>Bold?</b>" not in page  # what users wrote is escaped


def test_a_pretrained_tokenizer_builds_a_pair_set_leaving_out_the_pairs_its_template_refuses(alice_client, tmp_path):
    from transformers import AutoTokenizer

    rows = [*strings(), {"prompt": "forbidden question", "chosen": "A.", "rejected": "B."}]
    dataset = upload_and_build(alice_client, "pairs.jsonl", jsonl(*rows))
    template = ("{% for m in messages %}{% if 'forbidden' in m.content %}{{ raise_exception('no forbidden words') }}"
                "{% endif %}### {{ m.role }}:\n{{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}### assistant:\n{% endif %}")
    directory = pretrained_tokenizer_dir(tmp_path / "pretrained")
    tokens = services.dataset_tokens_request(dataset=dataset, tokenizer_sha256="a" * 64, tokenizer_dir=str(directory),
                                             model_name="tiny", chat_template=template)
    services.dataset_tokens_build(tokens_id=tokens.pk)
    tokens.refresh_from_db()
    assert tokens.status == DatasetTokens.Status.READY, tokens.message
    assert tokens.message == ("1 pairs that cannot be tokenized with this chat template are left out; first: line 6: "
                              "the chat template fails: TemplateError: no forbidden words")
    reference = AutoTokenizer.from_pretrained(directory)
    pairs = load_pairs(tokens.examples_dir)
    records = [json.loads(row) for row in dataset.records_path.read_text().splitlines()]
    kept = [r for r in records if r["line"] != 6]
    assert len(pairs) == 2 * len(kept) and tokens.n_tokens == len(pairs.ids)
    assert tokens.train_examples == sum(1 for r in records[: dataset.train_examples] if r["line"] != 6)
    for k, record in enumerate(kept):
        for side, answer in enumerate((record["chosen"], record["rejected"])):
            which = 2 * k + side
            ids = np.asarray(pairs.ids[int(pairs.starts[which]): int(pairs.starts[which + 1])])
            prompt = "".join(f"### {m['role']}:\n{m['content']}\n" for m in record["messages"])
            assert reference.decode(ids.tolist()) == prompt + f"### assistant:\n{answer[0]['content']}\n"


def test_a_pair_whose_answer_renders_to_no_token_is_left_out_of_the_pretrained_pairs(alice_client, tmp_path):
    rows = [*strings(), {"prompt": "Say nothing.", "chosen": "nothing", "rejected": "Something."}]
    dataset = upload_and_build(alice_client, "pairs.jsonl", jsonl(*rows))
    template = ("{% for m in messages %}{% if m.content != 'nothing' %}### {{ m.role }}:\n{{ m.content }}\n{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}### assistant:\n{% endif %}")
    directory = pretrained_tokenizer_dir(tmp_path / "pretrained")
    tokens = services.dataset_tokens_request(dataset=dataset, tokenizer_sha256="b" * 64, tokenizer_dir=str(directory),
                                             model_name="tiny", chat_template=template)
    services.dataset_tokens_build(tokens_id=tokens.pk)
    tokens.refresh_from_db()
    assert tokens.status == DatasetTokens.Status.READY, tokens.message
    assert tokens.message == ("1 pairs that cannot be tokenized with this chat template are left out; first: line 6: "
                              "the chosen answer renders to no token")
    assert len(load_pairs(tokens.examples_dir)) == 2 * len(strings())


def test_the_sample_pairs_choice_builds_a_preference_dataset(alice_client):
    response = alice_client.post(reverse("dataset_list"), {"source": "sample_pairs", "vocab_size": 1000,
                                                           "val_fraction": 0.1, "kind": ""})
    assert response.status_code == 302, response.content.decode()
    dataset = Dataset.objects.get()
    services.dataset_tokenize(dataset_id=dataset.pk)
    dataset.refresh_from_db()
    assert dataset.status == Dataset.Status.READY, dataset.message
    assert (dataset.source, dataset.kind, dataset.n_rows, dataset.n_bad_rows, dataset.n_examples) == (
        "sample_pairs", "preference", PAIRS, 0, PAIRS)
    assert len(load_pairs(dataset.examples_dir)) == 2 * PAIRS
    page = alice_client.get(reverse("dataset_detail", args=[dataset.pk])).content.decode()
    assert page.count('<pre class="example pair-rejected">') == 5


def test_the_factory_makes_a_ready_preference_dataset(alice_team):
    dataset = make_preference_dataset(alice_team, pairs=40)
    assert (dataset.is_preference, dataset.n_examples, dataset.train_examples) == (True, 40, 36)
    assert len(load_pairs(dataset.examples_dir)) == 80


def test_the_web_worker_builds_an_uploaded_preference_file(alice, web_worker):
    client = Client()
    client.force_login(alice)
    response = upload(client, "bad.jsonl", BAD_JSONL)
    assert response.status_code == 302
    web_worker.wait(lambda: Dataset.objects.get().status != Dataset.Status.TOKENIZING, 60, "the pairs")
    dataset = Dataset.objects.get()
    assert dataset.status == Dataset.Status.READY, dataset.message
    assert decoded_pairs(dataset) == BAD_KEPT
    page = client.get(response["Location"]).content.decode()
    assert page.count('<pre class="example pair-chosen">') == 4 and '<dd id="dataset-bad-rows">10</dd>' in page
