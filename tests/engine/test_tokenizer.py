"""The engine's byte-level BPE: text of ordinary words splits as GPT-2's does, a long run without white space is
cut into pieces before training (whose time grows far beyond linearly with a piece's length), and every text
encodes back to itself."""

from __future__ import annotations

from tokenizers import pre_tokenizers

from worker.engine.tokenizer import MAX_PIECE_CHARS, train_tokenizer

TEXT = "Hello  world, it's 2024!\n\tTabs and   spaces; ünïcode words: naïve café.\n"


def test_ordinary_text_splits_as_gpt2s_byte_level_split():
    tokenizer = train_tokenizer(TEXT * 20, vocab_size=300)
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert tokenizer.pre_tokenizer.pre_tokenize_str(TEXT) == gpt2.pre_tokenize_str(TEXT)


def test_a_long_run_without_white_space_is_cut_into_pieces_and_encodes_back_to_itself():
    run = "x" * 1_000 + "yz" * 300
    text = f"a {run} b\n"
    tokenizer = train_tokenizer(text * 3 + "a" * 400_000, vocab_size=400)
    pieces = [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    assert max(len(piece) for piece in pieces) == MAX_PIECE_CHARS
    assert "".join(pieces).replace("Ġ", " ").replace("Ċ", "\n") == text
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
