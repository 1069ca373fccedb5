"""The LM head's loss in chunks (worker.engine.chunked_loss) gives plain PyTorch's numbers, bit for bit on CPU.

First the loss alone against ``F.cross_entropy`` on whole logits: the loss, the hidden states' gradient and the
weight's, for chunk sizes that divide the tokens and sizes that do not, ignored targets, bf16 autocast, one and
two threads. Then whole trials whose head runs in chunks: GPT-2 and Llama, tied and untied, AdamW with clipping,
and LoRA, trained by the engine exactly as plain PyTorch (and PEFT) train them. Then the planner: it chunks the
head only when the budget cannot hold a micro-batch's logits, and then trains the same numbers.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.engine.conftest import CPU, SEQ, run_all, tiny_spec
from tests.engine.test_lora import adapter_weights, lora_spec, save_base
from tests.plain_pytorch import assert_bit_identical, exported_weights, initial_weights, plain_training
from worker.engine import BudgetError, ModelSpec, OptimizerSpec, TrialSession, TrialSpec, trial_create
from worker.engine.chunked_loss import IGNORE, chunked_cross_entropy, spans
from worker.engine.config import LoraSpec

ADAMW = OptimizerSpec(kind="adamw", lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, clip_norm=0.5)
WIDE_VOCAB = 2048  # with 64-token micro-batches and 16-token chunks: 4 token chunks, 4 vocabulary chunks


def whole_and_chunked(tokens: int, width: int, vocab: int, chunk: int, *, bf16: bool = False, seed: int = 0,
                      device: torch.device = CPU) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(loss, grad of hidden, grad of weight) from whole logits and from chunks, on the same inputs."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, width, generator=generator).to(device)
    weight = (torch.randn(vocab, width, generator=generator) * 0.2).to(device)
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    targets[::7] = IGNORE
    targets = targets.to(device)
    out = []
    for chunked in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if chunked:
                loss = chunked_cross_entropy(h, w, targets, token_chunk=chunk)
            else:
                loss = F.cross_entropy(F.linear(h, w).float(), targets, ignore_index=IGNORE)
        loss.backward()
        out.append([loss.detach(), h.grad, w.grad])
    return out[0], out[1]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("tokens", "width", "vocab", "chunk"), [
    (64, 32, 2048, 16), (300, 64, 5000, 37), (97, 48, 1001, 50), (256, 576, 49152, 64), (130, 32, 3000, 129),
])
def test_the_chunked_loss_and_gradients_are_whole_logits_bit_for_bit(
    threads: int, tokens: int, width: int, vocab: int, chunk: int
) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole, chunked = whole_and_chunked(tokens, width, vocab, chunk)
    finally:
        torch.set_num_threads(before)
    for name, a, b in zip(("loss", "grad hidden", "grad weight"), whole, chunked, strict=True):
        assert torch.equal(a, b), f"{name} differs by {(a - b).abs().max().item()}"


def test_the_chunked_loss_under_bf16_autocast_is_autocasts_whole_logits() -> None:
    whole, chunked = whole_and_chunked(128, 64, 4000, 40, bf16=True)
    for a, b in zip(whole, chunked, strict=True):
        assert torch.equal(a, b)


def test_a_frozen_weight_gets_no_gradient_and_the_rest_is_unchanged() -> None:
    hidden = torch.randn(40, 16, requires_grad=True)
    weight = torch.randn(500, 16)
    targets = torch.randint(0, 500, (40,))
    loss = chunked_cross_entropy(hidden, weight, targets, token_chunk=16)
    loss.backward()
    expected = hidden.detach().clone().requires_grad_()
    F.cross_entropy(F.linear(expected, weight), targets).backward()
    assert weight.grad is None and torch.equal(hidden.grad, expected.grad)


def test_spans_are_balanced_and_never_a_matrix_vector_product() -> None:
    assert spans(100, 30) == [(0, 25), (25, 50), (50, 75), (75, 100)]
    assert spans(40, 1) == [(0, 20), (20, 40)]  # 16 rows at least: 40 makes two of 20
    assert spans(10, 4) == [(0, 10)]  # fewer than two spans' worth: one
    for total, chunk in ((1000, 17), (33, 16), (4096, 1000)):
        cut = spans(total, chunk)
        assert cut[0][0] == 0 and cut[-1][1] == total
        assert all(a[1] == b[0] for a, b in itertools.pairwise(cut))
        sizes = [stop - start for start, stop in cut]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 16 and max(sizes) <= max(chunk, 16) + 1


# -- whole trials ------------------------------------------------------------------------------------------------


def wide_spec(tokens_path: Path, family: str, *, tied: bool, **overrides: object) -> TrialSpec:
    """A 2-block model of ``family`` with a 2,048-token vocabulary on the tiny trial's random tokens."""
    model = ModelSpec(family=family, n_layer=2, n_embd=32, n_head=4, n_kv_head=None if family == "gpt2" else 2,
                      n_inner=None if family == "gpt2" else 48, vocab_size=WIDE_VOCAB, n_positions=SEQ,
                      dropout=0.1, tie_word_embeddings=tied)
    return tiny_spec(tokens_path, **{"model": model, "optimizer": ADAMW, "steps": 4, "eval_every": 2,
                                     "eval_batches": 1, **overrides})


def trained_in_chunks(spec: TrialSpec, spill_dir: Path, out: Path, *, cuts: list[int]
                      ) -> tuple[list[float], list[float]]:
    """Train ``spec`` in shards starting at ``cuts`` with its head's loss in 16-token chunks and export it to
    ``out``; its training losses and evaluation losses."""
    plan = trial_create(spec=spec, spill_dir=spill_dir, trial_id="t", device=CPU, cuts=cuts, head_token_chunk=16)
    assert plan.head_token_chunk == 16
    session = TrialSession.open(spill_dir=spill_dir, trial_id="t", device=CPU)
    assert session.stack.layers[-1].token_chunk == 16
    results = run_all(session)
    session.export(out)
    return ([r.loss for r in results if r.loss is not None],
            [r.eval_loss for r in results if r.eval_loss is not None])


@pytest.fixture(scope="module")
def wide_tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wide") / "tokens.npy"
    np.save(path, np.random.default_rng(1).integers(0, WIDE_VOCAB, SEQ * 64).astype(np.int32))
    return path


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_trial_with_a_chunked_head_trains_like_plain_pytorch(
    family: str, tied: bool, wide_tokens: Path, tmp_path: Path, shm_dir: Path
) -> None:
    spec = wide_spec(wide_tokens, family, tied=tied)
    reference = plain_training(initial_weights(spec, tmp_path / "reference"), spec)
    assert trained_in_chunks(spec, shm_dir, tmp_path / "final", cuts=[0, 2, 3]) == (reference.losses,
                                                                                  reference.eval_losses)
    assert_bit_identical(exported_weights(tmp_path / "final"), reference.weights)


def test_the_planner_chunks_the_head_only_when_its_logits_do_not_fit(wide_tokens: Path, tmp_path: Path) -> None:
    spec = wide_spec(wide_tokens, "llama", tied=False, micro_batches=1)  # 128 tokens a micro-batch
    roomy = trial_create(spec=spec, spill_dir=tmp_path, trial_id="roomy", device=CPU)
    assert roomy.head_token_chunk is None
    head = roomy.layers[-1]
    logits = 128 * WIDE_VOCAB * 4
    # The saved log-softmax, and the gradients of it and of the logits that backward holds beside it.
    assert head.activation_bytes >= 3 * logits
    # A budget a little under what the whole head needs with the prefetch reserve: only chunks fit it.
    budget = head.device_bytes + head.activation_bytes + roomy.reserve_bytes - logits
    spec = dataclasses.replace(spec, budget_bytes=budget)
    tight = trial_create(spec=spec, spill_dir=tmp_path, trial_id="tight", device=CPU)
    assert tight.head_token_chunk is not None and tight.head_token_chunk < 128
    assert tight.layers[-1].activation_bytes < head.activation_bytes - logits
    assert tight.peak_bytes <= budget
    # Room for every other layer, but not for the head's weights with even a 16-token chunk of logits.
    smallest_reserve = max(layer.device_bytes for layer in roomy.layers)
    others = max(layer.device_bytes + layer.activation_bytes for layer in roomy.layers[:-1]) + smallest_reserve
    assert others < head.device_bytes + 16 * WIDE_VOCAB * 12 + smallest_reserve
    with pytest.raises(BudgetError) as refused:
        trial_create(spec=dataclasses.replace(spec, budget_bytes=others), spill_dir=tmp_path, trial_id="refused",
                     device=CPU)
    assert refused.value.layer == "head"

    reference = plain_training(initial_weights(spec, tmp_path / "reference"), spec)
    session = TrialSession.open(spill_dir=tmp_path, trial_id="tight", device=CPU)
    results = run_all(session)
    session.export(tmp_path / "final")
    assert [r.loss for r in results if r.loss is not None] == reference.losses
    assert_bit_identical(exported_weights(tmp_path / "final"), reference.weights)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_lora_trial_with_a_chunked_frozen_head_trains_like_peft(family: str, tokens_path: Path, tmp_path: Path
                                                                   ) -> None:
    base = save_base(tmp_path / "base", family)
    spec = lora_spec(tokens_path, base, family)
    reference = plain_training(initial_weights(spec, tmp_path / "reference"), spec)
    assert trained_in_chunks(spec, tmp_path / "spill", tmp_path / "final", cuts=[0, 2]) == (reference.losses,
                                                                                          reference.eval_losses)
    assert_bit_identical(adapter_weights(tmp_path / "final"), reference.weights)


def test_an_adapted_lm_head_keeps_its_logits_whole(tokens_path: Path, tmp_path: Path) -> None:
    base = save_base(tmp_path / "base", "llama")
    spec = lora_spec(tokens_path, base, "llama", lora=LoraSpec(r=4, alpha=8.0, target_modules=("q_proj", "lm_head")))
    plan = trial_create(spec=spec, spill_dir=tmp_path / "spill", trial_id="t", device=CPU, head_token_chunk=16)
    assert plan.head_token_chunk is None
    session = TrialSession.open(spill_dir=tmp_path / "spill", trial_id="t", device=CPU)
    assert not session.stack.layers[-1].chunkable
