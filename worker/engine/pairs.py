"""Preference pairs: a prompt with a chosen and a rejected answer, rendered with the chat template, tokenized, and
laid out so that a pair's two sequences go through the model in the same micro-batch.

**Encoding** (:func:`encode_pair`) follows TRL's ``DPOTrainer`` for conversational pairs: the prompt's messages
rendered with the generation prompt, and the prompt followed by each answer's messages rendered whole, each text
tokenized without added special tokens (the template writes them). The answer starts where the prompt's tokens
and those of both whole conversations stop agreeing (the end of the prompt, or earlier when a token merges
across the boundary), so the two sequences share their prompt token for token; each answer holds its text and
the template's end-of-turn tokens (``<|im_end|>``), which a model must learn to stop with.

**On disk** a pair set is an example set (:class:`~worker.engine.examples.ExampleSet`) of 2N sequences: pair k's
chosen sequence (prompt, then chosen answer) is example 2k and its rejected sequence example 2k + 1, their tokens
marked PROMPT then LAST_ANSWER, and ``pairs.json`` beside the arrays says it holds N pairs (an instruction
trial refuses such a set, and a DPO trial any other). Loading checks every pair: both sequences are the same
prompt of at least one token followed by an answer of at least one.

**Rows** (:class:`PairRows`): a pair fits when each of its sequences fits ``seq_len``; a longer one is dropped and
counted, never cut. A pair takes two rows, its chosen sequence in the upper and its rejected sequence in the lower
one: without packing a row pair holds one pair; with packing several, first fit as for examples
(:func:`pack_pairs`), the upper row holding their chosen sequences and the lower one their rejected sequences, in
the same order. A micro-batch has an even number of rows, so a pair's two sequences are always in
the same micro-batch, and never cut across rows. Every token knows its sequence (:attr:`PairBatch.sequences`),
from which each answer's log-probability is summed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from worker.engine.chat import LAST_ANSWER, PROMPT, Message, TemplateError, render
from worker.engine.errors import SpecError
from worker.engine.examples import IGNORE, PACK_WINDOW, PAIRS_FILE, Encoded, ExampleRows, ExampleSet, Row

_CHECK_PAIRS = 1 << 16  # pairs whose prompts are compared at once when a set is loaded


class PairError(SpecError):
    """A preference pair that cannot train: its prompt or one of its answers renders to no token."""


# -- encoding ---------------------------------------------------------------------------------------------


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def _tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_pair(tokenizer: PreTrainedTokenizerBase, prompt: Sequence[Message], chosen: Sequence[Message],
                rejected: Sequence[Message]) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The chosen and the rejected sequence of a pair, each (ids int32, marks uint8): the prompt's messages
    followed by the answer's (usually one assistant message), rendered with `tokenizer`'s chat template (see
    :func:`worker.engine.chat.chat_tokenizer`). Raises TemplateError when the template fails, PairError when the
    prompt or an answer renders to no token."""
    prompt_ids = _tokens(tokenizer, render(tokenizer, prompt, add_generation_prompt=True))
    sequences = [_tokens(tokenizer, render(tokenizer, [*prompt, *answer])) for answer in (chosen, rejected)]
    shared = min(common_prefix(prompt_ids, ids) for ids in sequences)
    if shared == 0:
        raise PairError("the prompt renders to no token of its own, so an answer's first token would be predicted "
                        "from nothing")
    encoded = []
    for which, ids in zip(("chosen", "rejected"), sequences, strict=True):
        if len(ids) == shared:
            raise PairError(f"the {which} answer renders to no token")
        marks = np.full(len(ids), LAST_ANSWER, dtype=np.uint8)
        marks[:shared] = PROMPT
        encoded.append((np.asarray(ids, dtype=np.int32), marks))
    return encoded[0], encoded[1]


def encode_pairs(tokenizer: PreTrainedTokenizerBase,
                 rows: Iterable[tuple[int, Sequence[Message], Sequence[Message], Sequence[Message]]], *,
                 byte_lengths: np.ndarray | None = None) -> Encoded:
    """Tokenize rows of (line, prompt, chosen, rejected) messages into a pair set (its ``examples``: two a pair,
    chosen first; ``lines``: one a pair). A row the template or :func:`encode_pair` fails on is reported with its
    line, not raised. `byte_lengths`: each vocabulary id's UTF-8 bytes, kept per token for bits per byte."""
    sequences: list[tuple[np.ndarray, np.ndarray]] = []
    lines: list[int] = []
    failed: list[tuple[int, str]] = []
    for line, prompt, chosen, rejected in rows:
        try:
            sequences.extend(encode_pair(tokenizer, prompt, chosen, rejected))
        except (TemplateError, PairError) as error:
            failed.append((line, str(error)))
            continue
        lines.append(line)
    return Encoded(ExampleSet.from_examples(sequences, byte_lengths), lines, failed)


def save_pairs(examples: ExampleSet, directory: Path) -> None:
    """Write a pair set (as :func:`encode_pairs` makes it) into `directory`."""
    assert len(examples) % 2 == 0, "two sequences a pair"
    examples.save(directory)
    (directory / PAIRS_FILE).write_text(json.dumps({"pairs": len(examples) // 2}))


def load_pairs(directory: Path) -> ExampleSet:
    """The pair set in `directory`, checked (see the module docstring); SpecError naming the first bad pair."""
    try:
        declared = json.loads((directory / PAIRS_FILE).read_text())["pairs"]
    except FileNotFoundError:
        raise SpecError(f"{directory} holds no preference pairs ({PAIRS_FILE} is missing): DPO trains on pairs, "
                        "instruction examples train with the language-modelling loss") from None
    except (ValueError, KeyError, TypeError) as error:
        raise SpecError(f"{directory / PAIRS_FILE} is unreadable: {error}") from None
    examples = ExampleSet.load(directory)
    if not isinstance(declared, int) or len(examples) != 2 * declared:
        raise SpecError(f"{directory} declares {declared!r} pairs but holds {len(examples)} sequences")
    bad = _first_bad_pair(examples)
    if bad is not None:
        raise SpecError(f"{directory}: pair {bad[0]} {bad[1]}")
    return examples


def _first_bad_pair(examples: ExampleSet) -> tuple[int, str] | None:
    """(index, what is wrong) of the first pair whose sequences are not one prompt then an answer each."""
    starts = np.asarray(examples.starts, dtype=np.int64)
    answer = np.asarray(examples.marks) != PROMPT
    answers = np.add.reduceat(answer.astype(np.int64), starts[:-1]) if len(answer) else np.zeros(0, np.int64)
    prompts = np.diff(starts) - answers
    leading = np.concatenate([[0], np.cumsum(~answer)])  # prompt marks before each token
    prefix = leading[starts[:-1] + prompts] - leading[starts[:-1]] == prompts  # the prompt marks lead the sequence
    bad_sequence = (prompts < 1) | (answers < 1) | ~prefix
    bad = bad_sequence[0::2] | bad_sequence[1::2] | (prompts[0::2] != prompts[1::2])
    first = np.flatnonzero(bad)
    if len(first):
        return int(first[0]), "is not two sequences of one prompt followed by an answer of at least one token"
    firsts = starts[:-1]  # each sequence's first token
    for begin in range(0, len(prompts) // 2, _CHECK_PAIRS):  # the prompts' tokens, a block of pairs at a time
        block = slice(2 * begin, 2 * (begin + _CHECK_PAIRS))
        lengths = prompts[block][0::2]
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        chosen = np.repeat(firsts[block][0::2], lengths) + within
        rejected = np.repeat(firsts[block][1::2], lengths) + within
        differ = np.asarray(examples.ids[chosen]) != np.asarray(examples.ids[rejected])
        if differ.any():
            pair = begin + int(np.searchsorted(np.cumsum(lengths), int(np.flatnonzero(differ)[0]), side="right"))
            return pair, "has a chosen and a rejected sequence with different prompts"
    return None


# -- rows -------------------------------------------------------------------------------------------------


def pack_pairs(lengths: np.ndarray, order: np.ndarray, seq_len: int) -> list[Row]:
    """Pairs in `order` packed into row pairs of at most `seq_len` tokens a row, first fit as
    :func:`worker.engine.examples.pack` packs examples: each pair joins the first of the last `PACK_WINDOW` row
    pairs where its chosen sequence (`lengths` (N, 2), column 0) fits the upper row and its rejected one the lower
    row, else starts a row pair."""
    widths = lengths.tolist()
    rows: list[list[int]] = []
    upper: list[int] = []  # free tokens of each row pair's upper row
    lower: list[int] = []
    for pair in order.tolist():
        chosen, rejected = widths[pair]
        first_open = max(0, len(rows) - PACK_WINDOW)
        target = next((r for r in range(first_open, len(rows)) if upper[r] >= chosen and lower[r] >= rejected),
                      None)
        if target is None:
            rows.append([])
            upper.append(seq_len)
            lower.append(seq_len)
            target = len(rows) - 1
        rows[target].append(pair)
        upper[target] -= chosen
        lower[target] -= rejected
    return [tuple(row) for row in rows]


@dataclass(frozen=True)
class PairBatch:
    """Row pairs of a batch: (B, T) int64 tensors whose rows 2r and 2r + 1 hold the chosen and the rejected
    sequences of the pairs of row pair r.

    ``pairs`` is the number of pairs of the whole batch, also in each of its micro-batches: a micro-batch
    divides its summed pair losses by it (:mod:`worker.engine.dpo`)."""

    ids: torch.Tensor  # token ids, PAD_ID after the last sequence of a row
    labels: torch.Tensor  # the answers' tokens, else IGNORE
    position_ids: torch.Tensor  # from 0 at each sequence's first token
    sequences: torch.Tensor  # the q-th pair's chosen tokens 2q, its rejected tokens 2q + 1; padding -1
    keys: torch.Tensor  # (count,) each pair's index into the trial's reference log-probabilities
    pairs: int

    @property
    def count(self) -> int:
        """The pairs of this (micro-)batch."""
        return len(self.keys)

    def micro_batch(self, n: int, index: int, device: torch.device) -> PairBatch:
        """Micro-batch `index` of `n` equal ones (an even number of rows each: whole row pairs), its sequences
        numbered from 0, on `device`; its ``pairs`` are the whole batch's."""
        def part(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.chunk(n)[index]
        sequences = part(self.sequences)
        first = int(sequences[sequences >= 0].min()) // 2  # every row pair holds a pair
        count = int(sequences.max()) // 2 + 1 - first
        return PairBatch(ids=part(self.ids).to(device), labels=part(self.labels).to(device),
                         position_ids=part(self.position_ids).to(device),
                         sequences=torch.where(sequences >= 0, sequences - 2 * first, -1).to(device),
                         keys=self.keys[first: first + count], pairs=self.pairs)

    def answer_tokens(self) -> torch.Tensor:
        """(2 * count,) float: the predicted answer tokens of each sequence (every one but a first token)."""
        predicted = self.labels[:, 1:] != IGNORE
        owners = self.sequences[:, 1:][predicted]
        return torch.bincount(owners, minlength=2 * self.count).to(torch.float32)


class PairRows(ExampleRows):
    """A trial's view of a pair set (:func:`load_pairs`): the pairs both of whose sequences fit ``seq_len``, the
    first ``n_train`` pairs of the set training and the rest validating, laid out into row pairs.

    Batches keep :class:`ExampleRows`' rules with a row pair for a row: ``batch_size`` rows are
    ``batch_size // 2`` row pairs, training ones in seeded epochs, validation ones in order, and the final
    evaluation one pair a row pair. The *reference* order (:attr:`reference_order`) is every kept training pair,
    then every kept validation pair, in the set's order: a trial that keeps its reference log-probabilities
    computes and stores them in that order (``keys``)."""

    ITEM = "pair"

    @staticmethod
    def load(directory: Path) -> ExampleSet:
        return load_pairs(directory)

    def _item_lengths(self) -> np.ndarray:
        return self.examples.lengths.reshape(-1, 2)  # (pairs, 2): chosen, rejected

    def _layout(self, items: np.ndarray) -> list[Row]:
        if self.packing:
            return pack_pairs(self._lengths, items, self.seq_len)
        return [(int(k),) for k in items]

    @cached_property
    def reference_order(self) -> np.ndarray:
        return np.concatenate([self.train_examples, self.val_examples])

    @cached_property
    def keys(self) -> np.ndarray:
        """Each pair's place in :attr:`reference_order` (-1: dropped)."""
        keys = np.full(len(self._lengths), -1, dtype=np.int64)
        keys[self.reference_order] = np.arange(len(self.reference_order))
        return keys

    def pair_tensors(self, rows: list[Row]) -> PairBatch:
        """Row pairs `rows` (pair indices each) as a batch of 2 x len(rows) rows."""
        arrays = self._empty_rows(2 * len(rows))
        sequences = np.full((2 * len(rows), self.seq_len), -1, dtype=np.int64)
        order: list[int] = []
        for r, row in enumerate(rows):
            for side in (0, 1):  # chosen above, rejected below
                placed = self._fill(arrays, 2 * r + side, [2 * pair + side for pair in row], scored=True)
                for q, (pair, at) in enumerate(zip(row, placed, strict=True), start=len(order)):
                    sequences[2 * r + side, at: at + int(self._lengths[pair, side])] = 2 * q + side
            order.extend(row)
        ids, labels, positions = (torch.from_numpy(a) for a in arrays)
        return PairBatch(ids=ids, labels=labels, position_ids=positions, sequences=torch.from_numpy(sequences),
                         keys=torch.from_numpy(self.keys[order]), pairs=len(order))

    def train_batch(self, *, seed: int, step: int, batch_size: int) -> PairBatch:  # type: ignore[override]
        return self.pair_tensors(self.train_rows(seed=seed, step=step, batch_size=batch_size // 2))

    def _val_rows(self, batch: int, batch_size: int) -> list[Row]:
        rows, per = self.val_rows, batch_size // 2
        return [rows[k % len(rows)] for k in range(batch * per, (batch + 1) * per)]

    def eval_batch(self, *, batch: int, batch_size: int) -> PairBatch:  # type: ignore[override]
        """Validation batch number `batch` of `batch_size` rows (wrapping around the validation row pairs)."""
        return self.pair_tensors(self._val_rows(batch, batch_size))

    def eval_bytes(self, *, batch: int, batch_size: int) -> int | None:
        """UTF-8 bytes of the chosen answers' tokens :meth:`eval_batch` predicts; None without ``token_bytes``."""
        return self._chosen_bytes(self._val_rows(batch, batch_size))

    def final_batch(self, *, batch: int, batch_size: int) -> tuple[PairBatch, int | None]:  # type: ignore[override]
        """The final evaluation's batch number `batch`: the validation pairs one a row pair, every one once (the
        last batch may be shorter), and the UTF-8 bytes of its chosen answers' predicted tokens."""
        per = batch_size // 2
        rows = [(int(k),) for k in self.val_examples[batch * per: (batch + 1) * per]]
        return self.pair_tensors(rows), self._chosen_bytes(rows)

    def reference_batches(self, batch_size: int) -> int:
        """Batches of `batch_size` rows, one pair a row pair, that cover :attr:`reference_order`."""
        return math.ceil(len(self.reference_order) / (batch_size // 2))

    def reference_batch(self, *, batch: int, batch_size: int) -> PairBatch:
        """Reference batch number `batch`: the next ``batch_size // 2`` pairs of :attr:`reference_order`, one a
        row pair (the last batch may be shorter); their keys are their places in that order."""
        per = batch_size // 2
        return self.pair_tensors([(int(k),) for k in self.reference_order[batch * per: (batch + 1) * per]])

    def _chosen_bytes(self, rows: list[Row]) -> int | None:
        if self.token_bytes is None:
            return None
        return self._labelled_bytes([tuple(2 * pair for pair in row) for row in rows])

    def efficiency(self, rows: list[Row]) -> float:
        return sum(int(self._lengths[k].sum()) for row in rows for k in row) / (2 * len(rows) * self.seq_len)
