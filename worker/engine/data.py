"""Data: corpus -> byte-level BPE tokens -> packed blocks -> seeded, reproducible batches.

Batches are a pure function of (tokens, seed, step): no torch RNG is consumed (the dropout stream must
match plain training), and any process can rebuild any micro-batch without shared state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from worker.engine.config import DataSpec
from worker.engine.errors import SpecError
from worker.engine.examples import Batch, ExampleRows
from worker.engine.pairs import PairBatch, PairRows
from worker.engine.tokenizer import TOKENIZER_JSON, train_tokenizer


def tokenize_corpus(corpus: Path, out_dir: Path, *, vocab_size: int = 512,
                    tokenizer_dir: Path | None = None) -> tuple[Path, int]:
    """Tokenize ``corpus`` into ``out_dir/tokens.npy`` (int32); return that path and the vocabulary size.

    Uses ``tokenizer_dir/tokenizer.json`` when given, else trains a byte-level BPE on the corpus
    (`worker.engine.tokenizer.train_tokenizer`) and saves it as ``out_dir/tokenizer.json``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    text = corpus.read_text(encoding="utf-8")
    if tokenizer_dir is not None:
        tokenizer = Tokenizer.from_file(str(tokenizer_dir / TOKENIZER_JSON))
    else:
        tokenizer = train_tokenizer(text, vocab_size)
        tokenizer.save(str(out_dir / TOKENIZER_JSON))
    ids = tokenizer.encode(text).ids
    path = out_dir / "tokens.npy"
    np.save(path, np.asarray(ids, dtype=np.int32))
    return path, tokenizer.get_vocab_size()


class TokenBlocks:
    """Packed blocks of ``seq_len`` tokens, split into train and validation; see :class:`DataSpec`.

    With ``val_start`` the training blocks pack the tokens before it (a last partial block is left out) and
    the validation blocks the tokens from it on; the final evaluation's blocks cover the declared held-out
    tokens (``holdout_tokens``) to the last one, the rest after the full blocks as one shorter block.
    """

    def __init__(self, spec: DataSpec, *, vocab_size: int) -> None:
        tokens = np.load(spec.tokens_path, mmap_mode="r")
        seq_len = self.seq_len = spec.seq_len
        if spec.val_start is None:
            n_blocks = len(tokens) // seq_len
            n_val = max(1, int(n_blocks * spec.val_fraction))
            self.n_train = n_blocks - n_val
            val_begin = self.n_train * seq_len
        else:
            if spec.val_start >= len(tokens):
                raise SpecError(f"{spec.tokens_path} has {len(tokens)} tokens: none from val_start {spec.val_start}")
            self.n_train = spec.val_start // seq_len
            val_begin = spec.val_start
            n_val = (len(tokens) - val_begin) // seq_len
            if n_val < 1:
                raise SpecError(f"{spec.tokens_path} has {len(tokens) - val_begin} validation tokens: too few for "
                                f"seq_len {spec.seq_len}")
        if self.n_train < 1:
            raise SpecError(f"{spec.tokens_path} has {len(tokens)} tokens: too few for seq_len {spec.seq_len}")
        if int(tokens.max()) >= vocab_size:
            raise SpecError(f"{spec.tokens_path} has token id {int(tokens.max())} >= vocab_size {vocab_size}")
        self.tokens = tokens
        self.train_blocks = np.asarray(tokens[: self.n_train * seq_len]).reshape(self.n_train, seq_len)  # (N, T)
        self.val_begin = val_begin
        self.val_blocks = np.asarray(tokens[val_begin: val_begin + n_val * seq_len]).reshape(n_val, seq_len)
        self.token_bytes = None
        if spec.token_bytes_path is not None:
            self.token_bytes = np.load(spec.token_bytes_path, mmap_mode="r")
            if len(self.token_bytes) != len(tokens):
                raise SpecError(f"{spec.token_bytes_path} has {len(self.token_bytes)} byte counts for "
                                f"{len(tokens)} tokens")
        self.holdout_end = val_begin + n_val * seq_len
        if spec.holdout_tokens is not None:
            self.holdout_end = val_begin + spec.holdout_tokens
            if self.holdout_end > len(tokens):
                raise SpecError(f"{spec.tokens_path} has {len(tokens) - val_begin} validation tokens, fewer than "
                                f"the {spec.holdout_tokens} held-out tokens declared")

    @property
    def blocks(self) -> np.ndarray:
        """Every block, training then validation (the same rows as before ``val_start`` existed)."""
        return np.concatenate([self.train_blocks, self.val_blocks])

    def _train_order(self, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(self.n_train)

    def train_batch(self, *, seed: int, step: int, batch_size: int) -> torch.Tensor:
        """The (batch_size, T) int64 training batch of ``step``: epochs of seeded permutations."""
        orders: dict[int, np.ndarray] = {}
        rows = []
        for k in range(step * batch_size, (step + 1) * batch_size):
            epoch, position = divmod(k, self.n_train)
            if epoch not in orders:
                orders[epoch] = self._train_order(seed, epoch)
            rows.append(orders[epoch][position])
        return torch.from_numpy(self.train_blocks[rows].astype(np.int64))

    def _eval_starts(self, batch: int, batch_size: int) -> list[int]:
        rows = range(batch * batch_size, (batch + 1) * batch_size)
        return [self.val_begin + (k % len(self.val_blocks)) * self.seq_len for k in rows]

    def eval_batch(self, *, batch: int, batch_size: int) -> torch.Tensor:
        """The (batch_size, T) int64 validation batch number ``batch`` (wrapping around the split)."""
        rows = [(k % len(self.val_blocks)) for k in range(batch * batch_size, (batch + 1) * batch_size)]
        return torch.from_numpy(self.val_blocks[rows].astype(np.int64))

    def eval_bytes(self, *, batch: int, batch_size: int) -> int | None:
        """UTF-8 bytes of the tokens :meth:`eval_batch` predicts (every token of a block but its first);
        None without ``token_bytes_path``."""
        return self._predicted_bytes(self._eval_starts(batch, batch_size), self.seq_len)

    def final_blocks(self, *, batch: int, batch_size: int) -> tuple[list[int], int]:
        """(first token of each block, block length) of the final evaluation's batch number ``batch``."""
        full = (self.holdout_end - self.val_begin) // self.seq_len
        batches = -(-full // batch_size)
        if batch < batches:
            rows = range(batch * batch_size, min(full, (batch + 1) * batch_size))
            return [self.val_begin + k * self.seq_len for k in rows], self.seq_len
        start = self.val_begin + full * self.seq_len
        return [start], self.holdout_end - start

    def final_batch(self, *, batch: int, batch_size: int) -> tuple[torch.Tensor, int | None]:
        """The final evaluation's batch number ``batch`` as (rows, length) int64 ids, and the UTF-8 bytes of
        the tokens it predicts (None without ``token_bytes_path``)."""
        starts, length = self.final_blocks(batch=batch, batch_size=batch_size)
        ids = np.stack([np.asarray(self.tokens[s: s + length]) for s in starts]).astype(np.int64)
        return torch.from_numpy(ids), self._predicted_bytes(starts, length)

    def _predicted_bytes(self, starts: list[int], length: int) -> int | None:
        if self.token_bytes is None:
            return None
        return sum(int(np.asarray(self.token_bytes[s + 1: s + length], dtype=np.int64).sum()) for s in starts)


def trial_data(spec: DataSpec, *, vocab_size: int) -> TokenBlocks | ExampleRows | PairRows:
    """The data a trial trains on: token blocks, rows of instruction and chat examples, or row pairs of
    preference pairs."""
    if spec.pairs:
        return PairRows.of(spec, vocab_size=vocab_size)  # type: ignore[return-value]
    if spec.examples_dir is not None:
        return ExampleRows.of(spec, vocab_size=vocab_size)
    return TokenBlocks(spec, vocab_size=vocab_size)


def train_batch(data: TokenBlocks | ExampleRows | PairRows, *, seed: int, step: int,
                batch_size: int) -> Batch | PairBatch:
    """Training step `step`'s batch of any kind of data, with its labels and positions."""
    batch = data.train_batch(seed=seed, step=step, batch_size=batch_size)
    return Batch.of_blocks(batch) if isinstance(batch, torch.Tensor) else batch


def eval_batch(data: TokenBlocks | ExampleRows | PairRows, *, batch: int, batch_size: int) -> Batch | PairBatch:
    """Validation batch number `batch` of any kind of data, with its labels and positions."""
    rows = data.eval_batch(batch=batch, batch_size=batch_size)
    return Batch.of_blocks(rows) if isinstance(rows, torch.Tensor) else rows
