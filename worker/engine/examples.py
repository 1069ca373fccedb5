"""Instruction and chat examples -> rows of token ids with their labels and positions, packed or one per row.

A tokenized example set is three arrays in one directory: ``ids.npy`` (int32, every example's tokens one
after another), ``marks.npy`` (uint8, each token's :mod:`~worker.engine.chat` mark) and ``starts.npy``
(int64, where each example begins, and the end: N + 1 entries), and optionally ``token_bytes.npy`` (uint16,
the UTF-8 bytes of text each token stands for), from which evaluations report bits per byte of the tokens
the loss covers. Examples longer than the trial's sequence
length are dropped, never cut (a cut answer teaches the model to stop mid-sentence), and counted.

A row holds one example (``packing`` off) or several whole examples (``packing`` on: each joins the first
recent row it fits in, in the seeded order; see :func:`pack`). Positions restart at 0 on each example's first
token: the attention of the model's own mask functions keeps to each example when positions restart
(``transformers.masking_utils`` reads packed rows from ``position_ids``), and rotary or learned position
embeddings see the numbers they would see unpacked. An example's first token is never a label (unpacked,
nothing precedes it), so packing changes which examples share a row, not what any example's loss is. Padding
fills each row's end; its labels are -100 and its positions go on from the last example's.

Like :class:`~worker.engine.data.TokenBlocks`, every batch is a pure function of (examples, seed, step): no
torch RNG is consumed, and any process can rebuild any micro-batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from worker.engine.chat import LAST_ANSWER, LossOn, Message, TemplateError, encode_conversation, trained
from worker.engine.config import DataSpec
from worker.engine.errors import SpecError
from worker.engine.template_sandbox import TemplateLimitError

IGNORE = -100  # the label of a token the loss skips (PyTorch's and transformers' ignore_index)
PAD_ID = 0
PAIRS_FILE = "pairs.json"  # beside the arrays of an example set of preference pairs (worker.engine.pairs)


@dataclass(frozen=True)
class ExampleSet:
    """Tokenized examples: example ``k`` is ``ids[starts[k]:starts[k + 1]]``."""

    ids: np.ndarray  # (N_tokens,) int32
    marks: np.ndarray  # (N_tokens,) uint8
    starts: np.ndarray  # (N_examples + 1,) int64
    token_bytes: np.ndarray | None = None  # (N_tokens,) uint16, or None: no bits per byte

    def __len__(self) -> int:
        return len(self.starts) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)

    @classmethod
    def from_examples(cls, examples: list[tuple[np.ndarray, np.ndarray]],
                      byte_lengths: np.ndarray | None = None) -> ExampleSet:
        """From a list of (ids, marks) pairs, one per example; `byte_lengths` (V,) gives each vocabulary id's
        UTF-8 bytes, from which the set keeps its tokens' bytes."""
        lengths = [len(ids) for ids, _ in examples]
        starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
        ids = np.concatenate([ids for ids, _ in examples]).astype(np.int32) if examples else np.zeros(0, np.int32)
        marks = np.concatenate([m for _, m in examples]).astype(np.uint8) if examples else np.zeros(0, np.uint8)
        token_bytes = None if byte_lengths is None else byte_lengths[ids].astype(np.uint16)
        return cls(ids=ids, marks=marks, starts=starts, token_bytes=token_bytes)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("ids", "marks", "starts", "token_bytes"):
            if getattr(self, name) is not None:
                np.save(directory / f"{name}.npy", getattr(self, name))

    @classmethod
    def load(cls, directory: Path) -> ExampleSet:
        """Raises SpecError when the arrays do not describe one example set."""
        arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r") for name in ("ids", "marks", "starts")}
        ids, marks, starts = arrays["ids"], arrays["marks"], arrays["starts"]
        if len(ids) != len(marks) or len(starts) < 1 or starts[0] != 0 or starts[-1] != len(ids):
            raise SpecError(f"{directory} holds {len(ids)} token ids, {len(marks)} marks and example starts "
                            f"{int(starts[0]) if len(starts) else None}..{int(starts[-1]) if len(starts) else None}:"
                            " they do not describe one example set")
        if np.any(np.diff(starts) < 1):
            raise SpecError(f"{directory} has an empty example")
        token_bytes = None
        if (directory / "token_bytes.npy").exists():
            token_bytes = np.load(directory / "token_bytes.npy", mmap_mode="r")
            if len(token_bytes) != len(ids):
                raise SpecError(f"{directory} has {len(token_bytes)} byte counts for {len(ids)} tokens")
        return cls(ids=ids, marks=marks, starts=starts, token_bytes=token_bytes)


def predicted_tokens(labels: torch.Tensor) -> int:
    """How many tokens of rows labelled `labels` (B, T) the loss covers: the labels after each row's first
    position (a causal LM predicts every token from the ones before it) that are not IGNORE."""
    return int((labels[:, 1:] != IGNORE).sum())


@dataclass(frozen=True)
class Batch:
    """Rows of a batch: (B, T) int64 tensors, and the tokens the loss of the whole batch covers.

    A step's loss is the sum of its token losses over ``loss_tokens``, whichever micro-batch each token is
    in: a micro-batch keeps its batch's count, by which its summed loss is divided, so the loss, the gradients
    and the trained weights do not depend on how the batch is cut (transformers' ``num_items_in_batch``).
    """

    ids: torch.Tensor  # token ids, PAD_ID after the last example
    labels: torch.Tensor  # the token where the loss covers it, else IGNORE
    position_ids: torch.Tensor | None  # from 0 at each example's first token; None: 0..T-1 in every row
    loss_tokens: int  # predicted_tokens of the whole batch, also in each of its micro-batches

    @classmethod
    def of_rows(cls, ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor | None) -> Batch:
        return cls(ids=ids, labels=labels, position_ids=position_ids, loss_tokens=predicted_tokens(labels))

    @classmethod
    def of_blocks(cls, ids: torch.Tensor) -> Batch:
        """Token blocks: every token is a label, positions count from each row's start."""
        return cls.of_rows(ids, ids, None)

    def micro_batch(self, n: int, index: int, device: torch.device) -> Batch:
        """Micro-batch `index` of `n` equal ones, on `device`; its ``loss_tokens`` are the whole batch's."""
        def part(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.chunk(n)[index].to(device)
        return Batch(ids=part(self.ids), labels=part(self.labels),
                     position_ids=None if self.position_ids is None else part(self.position_ids),
                     loss_tokens=self.loss_tokens)


Row = tuple[int, ...]  # the examples of one row, in order


PACK_WINDOW = 32  # rows still open to examples while packing: first fit among them, so packing stays linear


def pack(lengths: np.ndarray, order: np.ndarray, seq_len: int) -> list[Row]:
    """Examples in `order` packed into rows of at most `seq_len` tokens, first fit: each example joins the
    first of the last `PACK_WINDOW` rows it fits in, else starts a row. Rows come in the order they were
    started, and are a pure function of the order."""
    rows: list[list[int]] = []
    room: list[int] = []  # free tokens of each row
    for example in order.tolist():
        length = int(lengths[example])
        first_open = max(0, len(rows) - PACK_WINDOW)
        target = next((r for r in range(first_open, len(rows)) if room[r] >= length), None)
        if target is None:
            rows.append([])
            room.append(seq_len)
            target = len(rows) - 1
        rows[target].append(example)
        room[target] -= length
    return [tuple(row) for row in rows]


class ExampleRows:
    """A trial's view of an example set: the examples that fit ``seq_len``, split into train (the first
    ``n_train`` examples of the set) and validation (the rest), laid out into rows.

    ``dropped`` counts the examples left out for being longer than ``seq_len`` (train, validation). The split,
    the epochs and the layout are in terms of *items* (:meth:`_item_lengths`): here an item is an example of one
    row; :class:`~worker.engine.pairs.PairRows` lays out preference pairs, items of two sequences."""

    ITEM = "example"  # what an item is called in messages

    @classmethod
    def of(cls, spec: DataSpec, *, vocab_size: int) -> ExampleRows:
        """The rows of `spec`'s example set. Raises SpecError for a set that does not fit the model."""
        assert spec.examples_dir is not None and spec.train_examples is not None, "a spec of examples"
        examples = cls.load(Path(spec.examples_dir))
        if len(examples.ids) and int(examples.ids.max()) >= vocab_size:
            raise SpecError(f"{spec.examples_dir} has token id {int(examples.ids.max())} >= vocab_size {vocab_size}")
        return cls(examples, n_train=spec.train_examples, seq_len=spec.seq_len, packing=spec.packing,
                   loss_on=spec.loss_on, holdout_rows=spec.holdout_rows)

    @staticmethod
    def load(directory: Path) -> ExampleSet:
        """The example set in `directory`; SpecError for a set of preference pairs, which trains with DPO."""
        if (directory / PAIRS_FILE).exists():
            raise SpecError(f"{directory} holds preference pairs: they train with DPO (dpo and data.pairs), not as "
                            "instruction examples")
        return ExampleSet.load(directory)

    def __init__(self, examples: ExampleSet, *, n_train: int, seq_len: int, packing: bool,
                 loss_on: LossOn | str, holdout_rows: int | None = None) -> None:
        self.examples, self.seq_len, self.packing, self.loss_on = examples, seq_len, packing, LossOn(loss_on)
        lengths = self._item_lengths()
        widths = lengths.reshape(len(lengths), -1)  # (items, rows an item takes)
        item = self.ITEM
        if not 0 < n_train < len(widths):
            raise SpecError(f"{len(widths)} {item}s cannot split into {n_train} for training and the rest for "
                            "validation: both need at least one")
        fits = (widths <= seq_len).all(1)
        indices = np.arange(len(widths))
        self.train_examples = indices[:n_train][fits[:n_train]]
        self.val_examples = indices[n_train:][fits[n_train:]]
        self.dropped = (int((~fits[:n_train]).sum()), int((~fits[n_train:]).sum()))
        for split, kept in (("training", self.train_examples), ("validation", self.val_examples)):
            if len(kept) == 0:
                raise SpecError(f"no {split} {item} fits a sequence of {seq_len} tokens (the shortest has "
                                f"{int(widths.max(1).min())}); raise max_seq_len")
        rows = widths.shape[1] * len(self.val_examples)
        if holdout_rows is not None and holdout_rows != rows:
            raise SpecError(f"{holdout_rows} held-out rows were declared, but {len(self.val_examples)} validation "
                            f"{item}s fit a sequence of {seq_len} tokens, in {rows} rows")
        self._lengths = lengths
        self._trained = trained(np.asarray(examples.marks), self.loss_on)
        # Evaluations score the answers whatever a trial trains on, so the trials of a loss_on sweep compare.
        self._scored = trained(np.asarray(examples.marks), LossOn.ASSISTANT)
        self.token_bytes = examples.token_bytes
        self._epochs: dict[tuple[int, int], list[Row]] = {}  # (seed, epoch) -> rows, the last two laid out
        self._epoch_sizes: dict[tuple[int, int], int] = {}  # (seed, epoch) -> rows, every epoch laid out once

    def _item_lengths(self) -> np.ndarray:
        """Each item's length in tokens, (items,); or (items, k) for items of k sequences, one a row."""
        return self.examples.lengths

    # -- layout ----------------------------------------------------------------------------------------

    def _layout(self, items: np.ndarray) -> list[Row]:
        if self.packing:
            return pack(self._lengths, items, self.seq_len)
        return [(int(k),) for k in items]

    def epoch_rows(self, *, seed: int, epoch: int) -> list[Row]:
        """Epoch `epoch`'s training rows: the training examples in a seeded order, laid out."""
        key = (seed, epoch)
        if key not in self._epochs:
            order = self.train_examples[np.random.default_rng([seed, epoch]).permutation(len(self.train_examples))]
            if len(self._epochs) >= 2:  # a step's rows span at most two epochs; older ones are not read again
                self._epochs.pop(next(iter(self._epochs)))
            self._epochs[key] = self._layout(order)
            self._epoch_sizes[key] = len(self._epochs[key])
        return self._epochs[key]

    def _epoch_size(self, *, seed: int, epoch: int) -> int:
        if (seed, epoch) not in self._epoch_sizes:
            self.epoch_rows(seed=seed, epoch=epoch)
        return self._epoch_sizes[(seed, epoch)]

    @cached_property
    def val_rows(self) -> list[Row]:
        """The validation examples in their order, laid out (the same rows for every evaluation)."""
        return self._layout(self.val_examples)

    def row_tensors(self, rows: list[Row], *, scored: bool = False) -> Batch:
        """`rows` as a batch of (len(rows), seq_len) tensors, labelled for training (the tokens ``loss_on``
        names), or `scored` for an evaluation (the answers' tokens)."""
        arrays = self._empty_rows(len(rows))
        for r, row in enumerate(rows):
            self._fill(arrays, r, row, scored=scored)
        ids, labels, positions = (torch.from_numpy(a) for a in arrays)
        return Batch.of_rows(ids, labels, positions)

    def _empty_rows(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, labels, positions) of `n` rows of padding: (n, seq_len) int64 each."""
        return (np.full((n, self.seq_len), PAD_ID, dtype=np.int64),
                np.full((n, self.seq_len), IGNORE, dtype=np.int64),
                np.tile(np.arange(self.seq_len, dtype=np.int64), (n, 1)))

    def _fill(self, arrays: tuple[np.ndarray, np.ndarray, np.ndarray], r: int, examples: Sequence[int], *,
              scored: bool) -> list[int]:
        """Lay `examples` one after another into row `r` of `arrays` (see :meth:`_empty_rows`); return where each
        one starts."""
        ids, labels, positions = arrays
        covered = self._scored if scored else self._trained
        starts, at = self.examples.starts, 0
        placed = []
        for example in examples:
            begin, end = int(starts[example]), int(starts[example + 1])
            n = end - begin
            tokens = np.asarray(self.examples.ids[begin:end], dtype=np.int64)
            ids[r, at: at + n] = tokens
            labels[r, at: at + n] = np.where(covered[begin:end], tokens, IGNORE)
            labels[r, at] = IGNORE  # an example's first token is predicted from nothing of its own
            positions[r, at:] = np.arange(self.seq_len - at)
            placed.append(at)
            at += n
        return placed

    # -- batches ---------------------------------------------------------------------------------------

    def train_rows(self, *, seed: int, step: int, batch_size: int) -> list[Row]:
        """The rows of training step `step`: epochs of seeded orders, one after another."""
        epoch, position = 0, step * batch_size
        while position >= (size := self._epoch_size(seed=seed, epoch=epoch)):
            position -= size
            epoch += 1
        rows: list[Row] = []
        while len(rows) < batch_size:
            rows.extend(self.epoch_rows(seed=seed, epoch=epoch)[position: position + batch_size - len(rows)])
            epoch, position = epoch + 1, 0
        return rows

    def train_batch(self, *, seed: int, step: int, batch_size: int) -> Batch:
        return self.row_tensors(self.train_rows(seed=seed, step=step, batch_size=batch_size))

    def eval_batch(self, *, batch: int, batch_size: int) -> Batch:
        """Validation batch number `batch` (wrapping around the validation rows)."""
        rows = self.val_rows
        return self.row_tensors([rows[k % len(rows)] for k in range(batch * batch_size, (batch + 1) * batch_size)],
                                scored=True)

    def final_batch(self, *, batch: int, batch_size: int) -> tuple[Batch, int | None]:
        """The final evaluation's batch number `batch`: the validation examples one a row, every one once (the
        last batch may be shorter), and the UTF-8 bytes of the tokens it labels (None without ``token_bytes``)."""
        rows = [(int(k),) for k in self.val_examples[batch * batch_size: (batch + 1) * batch_size]]
        return self.row_tensors(rows, scored=True), self._labelled_bytes(rows)

    def eval_bytes(self, *, batch: int, batch_size: int) -> int | None:
        """UTF-8 bytes of the tokens :meth:`eval_batch` labels (the answers'); None without ``token_bytes``."""
        rows = self.val_rows
        return self._labelled_bytes([rows[k % len(rows)] for k in range(batch * batch_size, (batch + 1) * batch_size)])

    def _labelled_bytes(self, rows: list[Row]) -> int | None:
        if self.token_bytes is None:
            return None
        total = 0
        for row in rows:
            for example in row:
                begin, end = int(self.examples.starts[example]), int(self.examples.starts[example + 1])
                covered = self._scored[begin + 1: end]  # an example's first token is never a label
                total += int(np.asarray(self.token_bytes[begin + 1: end], dtype=np.int64)[covered].sum())
        return total

    def efficiency(self, rows: list[Row]) -> float:
        """The share of `rows`' token slots that hold an example's token, not padding."""
        lengths = self.examples.lengths
        return sum(int(lengths[k]) for row in rows for k in row) / (len(rows) * self.seq_len)


@dataclass(frozen=True)
class Encoded:
    """What :func:`encode_examples` made of its rows: the example set, and the rows it could not encode."""

    examples: ExampleSet
    lines: list[int]  # the source line (or row number) of each example
    failed: list[tuple[int, str]]  # (line, reason): the template failed on the row


def encode_examples(tokenizer: PreTrainedTokenizerBase, rows: Iterable[tuple[int, str | None, Sequence[Message]]],
                    *, byte_lengths: np.ndarray | None = None) -> Encoded:
    """Tokenize rows of (line, text, messages): a conversation through the tokenizer's chat template (see
    :func:`worker.engine.chat.chat_tokenizer`), a plain text (``messages`` empty) as its tokens and the end of
    sequence, every token trained. A row the template fails on is reported with its line, not raised; a
    rendering past the sandbox's limits raises TemplateLimitError, its line named, and nothing is encoded.
    `byte_lengths`: each vocabulary id's UTF-8 bytes, kept per token for bits per byte."""
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    lines: list[int] = []
    failed: list[tuple[int, str]] = []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for line, text, messages in rows:
        if text is not None:
            ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"] + eos, dtype=np.int32)
            pairs.append((ids, np.full(len(ids), LAST_ANSWER, dtype=np.uint8)))
        else:
            try:
                pairs.append(encode_conversation(tokenizer, messages))
            except TemplateError as error:
                failed.append((line, str(error)))
                continue
            except TemplateLimitError as error:  # the template's fault, not the row's: the next would take as long
                raise TemplateLimitError(f"line {line}: {error}") from None
        lines.append(line)
    return Encoded(ExampleSet.from_examples(pairs, byte_lengths), lines, failed)
