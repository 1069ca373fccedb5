"""Bits per byte on a held-out text that is the same for every tokenizer, computed by hand and by the engine.

The corpus is split on its text (`validation_offset`), each tokenizer encodes the two parts apart, and the
engine's final evaluation covers every held-out token: full blocks of ``seq_len`` and one shorter last block.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from tests.engine.conftest import CPU
from tests.plain_pytorch import initial_weights, one_thread, plain_training
from webapp.datasets.tokenization import encode_split, validation_offset
from worker.engine import DataSpec, ModelSpec, TrialSession, TrialSpec
from worker.engine.tokenizer import train_tokenizer
from worker.engine.train import train_trial

CORPUS = "".join(
    f"Line {i}: the hydra trains {i % 7} heads at once, and each head learns its own shard of text.\n"
    for i in range(120)
)


def _held_out_data(root: Path, vocab_size: int) -> tuple[DataSpec, Tokenizer, int]:
    """(data spec, tokenizer, held-out byte offset) of CORPUS tokenized by a BPE of `vocab_size`."""
    data = CORPUS.encode()
    offset = validation_offset(data, 0.1)
    tokenizer = train_tokenizer(CORPUS, vocab_size=vocab_size)
    split = encode_split(CORPUS, tokenizer, val_offset=offset)
    assert split.token_bytes is not None
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "tokens.npy", split.ids)
    np.save(root / "token_bytes.npy", split.token_bytes)
    spec = DataSpec(tokens_path=str(root / "tokens.npy"), seq_len=16, val_start=split.val_start,
                    token_bytes_path=str(root / "token_bytes.npy"), holdout_tokens=len(split.ids) - split.val_start)
    return spec, tokenizer, offset


def test_the_held_out_text_is_the_same_for_two_tokenizers(tmp_path: Path) -> None:
    texts, counts = [], []
    for vocab_size in (300, 600):
        data, tokenizer, offset = _held_out_data(tmp_path / str(vocab_size), vocab_size)
        ids = np.load(data.tokens_path)
        per_token = np.load(data.token_bytes_path)
        assert data.val_start is not None
        texts.append(tokenizer.decode(ids[data.val_start:].tolist()))
        counts.append((len(ids), int(per_token[data.val_start:].sum()), int(per_token[: data.val_start].sum())))
        assert CORPUS.encode()[offset - 1: offset] == b"\n"  # the split falls on a line start
    assert texts[0] == texts[1] == CORPUS.encode()[offset:].decode()
    assert counts[0][0] != counts[1][0]  # two different token streams...
    assert counts[0][1:] == counts[1][1:] == (len(CORPUS.encode()) - offset, offset)  # ...over the same bytes


def test_the_engine_reports_the_bits_per_byte_computed_by_hand(tmp_path: Path) -> None:
    data, tokenizer, offset = _held_out_data(tmp_path / "data", 300)
    spec = TrialSpec(model=ModelSpec(n_layer=2, vocab_size=tokenizer.get_vocab_size(), n_positions=16),
                     data=data, batch_size=4, micro_batches=2, steps=4, eval_every=2, eval_batches=2,
                     optimizer=dataclasses.replace(TrialSpec(data=data).optimizer, lr=3e-3))
    ids = np.load(data.tokens_path)
    assert data.holdout_tokens is not None and data.holdout_tokens % 16 >= 2  # a shorter last block is evaluated
    with one_thread():
        results = train_trial(spec=spec, spill_dir=tmp_path / "spill", trial_id="t", device=CPU, cuts=[0, 2])
        reference = plain_training(initial_weights(spec, tmp_path / "reference"), spec)
    evals = [r for r in results if r.eval_loss is not None]
    assert [r.final_step for r in evals] == [None, 4]
    # The regular evaluation's mean loss is plain PyTorch's, bit for bit (the reference's last is on other batches).
    assert evals[0].eval_loss == reference.eval_losses[0]
    final = evals[-1]

    # By hand: the trained model (the engine's export) on every held-out block, the loss summed over the
    # predicted tokens, and their bytes from decoding each token.
    session_dir = tmp_path / "export"
    TrialSession.open(spill_dir=tmp_path / "spill", trial_id="t", device=CPU).export(session_dir)
    model = AutoModelForCausalLM.from_pretrained(session_dir, local_files_only=True).eval()
    start, end = data.val_start, data.val_start + data.holdout_tokens
    blocks = [ids[s: min(s + 16, end)] for s in range(start, end, 16)]
    loss_sum, n_bytes, first_bytes, n_tokens = 0.0, 0, 0, 0
    with torch.no_grad():
        for block in blocks:
            block_ids = torch.from_numpy(block.astype(np.int64))[None]
            logits = model(block_ids).logits[0, :-1]
            loss_sum += torch.nn.functional.cross_entropy(logits, block_ids[0, 1:], reduction="sum").item()
            n_bytes += sum(len(tokenizer.decode([int(t)]).encode()) for t in block[1:])
            first_bytes += len(tokenizer.decode([int(block[0])]).encode())
            n_tokens += len(block) - 1
    assert final.eval_tokens == n_tokens
    assert final.eval_bytes == n_bytes
    assert math.isclose(final.eval_bpb, loss_sum / math.log(2) / n_bytes, rel_tol=1e-5)
    assert math.isclose(final.eval_loss, loss_sum / n_tokens, rel_tol=1e-5)
    # What the final evaluation covers: the whole held-out text but the first token of each block.
    assert final.eval_bytes == len(CORPUS.encode()) - offset - first_bytes
