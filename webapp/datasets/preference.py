"""The web worker's build of a preference dataset: its file read into pairs (a prompt, a chosen and a rejected
answer), split into training and validation pairs, tokenized with the dataset's own tokenizer (or a pretrained
model's, with a chat template) into a pair set (`worker.engine.pairs`), and previewed for its page.

It follows the build of instruction data (`instruction`) and writes the same files, each holding pairs:

- ``records.jsonl``: a pair a line, ``{"line", "text", "messages", "chosen", "rejected"}`` (``messages`` the
  prompt, ``text`` null), in split order: the training pairs, then the validation ones, each part in file
  order. A pretrained tokenizer encodes this file in this order, so every tokenizer's pair set splits at the
  same pair.
- ``examples/``: the pair set under the dataset's own tokenizer and ChatML (2N sequences and ``pairs.json``).
- ``preview.json``: the first training pairs and, for each of `LENGTH_LIMITS`, the pairs a trial of that
  ``max_seq_len`` drops: a pair drops when either of its sequences is longer.

The validation pairs are whole pairs, chosen as `instruction.split_examples` chooses examples.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from webapp import worker_door
from webapp.datasets.instruction import (
    LENGTH_LIMITS,
    PREVIEW_EXAMPLES,
    Partials,
    check_split,
    kept_split,
    own_tokenizer,
    pretrained_chat,
)
from webapp.datasets.models import Dataset, DatasetTokens
from webapp.datasets.records import Example, Kind
from webapp.datasets.tokenization import token_byte_lengths

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from webapp.worker_door import Encoded, ExampleSet

Messages = tuple[dict[str, str], ...]
PairRow = tuple[int, Messages, Messages, Messages]  # (line, prompt, chosen, rejected), as encode_pairs takes it


def preference_dataset_build(dataset: Dataset) -> dict[str, Any]:
    """Read, split and tokenize a tokenizing preference dataset and write its files; returns the row's figures
    (``n_examples`` and ``train_examples`` count pairs). Raises InstructionDataError, with the reason for the
    page, for data that cannot become a dataset."""
    own = own_tokenizer(dataset, Kind.PREFERENCE, _rendered)
    records, tokenizer = own.records, own.tokenizer
    encoded = worker_door.encode_pairs(own.chat, _rows(own.ordered), byte_lengths=token_byte_lengths(tokenizer))
    bad, train, validation = kept_split(own, encoded)
    _check_split(len(train), len(validation), encoded)

    with Partials(dataset.directory) as partials:
        tokenizer.save(str(partials.path(dataset.tokenizer_path)))
        _write_pairs(partials.path(dataset.records_path), train + validation)
        partials.path(dataset.bad_rows_path).write_text(json.dumps([[row.line, row.reason] for row in bad]))
        worker_door.save_pairs(encoded.examples, partials.path(dataset.examples_dir))
        partials.path(dataset.preview_path).write_text(
            json.dumps(pairs_preview(train, encoded.examples, n_train=len(train))))
    return {"n_rows": records.rows, "n_examples": len(encoded.lines), "n_bad_rows": records.n_bad + len(encoded.failed),
            "train_examples": len(train), "n_tokens": len(encoded.examples.ids),
            "vocab_size": tokenizer.get_vocab_size(), "columns": dict(records.layout.columns)}


def preference_tokens_build(tokens: DatasetTokens) -> dict[str, Any]:
    """Encode a ready preference dataset's pairs (its ``records.jsonl``, in its order) with the pretrained
    tokenizer of a `DatasetTokens` row and its chat template, and save the pair set to the row's
    ``examples_dir``; returns the row's figures (``train_examples`` counts pairs). Pairs the template refuses,
    or renders a prompt or an answer of no token, are left out, and the returned ``message`` says how many.
    Raises InstructionDataError when the tokenizer or the template cannot be used, or no pair of a split is
    left."""
    dataset = tokens.dataset
    chat = pretrained_chat(tokens)
    rows = list(stored_pairs(dataset.records_path))
    encoded = worker_door.encode_pairs(chat, rows, byte_lengths=token_byte_lengths(chat.backend_tokenizer))
    train_lines = {row[0] for row in rows[: dataset.train_examples]}
    n_train = sum(1 for line in encoded.lines if line in train_lines)
    _check_split(n_train, len(encoded.lines) - n_train, encoded)
    with Partials(dataset.directory) as partials:
        worker_door.save_pairs(encoded.examples, partials.path(tokens.examples_dir))
    message = ""
    if encoded.failed:
        line, reason = encoded.failed[0]
        message = (f"{len(encoded.failed)} pairs that cannot be tokenized with this chat template are left out; "
                   f"first: line {line}: {reason}")
    return {"n_tokens": len(encoded.examples.ids), "max_id": int(encoded.examples.ids.max()),
            "train_examples": n_train, "val_start": None, "message": message}


def stored_pairs(path: Path) -> Iterator[PairRow]:
    """The (line, prompt, chosen, rejected) rows of a preference dataset's ``records.jsonl``, in its order."""
    with path.open(encoding="utf-8") as file:
        for line in file:
            row = json.loads(line)
            yield row["line"], tuple(row["messages"]), tuple(row["chosen"]), tuple(row["rejected"])


def pairs_preview(train: Sequence[Example], pairs: ExampleSet, *, n_train: int) -> dict[str, object]:
    """The detail page's preview: the first `PREVIEW_EXAMPLES` training pairs (their line, prompt and answers'
    messages, and the tokens of the prompt and of each answer), and for each of `LENGTH_LIMITS` the training and
    validation pairs a trial of that ``max_seq_len`` drops, those with a sequence longer than it."""
    lengths = pairs.lengths.reshape(-1, 2)  # (pairs, 2): the chosen and the rejected sequence
    prompt = (np.asarray(pairs.marks) == worker_door.PROMPT).astype(np.int64)
    prompts = np.add.reduceat(prompt, np.asarray(pairs.starts[:-1])).reshape(-1, 2)  # each sequence's prompt tokens
    longest = lengths.max(axis=1)
    return {
        "pairs": [{"line": pair.line, "prompt": list(pair.messages), "chosen": list(pair.chosen),
                   "rejected": list(pair.rejected), "prompt_tokens": int(prompts[k, 0]),
                   "chosen_tokens": int(lengths[k, 0] - prompts[k, 0]),
                   "rejected_tokens": int(lengths[k, 1] - prompts[k, 1])}
                  for k, pair in enumerate(train[:PREVIEW_EXAMPLES])],
        "too_long": [{"max_seq_len": limit, "train": int((longest[:n_train] > limit).sum()),
                      "validation": int((longest[n_train:] > limit).sum())} for limit in LENGTH_LIMITS],
    }


def _rendered(renderer: PreTrainedTokenizerBase, pair: Example) -> str:
    """Both of a pair's conversations as the default template renders them: the text its tokenizer learns."""
    try:
        return "\n".join(worker_door.render(renderer, [*pair.messages, *answer]) for answer in (pair.chosen,
                                                                                               pair.rejected))
    except worker_door.TemplateError:  # encoding reports the row as bad; it has no text to learn from
        return ""


def _rows(pairs: Sequence[Example]) -> Iterator[PairRow]:
    return ((pair.line, pair.messages, pair.chosen, pair.rejected) for pair in pairs)


def _check_split(n_train: int, n_val: int, encoded: Encoded) -> None:
    check_split(n_train, n_val, encoded, item="pair", none_kept="No pair can be tokenized",
                refused="the pairs that cannot be tokenized")


def _write_pairs(path: Path, pairs: Sequence[Example]) -> None:
    with path.open("w", encoding="utf-8") as file:
        for pair in pairs:
            file.write(json.dumps({"line": pair.line, "text": None, "messages": list(pair.messages),
                                   "chosen": list(pair.chosen), "rejected": list(pair.rejected)}) + "\n")
