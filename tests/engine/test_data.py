"""Corpus -> tokenizer -> packed blocks -> seeded batches that cover each block once per epoch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from worker.engine import DataSpec
from worker.engine.data import TokenBlocks, tokenize_corpus


def test_it_tokenizes_a_corpus_with_a_trained_byte_level_bpe(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200 + "héllo wörld\n")
    path, vocab_size = tokenize_corpus(corpus, tmp_path / "out", vocab_size=300)
    tokens = np.load(path)
    assert tokens.dtype == np.int32 and 0 < tokens.max() < vocab_size <= 300
    assert len(tokens) < len(corpus.read_bytes()) / 2  # merges were learned
    assert (tmp_path / "out" / "tokenizer.json").exists()


def test_it_shuffles_reproducibly_and_covers_each_block_per_epoch(tmp_path: Path) -> None:
    np.save(tmp_path / "tokens.npy", np.arange(4 * 50, dtype=np.int32) % 97)
    blocks = TokenBlocks(DataSpec(tokens_path=str(tmp_path / "tokens.npy"), seq_len=4, val_fraction=0.2),
                         vocab_size=97)
    assert blocks.n_train == 40
    epoch = torch.cat([blocks.train_batch(seed=3, step=s, batch_size=8) for s in range(5)])  # (40, 4)
    assert sorted(epoch[:, 0].tolist()) == sorted(blocks.blocks[:40, 0].tolist())
    assert torch.equal(blocks.train_batch(seed=3, step=2, batch_size=8), epoch[16:24])
    assert not torch.equal(blocks.train_batch(seed=4, step=0, batch_size=8), epoch[:8])
    assert blocks.eval_batch(batch=0, batch_size=3)[0, 0].item() == blocks.blocks[40, 0]
