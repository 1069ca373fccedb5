"""The reference every exactness test compares with: a trial trained the way anyone would with plain PyTorch.

The family's own transformers model (``AutoModelForCausalLM``: ``GPT2LMHeadModel``, ``LlamaForCausalLM``, ...)
loaded from the engine's initial weights (the engine's streamed init is checked against
GPT-2's distribution in tests/engine/test_init.py), ``torch.optim``, ``clip_grad_norm_`` and a ``LambdaLR``
over the documented schedule definition; no engine code except the batch order. A step's loss is
transformers' own gradient-accumulation rule: each micro-batch's summed token loss over the tokens the whole
batch's loss covers (``num_items_in_batch``, counted as the Trainer counts it), and evaluations are the summed
token losses of their batches over their tokens. Dropout draws from the generators seeded before each
micro-batch's forward with ``micro_batch_seed(seed, step, micro_batch)`` (`worker.engine.rng`). A LoRA trial's
reference
is ``peft``'s ``PeftModel`` of the pretrained base with the engine's initial adapters; its weights are the
adapters as ``peft`` saves them (``get_peft_model_state_dict``). On CPU with one thread
every kernel adds in a fixed order, so the engine, sharded, spilled and run unit by unit in any process,
must give these numbers bit for bit (`assert_bit_identical`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from peft import PeftModel, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from worker.engine import TrialSession, TrialSpec, trial_create
from worker.engine.data import eval_batch, train_batch, trial_data
from worker.engine.lora import ADAPTER_DIR
from worker.engine.rng import micro_batch_seed

CPU = torch.device("cpu")


@dataclasses.dataclass
class Reference:
    losses: list[float]
    eval_losses: list[float]
    weights: dict[str, torch.Tensor]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread, as a worker of a one-core CPU device does, so that float sums add in its order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def initial_weights(spec: TrialSpec, root: Path) -> Path:
    """Export the engine's initial weights of `spec` (a one-shard trial under `root`) to ``root/init``."""
    trial_create(spec=spec, spill_dir=root, trial_id="init", device=CPU, cuts=[0])
    TrialSession.open(spill_dir=root, trial_id="init", device=CPU).export(root / "init")
    return root / "init"


def plain_training(init_dir: Path, spec: TrialSpec, device: torch.device = CPU, *,
                   steps_run: int | None = None) -> Reference:
    """Train `spec` from the weights in `init_dir` with plain PyTorch; its losses, evaluations and final weights.
    `steps_run`: stop after that many of its steps (a trial ended early), the schedule still the spec's."""
    assert spec.schedule.decay == "cosine", "the reference implements the cosine schedule only"
    if spec.lora is None:
        model = AutoModelForCausalLM.from_pretrained(init_dir, local_files_only=True).to(device).train()
    else:  # PEFT's own model: the pretrained base with the engine's initial adapters, only those trainable
        base = AutoModelForCausalLM.from_pretrained(spec.model.pretrained_dir, local_files_only=True)
        model = PeftModel.from_pretrained(base, init_dir / ADAPTER_DIR, is_trainable=True).to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = spec.optimizer
    optimizer: torch.optim.Optimizer
    if opt.kind == "adamw":
        optimizer = torch.optim.AdamW(params, lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay)
    else:
        optimizer = torch.optim.SGD(params, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
    warmup = spec.schedule.warmup_steps

    def cosine_with_warmup(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, spec.steps - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup)
    data = trial_data(spec.data, vocab_size=model.config.vocab_size)
    losses, eval_losses = [], []
    for step in range(spec.steps if steps_run is None else steps_run):
        batch = train_batch(data, seed=spec.seed, step=step, batch_size=spec.batch_size)
        # the Trainer's num_items_in_batch, clamped to 1 as TRL's SFT loss clamps it
        batch_tokens = max(1, int((batch.labels[..., 1:] != -100).sum()))
        total = 0.0
        for index in range(spec.micro_batches):
            micro_batch = batch.micro_batch(spec.micro_batches, index, device)
            torch.manual_seed(micro_batch_seed(spec.seed, step, index))
            # use_cache=False as any training loop: a key/value cache would also hide packed rows from the mask
            loss = model(micro_batch.ids, labels=micro_batch.labels, position_ids=micro_batch.position_ids,
                         use_cache=False, num_items_in_batch=batch_tokens).loss
            loss.backward()
            total += loss.item()
        losses.append(total)
        if opt.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, opt.clip_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if spec.eval_every and ((step + 1) % spec.eval_every == 0 or step == spec.steps - 1):
            model.eval()
            with torch.no_grad():
                batches = [eval_batch(data, batch=b, batch_size=spec.micro_batch_size).micro_batch(1, 0, device)
                           for b in range(spec.eval_batches)]
                summed = sum(model(b.ids, labels=b.labels, position_ids=b.position_ids, use_cache=False,
                                   num_items_in_batch=1).loss.item() for b in batches)
                eval_losses.append(summed / sum(int((b.labels[..., 1:] != -100).sum()) for b in batches))
            model.train()
    if spec.lora is not None:  # the adapters, under the keys PEFT saves them with
        return Reference(losses, eval_losses, {k: v.clone() for k, v in get_peft_model_state_dict(model).items()})
    return Reference(losses, eval_losses, {k: v.detach().clone() for k, v in model.named_parameters()})


def plain_reference(spec: TrialSpec, root: Path, *, steps_run: int | None = None) -> Reference:
    """`plain_training` of `spec` from the engine's initial weights, on one CPU thread (files under `root`)."""
    with one_thread():
        return plain_training(initial_weights(spec, root), spec, steps_run=steps_run)


def exported_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The parameters of an exported model directory, as plain PyTorch loads them."""
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    return {name: weight.detach() for name, weight in model.named_parameters()}


def assert_bit_identical(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Every tensor equal bit for bit: same names, dtypes, shapes and values (a difference names its largest gap)."""
    assert actual.keys() == expected.keys()
    differ = {name: (actual[name] - tensor).abs().max().item() for name, tensor in expected.items()
              if actual[name].dtype != tensor.dtype or not torch.equal(actual[name], tensor)}
    assert not differ, f"not bit-identical (largest difference per tensor): {differ}"
