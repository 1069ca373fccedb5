"""Data: corpus -> byte-level BPE tokens -> packed blocks -> seeded, reproducible batches.

Batches are a pure function of (tokens, seed, step): no torch RNG is consumed (the dropout stream must
match plain training), and any process can rebuild any micro-batch without shared state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from tokenizers.decoders import ByteLevel as ByteLevelDecoder
from tokenizers.models import BPE
from tokenizers.pre_tokenizers import ByteLevel as ByteLevelPre
from tokenizers.trainers import BpeTrainer

from worker.engine.config import DataSpec
from worker.engine.errors import SpecError


def train_tokenizer(corpus: Path, vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer trained on ``corpus`` (UTF-8 text) with at most ``vocab_size`` tokens."""
    tokenizer = Tokenizer(BPE())
    tokenizer.pre_tokenizer = ByteLevelPre(add_prefix_space=False)
    tokenizer.decoder = ByteLevelDecoder()
    trainer = BpeTrainer(vocab_size=vocab_size, initial_alphabet=ByteLevelPre.alphabet(),
                         special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer.train([str(corpus)], trainer)
    return tokenizer


def tokenize_corpus(corpus: Path, out_dir: Path, *, vocab_size: int = 512,
                    tokenizer_dir: Path | None = None) -> tuple[Path, int]:
    """Tokenize ``corpus`` into ``out_dir/tokens.npy`` (int32); return that path and the vocabulary size.

    Uses ``tokenizer_dir/tokenizer.json`` when given, else trains a byte-level BPE on the corpus and saves
    it as ``out_dir/tokenizer.json``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    else:
        tokenizer = train_tokenizer(corpus, vocab_size)
        tokenizer.save(str(out_dir / "tokenizer.json"))
    ids = tokenizer.encode(corpus.read_text(encoding="utf-8")).ids
    path = out_dir / "tokens.npy"
    np.save(path, np.asarray(ids, dtype=np.int32))
    return path, tokenizer.get_vocab_size()


class TokenBlocks:
    """Packed blocks of ``seq_len`` tokens, split into train and validation; see :class:`DataSpec`."""

    def __init__(self, spec: DataSpec, *, vocab_size: int) -> None:
        tokens = np.load(spec.tokens_path, mmap_mode="r")
        n_blocks = len(tokens) // spec.seq_len
        n_val = max(1, int(n_blocks * spec.val_fraction))
        if n_blocks - n_val < 1:
            raise SpecError(f"{spec.tokens_path} has {len(tokens)} tokens: too few for seq_len {spec.seq_len}")
        if int(tokens.max()) >= vocab_size:
            raise SpecError(f"{spec.tokens_path} has token id {int(tokens.max())} >= vocab_size {vocab_size}")
        self.blocks = np.asarray(tokens[: n_blocks * spec.seq_len]).reshape(n_blocks, spec.seq_len)  # (N, T)
        self.n_train = n_blocks - n_val

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
        return torch.from_numpy(self.blocks[rows].astype(np.int64))

    def eval_batch(self, *, batch: int, batch_size: int) -> torch.Tensor:
        """The (batch_size, T) int64 validation batch number ``batch`` (wrapping around the split)."""
        n_val = len(self.blocks) - self.n_train
        rows = [self.n_train + (k % n_val) for k in range(batch * batch_size, (batch + 1) * batch_size)]
        return torch.from_numpy(self.blocks[rows].astype(np.int64))
