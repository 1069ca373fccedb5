"""The byte-level BPE tokenizer the engine trains, and the files a saved tokenizer consists of.

Torch-free (the ``tokenizers`` package only), so that the web app trains its datasets' tokenizers and reads a
trial's exported tokenizer with the engine's own code without loading torch.

`train_tokenizer` trains the GPT-2-style byte-level BPE a corpus gets when no pretrained tokenizer is chosen:
the engine's own corpora (`worker.engine.data.tokenize_corpus`) and the web app's datasets, whose instruction
data adds a chat template's markers as special tokens. Every byte is in its alphabet, so any later text
encodes. Id 0 is `END_OF_TEXT`, which ends (and starts) a document, as in GPT-2. A run of more than
`MAX_PIECE_CHARS` characters without white space (a base64 blob, a row of one letter) is cut into pieces of
that length before GPT-2's split: training BPE on one piece of n characters takes time far beyond linear in n
(benchmarks/RESULTS.md), while text with words of ordinary length splits as GPT-2's does.

`TOKENIZER_FILES` are the files of a ``save_pretrained`` tokenizer directory of the families the engine trains,
all of which ``AutoTokenizer.from_pretrained`` reads back: ``tokenizer_config.json`` (the tokenizer's class,
special tokens and context length) and ``tokenizer.json`` (the fast tokenizer the engine encodes with); the
legacy ``special_tokens_map.json`` and ``added_tokens.json``, still read when present; the slow tokenizer's
vocabulary, ``vocab.json`` and ``merges.txt`` (GPT-2 and Qwen's BPE) or ``tokenizer.model`` (Llama and
Mistral's sentencepiece); and ``chat_template.jinja``, where transformers saves a chat template. A copy of
these files loads as the directory does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

END_OF_TEXT = "<|endoftext|>"
MAX_PIECE_CHARS = 256
MIN_VOCAB_SIZE = 300  # 256 byte symbols + the end-of-text token + a few merges
MAX_VOCAB_SIZE = 65_536
CHUNK_LINES = 2_000

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SENTENCEPIECE_MODEL = "tokenizer.model"
TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, "special_tokens_map.json", "added_tokens.json", "vocab.json",
                   "merges.txt", SENTENCEPIECE_MODEL, "chat_template.jinja")


def train_tokenizer(corpus: str | Path, vocab_size: int, *, special_tokens: Sequence[str] = ()) -> Tokenizer:
    """A byte-level BPE tokenizer trained on `corpus` (the text itself, or a UTF-8 text file) with at most
    `vocab_size` tokens: ids 0, 1, ... are `END_OF_TEXT` and then `special_tokens` (each kept one token).

    A small corpus may end with fewer merges, and so a smaller vocabulary, than asked for. Raises ValueError
    for a `vocab_size` outside `MIN_VOCAB_SIZE`..`MAX_VOCAB_SIZE`.
    """
    if not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size {vocab_size} must be between {MIN_VOCAB_SIZE} and {MAX_VOCAB_SIZE}")
    text = corpus.read_text(encoding="utf-8") if isinstance(corpus, Path) else corpus
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(rf"\S{{{MAX_PIECE_CHARS}}}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[END_OF_TEXT, *special_tokens], show_progress=False)
    tokenizer.train_from_iterator(text_chunks(text), trainer=trainer)
    return tokenizer


def text_chunks(text: str) -> list[str]:
    """`text` cut into pieces of `CHUNK_LINES` lines, each line keeping its end, so that the pieces put together
    are the text exactly: a large corpus trains and encodes a piece per thread."""
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i : i + CHUNK_LINES]) for i in range(0, len(lines), CHUNK_LINES)]
