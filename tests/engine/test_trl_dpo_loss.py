"""A DPO trial's first steps are TRL's: SmolLM2-135M-Instruct, the same preference pairs rendered with its chat
template, the same beta, full training with DPO's sigmoid loss in one batch, LoRA with IPO's in two micro-batches.

TRL (a development dependency of this test, 1.16) trains ``DPOTrainer`` on the conversational pairs and tokenizes
them itself; the test first checks that its prompt and answer tokens are the engine's. Before the first update the
policy is its reference, so the first step's loss is log 2 (sigmoid) or 1 / (4 beta^2) (IPO, here 1) on both sides; the
second step's loss and rewards follow from the first step's gradients, each answer's summed log-probability and
the reference's, so they compare the whole computation. The two differ only in arithmetic: TRL's fused LM head
and its batch of chosen-then-rejected rows padded to the longest, the engine's log-softmax of whole logits over
row pairs padded to ``seq_len``; they agree within 1e-5.

The pairs are the built-in sample conversations: the prompt is a conversation up to its last answer, the chosen
answer that last answer, the rejected one the last answer of the conversation four further on (the same kind of
question, another answer), so the second step already prefers the chosen answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.engine.conftest import CPU, run_all
from tests.plain_pytorch import initial_weights
from webapp.datasets.sample_chat import sample_chat_rows
from worker.engine import DataSpec, ModelSpec, OptimizerSpec, ScheduleSpec, TrialSession, TrialSpec, trial_create
from worker.engine.chat import PROMPT, Message, chat_tokenizer
from worker.engine.config import DpoSpec, LoraSpec
from worker.engine.examples import ExampleSet
from worker.engine.lora import ADAPTER_DIR
from worker.engine.pairs import encode_pairs, save_pairs

pytestmark = pytest.mark.slow

PAIRS = 4  # the batch, every training pair: each step sees them all, in whatever order
STEPS = 2
Pair = tuple[list[Message], list[Message], list[Message]]


def sample_pairs(count: int) -> list[Pair]:
    rows = [row["messages"] for row in sample_chat_rows()]
    return [(rows[k][:-1], rows[k][-1:], rows[k + 4][-1:]) for k in range(count)]


@pytest.fixture(scope="module")
def pairs_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PAIRS sample pairs to train on and one held out, as SmolLM2 token ids."""
    tokenizer = chat_tokenizer(AutoTokenizer.from_pretrained(smollm2_dir))
    encoded = encode_pairs(tokenizer, [(line, *pair) for line, pair in enumerate(sample_pairs(PAIRS + 1))])
    assert not encoded.failed
    directory = tmp_path_factory.mktemp("pairs")
    save_pairs(encoded.examples, directory)
    return directory


def dpo_spec(checkpoint: Path, pairs_dir: Path, *, micro_batches: int, lora: bool) -> TrialSpec:
    return TrialSpec(
        model=ModelSpec(pretrained_dir=str(checkpoint)),
        data=DataSpec(examples_dir=str(pairs_dir), train_examples=PAIRS, seq_len=256, pairs=True),
        optimizer=OptimizerSpec(kind="adamw", lr=1e-3 if lora else 1e-5, weight_decay=0.0, clip_norm=1.0),
        schedule=ScheduleSpec(warmup_steps=0, decay="linear"),
        batch_size=2 * PAIRS, micro_batches=micro_batches, steps=STEPS, eval_every=0, seed=0,
        lora=LoraSpec(r=8, alpha=16.0, dropout=0.0, target_modules=("q_proj", "v_proj")) if lora else None,
        dpo=DpoSpec(beta=0.5, loss_type="ipo") if lora else DpoSpec(beta=0.1, loss_type="sigmoid"),
    )


def engine_steps(spec: TrialSpec, root: Path) -> list[dict[str, float]]:
    trial_create(spec=spec, spill_dir=root, trial_id="t", device=CPU, cuts=[0, 16])
    results = run_all(TrialSession.open(spill_dir=root, trial_id="t", device=CPU))
    return [{"loss": r.loss, "rewards/chosen": r.rewards_chosen, "rewards/rejected": r.rewards_rejected}
            for r in results if r.loss is not None]


def trl_steps(spec: TrialSpec, pairs_dir: Path, root: Path) -> list[dict[str, float]]:
    """TRL's DPOTrainer on the same pairs: each step's loss (its training steps' returns, each its part of the
    step's loss, added up) and the rewards it logs; after checking that it tokenized the pairs as the engine."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    class Recording(DPOTrainer):
        losses: list[float] = []

        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            loss = super().training_step(*args, **kwargs)
            self.losses.append(loss.item())
            return loss

    assert spec.dpo is not None and spec.model.pretrained_dir is not None
    checkpoint = Path(spec.model.pretrained_dir)
    prompts, chosen, rejected = zip(*sample_pairs(PAIRS), strict=True)
    dataset = Dataset.from_dict({"prompt": list(prompts), "chosen": list(chosen), "rejected": list(rejected)})
    config = DPOConfig(output_dir=str(root), per_device_train_batch_size=PAIRS // spec.micro_batches,
                       gradient_accumulation_steps=spec.micro_batches, max_steps=STEPS,
                       learning_rate=spec.optimizer.lr, weight_decay=0.0, max_grad_norm=spec.optimizer.clip_norm,
                       lr_scheduler_type="linear", use_cpu=True, report_to="none", save_strategy="no",
                       logging_steps=1, seed=0, dataloader_num_workers=0, max_length=None,
                       beta=spec.dpo.beta, loss_type=[spec.dpo.loss_type],
                       bf16=False)  # TRL's default is bf16 autocast
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    if spec.lora is not None:  # the engine's initial adapters (peft's init, seeded per layer), trainable
        model = PeftModel.from_pretrained(model, initial_weights(spec, root / "init") / ADAPTER_DIR, is_trainable=True)
        assert isinstance(model.peft_config["default"], LoraConfig)
    trainer = Recording(model=model, args=config, train_dataset=dataset,
                        processing_class=AutoTokenizer.from_pretrained(checkpoint))
    trained_on = ExampleSet.load(Path(spec.data.examples_dir or ""))
    for k, row in enumerate(trainer.train_dataset):
        for side, answer in enumerate((row["chosen_ids"], row["rejected_ids"])):
            begin, end = int(trained_on.starts[2 * k + side]), int(trained_on.starts[2 * k + side + 1])
            ids, marks = np.asarray(trained_on.ids[begin:end]), np.asarray(trained_on.marks[begin:end])
            assert ids[marks == PROMPT].tolist() == row["prompt_ids"]
            assert ids[marks != PROMPT].tolist() == answer
    trainer.losses = []
    trainer.train()
    assert len(trainer.losses) == STEPS * spec.micro_batches
    logged = [entry for entry in trainer.state.log_history if "rewards/chosen" in entry]
    return [{"loss": sum(trainer.losses[s * spec.micro_batches:(s + 1) * spec.micro_batches]),
             "rewards/chosen": logged[s]["rewards/chosen"], "rewards/rejected": logged[s]["rewards/rejected"]}
            for s in range(STEPS)]


@pytest.mark.parametrize(("lora", "micro_batches"), [(False, 1), (True, 2)],
                         ids=["full-sigmoid", "lora-ipo-2-micro-batches"])
def test_the_first_steps_are_trls_dpo_steps(lora: bool, micro_batches: int, smollm2_dir: Path, pairs_dir: Path,
                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    spec = dpo_spec(smollm2_dir, pairs_dir, micro_batches=micro_batches, lora=lora)

    engine = engine_steps(spec, tmp_path / "engine")
    trl = trl_steps(spec, pairs_dir, tmp_path / "trl")

    assert engine[0]["loss"] == pytest.approx(1.0 if lora else np.log(2), abs=1e-5)  # IPO's 1 / (4 beta^2)
    assert abs(engine[1]["loss"] - engine[0]["loss"]) > 1e-3  # the first update moved the answers' log-probs
    for ours, theirs in zip(engine, trl, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-5)
