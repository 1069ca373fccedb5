"""The web worker's build of an instruction or chat dataset: its file read into examples, split, tokenized with
the dataset's own tokenizer (or a pretrained model's, with a chat template), and previewed for its page.

The engine renders and marks the examples (`worker.engine.chat`, `worker.engine.examples`), and trains the
dataset's own tokenizer (`worker.engine.tokenizer`), all through `webapp.worker_door`, which imports the first
two, and transformers, only when a build runs: the web server never loads torch or transformers. The files, in
the dataset's directory, are written under temporary names and renamed into place, so a build that runs again
replaces them:

- ``records.jsonl``: the examples, ``{"line", "text", "messages"}`` a line, in split order: the training
  examples, then the validation ones, each part in file order. A pretrained tokenizer encodes this file in
  this order, so every tokenizer's example set splits at the same example.
- ``bad_rows.json``: the first `BAD_ROWS_KEPT` ``[line, reason]`` pairs, rows the template refused among them.
- ``tokenizer.json``, ``examples/``: the dataset's own byte-level BPE, and the examples under it and ChatML.
- ``preview.json``: what the detail page shows (`preview`).

The validation examples are whole examples: those a permutation seeded with `VAL_SEED` puts last.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from django.conf import settings
from tokenizers import Tokenizer, models

from webapp import worker_door
from webapp.datasets.models import Dataset, DatasetTokens
from webapp.datasets.records import BAD_ROWS_KEPT, BadRow, Example, Kind, Records, RecordsError, read_records
from webapp.datasets.tokenization import token_byte_lengths
from webapp.worker_door import END_OF_TEXT, train_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from webapp.worker_door import Encoded, ExampleSet

VAL_SEED = 0
PREVIEW_EXAMPLES = 5
LENGTH_LIMITS = (128, 256, 512, 1024, 2048, 4096)  # the max_seq_len values the page counts dropped examples at


class InstructionDataError(ValueError):
    """Instruction data that cannot become a dataset; the message is shown on the dataset's page."""


@dataclass(frozen=True)
class Split:
    train: list[Example]
    validation: list[Example]


def split_examples(examples: Sequence[Example], *, val_fraction: float) -> Split:
    """The examples a permutation seeded with `VAL_SEED` puts last, ``max(1, round(n * val_fraction))`` of them,
    validate; the rest train. Each part keeps file order. Raises InstructionDataError when no example would
    be left to train on."""
    n = len(examples)
    n_val = max(1, round(n * val_fraction))
    if n - n_val < 1:
        raise InstructionDataError(f"{n} usable row{'s' if n != 1 else ''} cannot split into training and "
                                   "validation examples: both need at least one. Upload more rows.")
    held = set(np.random.default_rng(VAL_SEED).permutation(n)[n - n_val:].tolist())
    return Split(train=[e for k, e in enumerate(examples) if k not in held],
                 validation=[e for k, e in enumerate(examples) if k in held])


@dataclass(frozen=True)
class OwnTokenizer:
    """A dataset's file read and split, and the tokenizer of its own trained on it (`own_tokenizer`)."""

    records: Records
    split: Split
    tokenizer: Tokenizer
    chat: PreTrainedTokenizerBase  # the tokenizer with the default (ChatML) template

    @property
    def ordered(self) -> list[Example]:
        """The items in split order: the training ones, then the validation ones."""
        return self.split.train + self.split.validation


def own_tokenizer(dataset: Dataset, kind: Kind,
                  rendered: Callable[[PreTrainedTokenizerBase, Example], str]) -> OwnTokenizer:
    """Read `dataset`'s file as `kind`, split it, and train the dataset's own byte-level BPE on the text
    `rendered` makes of each item under the default template. Raises InstructionDataError for a file that
    cannot become a dataset."""
    from transformers import PreTrainedTokenizerFast

    try:
        records = read_records(dataset.source_path, kind=kind, columns=dataset.columns,
                               max_decoded_bytes=settings.HYDRA.max_decoded_bytes)
    except RecordsError as error:
        raise InstructionDataError(file_named(str(error), dataset)) from None
    split = split_examples(records.examples, val_fraction=dataset.val_fraction)
    renderer = worker_door.chat_tokenizer(Tokenizer(models.BPE()))  # the default template needs no vocabulary
    text = "\n".join(rendered(renderer, item) for item in split.train + split.validation)
    tokenizer = train_tokenizer(text, vocab_size=dataset.vocab_size, special_tokens=worker_door.CHAT_SPECIAL_TOKENS)
    chat = worker_door.chat_tokenizer(PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=END_OF_TEXT))
    return OwnTokenizer(records=records, split=split, tokenizer=tokenizer, chat=chat)


def kept_split(own: OwnTokenizer, encoded: Encoded) -> tuple[list[BadRow], list[Example], list[Example]]:
    """The first `BAD_ROWS_KEPT` bad rows (the file's and those encoding refused, by line), and the training and
    validation items encoding kept."""
    # The file's first bad rows come before any it did not keep, so the first of these are the first of all.
    bad = sorted([*own.records.bad, *(BadRow(line, reason) for line, reason in encoded.failed)],
                 key=lambda row: row.line)[:BAD_ROWS_KEPT]
    kept = set(encoded.lines)
    return (bad, [e for e in own.split.train if e.line in kept],
            [e for e in own.split.validation if e.line in kept])


def instruction_dataset_build(dataset: Dataset) -> dict[str, int]:
    """Read, split and tokenize a tokenizing instruction dataset and write its files; returns the row's
    figures (``n_rows``, ``n_examples``, ``n_bad_rows``, ``train_examples``, ``n_tokens``, ``vocab_size``, and
    the ``columns`` read). Raises InstructionDataError, with the reason for the page, for data that cannot become
    a dataset."""
    own = own_tokenizer(dataset, Kind(dataset.kind), _rendered)
    records, tokenizer, chat = own.records, own.tokenizer, own.chat
    encoded = worker_door.encode_examples(chat, _rows(own.ordered), byte_lengths=token_byte_lengths(tokenizer))
    bad, train, validation = kept_split(own, encoded)
    _check_split(len(train), len(validation), encoded)

    with Partials(dataset.directory) as partials:
        tokenizer.save(str(partials.path(dataset.tokenizer_path)))
        _write_records(partials.path(dataset.records_path), train + validation)
        partials.path(dataset.bad_rows_path).write_text(
            json.dumps([[row.line, row.reason] for row in bad]))
        encoded.examples.save(partials.path(dataset.examples_dir))
        partials.path(dataset.preview_path).write_text(
            json.dumps(preview(chat, train, encoded.examples, n_train=len(train))))
    return {"n_rows": records.rows, "n_examples": len(encoded.examples),
            "n_bad_rows": records.n_bad + len(encoded.failed),
            "train_examples": len(train), "n_tokens": len(encoded.examples.ids),
            "vocab_size": tokenizer.get_vocab_size(), "columns": dict(records.layout.columns)}


def instruction_tokens_build(tokens: DatasetTokens) -> dict[str, Any]:
    """Encode a ready instruction dataset's examples (its ``records.jsonl``, in its order) with the pretrained
    tokenizer of a `DatasetTokens` row and its chat template (the row's, else the checkpoint's, else ChatML),
    and save them to the row's ``examples_dir``; returns the row's figures. Examples the template refuses are
    left out, and the returned ``message`` says how many. Raises InstructionDataError when the tokenizer or
    the template cannot be used, or no example of a split is left."""
    dataset = tokens.dataset
    chat = pretrained_chat(tokens)
    rows = list(stored_rows(dataset.records_path))
    encoded = worker_door.encode_examples(chat, rows, byte_lengths=token_byte_lengths(chat.backend_tokenizer))
    train_lines = {line for line, _, _ in rows[: dataset.train_examples]}
    n_train = sum(1 for line in encoded.lines if line in train_lines)
    _check_split(n_train, len(encoded.examples) - n_train, encoded)
    with Partials(dataset.directory) as partials:
        encoded.examples.save(partials.path(tokens.examples_dir))
    message = ""
    if encoded.failed:
        line, reason = encoded.failed[0]
        message = (f"{len(encoded.failed)} examples the chat template refuses are left out; first: line {line}: "
                   f"{reason}")
    return {"n_tokens": len(encoded.examples.ids), "max_id": int(encoded.examples.ids.max()),
            "train_examples": n_train, "val_start": None, "message": message}


def pretrained_chat(tokens: DatasetTokens) -> PreTrainedTokenizerBase:
    """The pretrained tokenizer of a `DatasetTokens` row with its chat template (the row's, else the checkpoint's,
    else ChatML). Raises InstructionDataError when the tokenizer cannot be read or the template used."""
    from transformers import AutoTokenizer

    try:
        pretrained = AutoTokenizer.from_pretrained(tokens.tokenizer_dir, local_files_only=True)
    except Exception as error:  # transformers raises OSError, ValueError or the tokenizer's own errors
        raise InstructionDataError(f"{tokens.model_name}'s tokenizer could not be read from {tokens.tokenizer_dir} "
                                   f"({type(error).__name__}: {str(error)[:200]}).") from None
    try:
        return worker_door.chat_tokenizer(pretrained, template=tokens.chat_template or None)
    except worker_door.TemplateError as error:
        raise InstructionDataError(f"{tokens.model_name}'s chat template cannot be used: {error}") from None


def stored_rows(path: Path) -> Iterator[tuple[int, str | None, tuple[dict[str, str], ...]]]:
    """The (line, text, messages) rows of a ``records.jsonl`` file, in its order."""
    with path.open(encoding="utf-8") as file:
        for line in file:
            row = json.loads(line)
            yield row["line"], row["text"], tuple(row["messages"])


def preview(chat: PreTrainedTokenizerBase, train: Sequence[Example], examples: ExampleSet, *,
            n_train: int) -> dict[str, object]:
    """The detail page's preview: the first `PREVIEW_EXAMPLES` training examples (their line, token count and
    `segments`), and for each of `LENGTH_LIMITS` the training and validation examples longer than it, which a
    trial of that ``max_seq_len`` drops."""
    lengths = examples.lengths
    return {
        "examples": [{"line": e.line, "tokens": int(lengths[k]), "segments": segments(chat, e)}
                     for k, e in enumerate(train[:PREVIEW_EXAMPLES])],
        "too_long": [{"max_seq_len": limit, "train": int((lengths[:n_train] > limit).sum()),
                      "validation": int((lengths[n_train:] > limit).sum())} for limit in LENGTH_LIMITS],
    }


def segments(chat: PreTrainedTokenizerBase, example: Example) -> list[dict[str, object]]:
    """The example's text as the model sees it, cut into ``{"text", "role", "trained"}`` pieces: where a turn
    begins, and where an assistant turn's trained span (``loss_on`` "assistant") begins and ends. A plain text
    row is one trained piece, its end-of-sequence token included."""
    if example.text is not None:
        return [{"text": example.text + (chat.eos_token or ""), "role": "text", "trained": True}]
    messages = example.messages
    text, spans = worker_door.answer_spans(chat, messages)
    ends = [len(worker_door.render(chat, messages[: k + 1])) for k in range(len(messages))]
    edges = {0, len(text), *ends, *(edge for span in spans for edge in span)}
    cuts = sorted(edge for edge in edges if edge <= len(text))
    pieces = []
    for start, end in pairwise(cuts):
        owner = next((k for k, turn_end in enumerate(ends) if turn_end > start), len(messages) - 1)
        pieces.append({"text": text[start:end], "role": messages[owner]["role"],
                       "trained": any(begin <= start < stop for begin, stop in spans)})
    return pieces


def _rendered(renderer: PreTrainedTokenizerBase, example: Example) -> str:
    if example.text is not None:
        return example.text
    try:
        return worker_door.render(renderer, example.messages)
    except worker_door.TemplateError:  # encoding reports the row as bad; it has no text to learn from
        return ""


def _rows(examples: Sequence[Example]) -> Iterator[tuple[int, str | None, tuple[dict[str, str], ...]]]:
    return ((e.line, e.text, e.messages) for e in examples)


def _check_split(n_train: int, n_val: int, encoded: Encoded) -> None:
    check_split(n_train, n_val, encoded, item="example", none_kept="The chat template refuses every example",
                refused="the rows the chat template refuses")


def check_split(n_train: int, n_val: int, encoded: Encoded, *, item: str, none_kept: str, refused: str) -> None:
    """Raise InstructionDataError unless encoding kept an `item` of each split: `none_kept` with the first
    refusal when it kept none at all, else which split is empty once `refused` are left out."""
    if n_train and n_val:
        return
    if not encoded.lines and encoded.failed:
        line, reason = encoded.failed[0]
        raise InstructionDataError(f"{none_kept}; first: line {line}: {reason}")
    missing = "training" if not n_train else "validation"
    raise InstructionDataError(f"No {missing} {item} is left once {refused} are left out ({len(encoded.failed)} "
                               "of them); upload more rows.")


def _write_records(path: Path, examples: Sequence[Example]) -> None:
    with path.open("w", encoding="utf-8") as file:
        for e in examples:
            file.write(json.dumps({"line": e.line, "text": e.text, "messages": list(e.messages)}) + "\n")


def file_named(message: str, dataset: Dataset) -> str:
    """A RecordsError's message about the stored file, naming the file as the user knows it."""
    stored = f"{dataset.source_path.name}: "
    return f"{Path(dataset.filename).name}: {message[len(stored):]}" if message.startswith(stored) else message


class Partials:
    """Files and directories written under temporary names in `directory`, renamed into place (an earlier
    run's replaced) when the block ends without an error, and removed when it raises."""

    def __init__(self, directory: Path) -> None:
        self.root = directory
        self.moves: list[tuple[Path, Path]] = []

    def path(self, final: Path) -> Path:
        """Where to write what becomes `final` (a file or a directory)."""
        partial = self.root / f".partial-{uuid.uuid4().hex}{final.suffix}"
        self.moves.append((partial, final))
        return partial

    def __enter__(self) -> Partials:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        try:
            if kind is None:
                for partial, final in self.moves:
                    _replace(partial, final)
        finally:
            for partial, _ in self.moves:
                if partial.is_dir():
                    shutil.rmtree(partial, ignore_errors=True)
                else:
                    partial.unlink(missing_ok=True)


def _replace(partial: Path, final: Path) -> None:
    if not partial.is_dir():
        os.replace(partial, final)
        return
    stale = final.with_name(f".stale-{uuid.uuid4().hex}")
    if final.exists():
        final.rename(stale)
    partial.rename(final)
    shutil.rmtree(stale, ignore_errors=True)
