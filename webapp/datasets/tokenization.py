"""Train a byte-level BPE tokenizer on a corpus and turn the corpus into token ids.

Pure functions over text (no Django): `dataset_tokenize` calls them (in the web worker) and stores what
they return. The token file is a 1-D ``.npy`` array, the format the engine's ``DataSpec.tokens_path`` reads;
the validation split is the tail of the token stream, as in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

END_OF_TEXT = "<|endoftext|>"
MIN_VOCAB_SIZE = 300  # 256 byte symbols + the end-of-text token + a few merges
MAX_VOCAB_SIZE = 65_536
ENCODE_CHUNK_LINES = 2_000


@dataclass(frozen=True)
class TokenizedCorpus:
    tokenizer: Tokenizer
    ids: np.ndarray  # (N,) int32 token ids, the dtype the engine's data module writes and reads

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()


def train_tokenizer(text: str, *, vocab_size: int) -> Tokenizer:
    """A GPT-2-style byte-level BPE tokenizer trained on `text` with at most `vocab_size` tokens.

    Every byte is in the alphabet, so any later text encodes; a small corpus may end with fewer merges (and
    so a smaller vocabulary) than asked for.
    """
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size {vocab_size} must be between {MIN_VOCAB_SIZE} and {MAX_VOCAB_SIZE}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[END_OF_TEXT],
        show_progress=False,
    )
    tokenizer.train_from_iterator(_chunks(text), trainer=trainer)
    return tokenizer


def encode_corpus(text: str, tokenizer: Tokenizer) -> np.ndarray:
    """Token ids of `text` as one stream (chunks of lines, so a large corpus encodes in parallel). No special
    tokens are added: a pretrained tokenizer's beginning-of-text token would otherwise open every chunk."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(list(_chunks(text)), add_special_tokens=False):
        ids.extend(encoding.ids)
    return np.asarray(ids, dtype=np.int32)


def tokenize_corpus(text: str, *, vocab_size: int) -> TokenizedCorpus:
    tokenizer = train_tokenizer(text, vocab_size=vocab_size)
    return TokenizedCorpus(tokenizer=tokenizer, ids=encode_corpus(text, tokenizer))


def split_sizes(n_tokens: int, val_fraction: float) -> tuple[int, int]:
    """(train, validation) token counts: the last `val_fraction` of the stream, at least one token, validates."""
    val = min(n_tokens, max(1, round(n_tokens * val_fraction))) if n_tokens else 0
    return n_tokens - val, val


def _chunks(text: str) -> list[str]:
    # Keep line ends inside chunks so the concatenated encodings cover the text exactly.
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i : i + ENCODE_CHUNK_LINES]) for i in range(0, len(lines), ENCODE_CHUNK_LINES)]
