"""The first step's loss of a chat fine-tune is TRL's: SmolLM2-135M-Instruct, the same conversations rendered with
its chat template, the same answer tokens trained, the same batch of 4, at 1 and at 2 micro-batches.

TRL (a development dependency of this test, 1.16) trains ``SFTTrainer`` on the engine's own token ids with
``assistant_masks`` marking the answers, so the two differ only in their arithmetic: TRL's loss is the summed
log-probabilities of the trained tokens from its fused LM head over the trained tokens of the whole accumulated
batch, the engine's transformers' cross-entropy with ``num_items_in_batch``.

How close fp32 arithmetic can bring them: the four conversations train 60 answer tokens, and transformers' own
fp32 forward of the model gives a mean loss about 1.4e-5 from its float64 forward, on the order of 1e-5 either way
depending on the CPU's kernels. So the engine's loss is held to transformers' fp32 forward of the same tokens
within 5e-6 (they run the same arithmetic: the difference seen is 2e-7), and to TRL's within 5e-5, where TRL's
fused head rounds differently (its loss lands within 1e-6 of the float64 value). A wrong token count or
normalization moves the loss by more than 1e-3.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.engine.conftest import CPU, run_all
from webapp.datasets.sample_chat import sample_chat_rows
from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSession, TrialSpec, trial_create
from worker.engine.chat import PROMPT, chat_tokenizer
from worker.engine.examples import ExampleSet, encode_examples

pytestmark = pytest.mark.slow

BATCH = 4


@pytest.fixture(scope="module")
def conversations(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five sample conversations (four to train on, one held out) as SmolLM2 token ids and answer marks; their
    answers differ in length, so micro-batches of two cover different numbers of trained tokens."""
    tokenizer = chat_tokenizer(AutoTokenizer.from_pretrained(smollm2_dir))
    rows = [(line, None, row["messages"]) for line, row in enumerate(sample_chat_rows()[:BATCH + 1], start=1)]
    encoded = encode_examples(tokenizer, rows)
    assert not encoded.failed
    directory = tmp_path_factory.mktemp("conversations")
    encoded.examples.save(directory)
    return directory


def engine_first_loss(checkpoint: Path, examples: Path, micro_batches: int, root: Path) -> float:
    spec = TrialSpec(
        model=ModelSpec(pretrained_dir=str(checkpoint)),
        data=DataSpec(examples_dir=str(examples), train_examples=BATCH, seq_len=256, loss_on="assistant"),
        optimizer=OptimizerSpec(kind="adamw", lr=1e-5),
        schedule=ScheduleSpec(warmup_steps=0, decay="cosine"),
        batch_size=BATCH, micro_batches=micro_batches, steps=1, eval_every=0, seed=0,
    )
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=[0, 16])
    results = run_all(TrialSession.open(spill_dir=root, trial_id="t", device=CPU))
    return next(r.loss for r in results if r.loss is not None)


def trl_first_loss(checkpoint: Path, examples: Path, micro_batches: int, root: Path) -> float:
    """TRL's SFTTrainer, one optimizer step over the four training conversations; the losses its training steps
    return (each its part of the step's loss, as the Trainer accumulates them) added up."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    class Recording(SFTTrainer):
        losses: list[float] = []

        def training_step(self, *args: object, **kwargs: object) -> torch.Tensor:
            loss = super().training_step(*args, **kwargs)
            self.losses.append(loss.item())
            return loss

    data = ExampleSet.load(examples)
    spans = list(zip(data.starts[:BATCH], data.starts[1:BATCH + 1], strict=True))
    dataset = Dataset.from_dict({
        "input_ids": [np.asarray(data.ids[b:e]).tolist() for b, e in spans],
        "assistant_masks": [(np.asarray(data.marks[b:e]) != PROMPT).astype(int).tolist() for b, e in spans],
    })
    config = SFTConfig(output_dir=str(root), per_device_train_batch_size=BATCH // micro_batches,
                       gradient_accumulation_steps=micro_batches, max_steps=1, learning_rate=1e-5,
                       use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, seed=0,
                       dataloader_num_workers=0, max_length=None, bf16=False)  # TRL's default is bf16 autocast
    trainer = Recording(model=AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32),
                        args=config, train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(checkpoint))
    trainer.losses = []
    trainer.train()
    assert len(trainer.losses) == micro_batches
    return sum(trainer.losses)


@pytest.fixture(scope="module")
def transformers_loss(smollm2_dir: Path, conversations: Path) -> float:
    """The mean loss of the first four conversations' answer tokens under transformers' fp32 forward of the model,
    each conversation alone, every trained token counted once over the whole batch (the same at any number of
    micro-batches)."""
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    data = ExampleSet.load(conversations)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for begin, end in zip(data.starts[:BATCH], data.starts[1:BATCH + 1], strict=True):
            ids = torch.as_tensor(np.asarray(data.ids[begin:end]), dtype=torch.long)
            trained = torch.as_tensor(np.asarray(data.marks[begin + 1:end]) != PROMPT)
            log_probs = torch.log_softmax(model(ids[None]).logits[0, :-1], dim=-1)
            total -= log_probs.gather(-1, ids[1:, None])[:, 0][trained].sum().item()
            tokens += int(trained.sum())
    return total / tokens


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_the_first_step_loss_is_trls_sft_loss(micro_batches: int, smollm2_dir: Path, conversations: Path,
                                              transformers_loss: float, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    engine = engine_first_loss(smollm2_dir, conversations, micro_batches, tmp_path / "engine")
    trl = trl_first_loss(smollm2_dir, conversations, micro_batches, tmp_path / "trl")
    assert engine == pytest.approx(transformers_loss, abs=5e-6)
    assert engine == pytest.approx(trl, abs=5e-5)
