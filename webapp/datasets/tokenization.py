"""Train a byte-level BPE tokenizer on a corpus and turn the corpus into token ids.

Pure functions over text (no Django): `dataset_tokenize` calls them (in the web worker) and stores what
they return. The tokenizer is the engine's (`worker.engine.tokenizer.train_tokenizer`, through
`webapp.worker_door`), so a dataset's tokenizer and the engine's own are trained alike. The token file is a
1-D ``.npy`` array, the format the engine's ``DataSpec.tokens_path`` reads.

The validation split is defined on the text, the same for every tokenizer: the corpus's last
``val_fraction`` of UTF-8 bytes, from a line start (`validation_offset`). The text before it and the text
from it on are encoded apart, so every tokenizer's token stream splits exactly there (``val_start``), and a
second array gives the UTF-8 bytes of text each token covers (`token_bytes`), from which evaluations
report bits per byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer, decoders

from webapp.worker_door import text_chunks, train_tokenizer

SNAP_BYTES = 4096  # how far the validation split moves to reach a line start (else: a character boundary)


@dataclass(frozen=True)
class SplitTokens:
    ids: np.ndarray  # (N,) int32 token ids, the dtype the engine's data module writes and reads
    val_start: int  # the first token of the validation text
    token_bytes: np.ndarray | None  # (N,) uint16 UTF-8 bytes per token; None: the tokenizer does not reproduce
    # the text's bytes (a normalizer changes it), so no bits per byte


@dataclass(frozen=True)
class TokenizedCorpus:
    tokenizer: Tokenizer
    ids: np.ndarray  # (N,) int32 token ids, the dtype the engine's data module writes and reads
    val_start: int = 0
    token_bytes: np.ndarray | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()


def encode_corpus(text: str, tokenizer: Tokenizer) -> np.ndarray:
    """Token ids of `text` as one stream (chunks of lines, so a large corpus encodes in parallel). No special
    tokens are added: a pretrained tokenizer's beginning-of-text token would otherwise open every chunk."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(text_chunks(text), add_special_tokens=False):
        ids.extend(encoding.ids)
    return np.asarray(ids, dtype=np.int32)


def tokenize_corpus(text: str, *, vocab_size: int, val_offset: int) -> TokenizedCorpus:
    """Train a tokenizer on `text` and encode it split at byte `val_offset` (see `encode_split`)."""
    tokenizer = train_tokenizer(text, vocab_size)
    split = encode_split(text, tokenizer, val_offset=val_offset)
    return TokenizedCorpus(tokenizer=tokenizer, ids=split.ids, val_start=split.val_start, token_bytes=split.token_bytes)


def validation_offset(data: bytes, val_fraction: float) -> int:
    """The UTF-8 byte offset where the validation text of `data` begins: its last `val_fraction` of bytes,
    moved to the nearest line start within `SNAP_BYTES` (the first after the exact point, else the last
    before it), else to the next character boundary. At least one byte on either side."""
    n = len(data)
    if n < 2:
        raise ValueError("a corpus of fewer than 2 bytes has no validation split")
    target = min(n - 1, max(1, n - round(n * val_fraction)))
    after = data.find(b"\n", target - 1, target - 1 + SNAP_BYTES)
    if after != -1 and after + 1 < n:
        return after + 1
    before = data.rfind(b"\n", max(0, target - 1 - SNAP_BYTES), target - 1)
    if before != -1:
        return before + 1
    while target < n - 1 and data[target] & 0xC0 == 0x80:  # a continuation byte: not a character's start
        target += 1
    return target


def token_byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """UTF-8 bytes of text each vocabulary id stands for, (V,) int64: a byte-level BPE token's characters
    are one byte each; otherwise ``<0xNN>`` byte-fallback tokens are one byte, the metaspace ``▁`` a space,
    and other characters their UTF-8 length. Special tokens stand for no text."""
    byte_level = isinstance(tokenizer.decoder, decoders.ByteLevel)
    lengths = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for token, index in tokenizer.get_vocab(with_added_tokens=True).items():
        if index >= len(lengths):
            continue
        if byte_level:
            lengths[index] = len(token)
        elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            lengths[index] = 1
        else:
            lengths[index] = len(token.replace("\u2581", " ").encode("utf-8"))
    for index, added in tokenizer.get_added_tokens_decoder().items():
        if index < len(lengths):
            lengths[index] = 0 if added.special else len(added.content.encode("utf-8"))
    return lengths


def encode_split(text: str, tokenizer: Tokenizer, *, val_offset: int) -> SplitTokens:
    """Token ids of `text`, the text before byte `val_offset` and the text from it on encoded apart, so that
    token `val_start` is the validation text's first. The bytes per token are kept only when they add up to
    each part's UTF-8 length (a tokenizer whose normalizer rewrites the text gets none)."""
    data = text.encode("utf-8")
    head, tail = data[:val_offset].decode("utf-8"), data[val_offset:].decode("utf-8")
    train, val = encode_corpus(head, tokenizer), encode_corpus(tail, tokenizer)
    ids = np.concatenate([train, val]).astype(np.int32)
    lengths = token_byte_lengths(tokenizer)
    per_token = lengths[ids] if len(ids) else np.zeros(0, dtype=np.int64)
    exact = (int(per_token[: len(train)].sum()) == val_offset
             and int(per_token[len(train):].sum()) == len(data) - val_offset and per_token.max(initial=0) < 1 << 16)
    return SplitTokens(ids=ids, val_start=len(train), token_bytes=per_token.astype(np.uint16) if exact else None)


def split_sizes(n_tokens: int, val_fraction: float) -> tuple[int, int]:
    """(train, validation) token counts: the last `val_fraction` of the stream, at least one token, validates."""
    val = min(n_tokens, max(1, round(n_tokens * val_fraction))) if n_tokens else 0
    return n_tokens - val, val

