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

`plain_dpo_training` is the same loop with DPO's loss on preference pairs, written out here: each answer's summed
log-probability of its answer tokens (``log_softmax`` of the model's float logits, picked at the targets, summed
per sequence with ``index_add``), under the model and under the reference: for LoRA, ``peft``'s own
``disable_adapter()`` in eval mode; for full training, a frozen copy of the starting model in eval mode, whose
log-probabilities are computed first over every pair, one a row pair, in the engine's reference order (as TRL's
``precompute_ref_log_probs`` does). Each micro-batch's loss is its summed pair losses over the batch's pairs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from peft import PeftModel, get_peft_model_state_dict
from torch.nn import functional as F
from transformers import AutoModelForCausalLM

from worker.engine import TrialSession, TrialSpec, trial_create
from worker.engine.data import eval_batch, train_batch, trial_data
from worker.engine.lora import ADAPTER_DIR
from worker.engine.pairs import PairBatch
from worker.engine.rng import micro_batch_seed

CPU = torch.device("cpu")


@dataclasses.dataclass
class Reference:
    losses: list[float]
    eval_losses: list[float]
    weights: dict[str, torch.Tensor]
    rewards: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)  # DPO: per step
    eval_rewards: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)  # and per evaluation


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


def plain_model(init_dir: Path, spec: TrialSpec, device: torch.device) -> torch.nn.Module:
    """The model to train, in train mode: the family's transformers model, or PEFT's of a LoRA trial (the
    pretrained base with the engine's initial adapters, only those trainable)."""
    if spec.lora is None:
        return AutoModelForCausalLM.from_pretrained(init_dir, local_files_only=True).to(device).train()
    base = AutoModelForCausalLM.from_pretrained(spec.model.pretrained_dir, local_files_only=True)
    return PeftModel.from_pretrained(base, init_dir / ADAPTER_DIR, is_trainable=True).to(device).train()


def plain_optimizer(spec: TrialSpec, params: list[torch.nn.Parameter]
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """``torch.optim``'s AdamW or SGD, and a ``LambdaLR`` of warm-up then cosine decay."""
    assert spec.schedule.decay == "cosine", "the reference implements the cosine schedule only"
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

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup)


def trained_weights(model: torch.nn.Module, spec: TrialSpec) -> dict[str, torch.Tensor]:
    """The trained weights: every parameter, or a LoRA trial's adapters under the keys PEFT saves them with."""
    if spec.lora is not None:
        return {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def plain_training(init_dir: Path, spec: TrialSpec, device: torch.device = CPU, *,
                   steps_run: int | None = None) -> Reference:
    """Train `spec` from the weights in `init_dir` with plain PyTorch; its losses, evaluations and final weights.
    `steps_run`: stop after that many of its steps (a trial ended early), the schedule still the spec's."""
    model = plain_model(init_dir, spec, device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = spec.optimizer
    optimizer, scheduler = plain_optimizer(spec, params)
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
    return Reference(losses, eval_losses, trained_weights(model, spec))


def answer_log_probs(model: torch.nn.Module, batch: PairBatch) -> torch.Tensor:
    """(2 * pairs,): each sequence's summed log-probability of its answer tokens under `model`."""
    logits = model(batch.ids, position_ids=batch.position_ids, use_cache=False).logits  # (B, T, V)
    log_probs = logits.float().reshape(-1, logits.shape[-1]).log_softmax(-1)  # (N, V)
    targets = F.pad(batch.labels, (0, 1), value=-100)[:, 1:].reshape(-1)  # what each position predicts
    owners = F.pad(batch.sequences, (0, 1), value=-1)[:, 1:].reshape(-1)  # and whose answer that token is
    owners = torch.where(targets == -100, -1, owners)
    picked = log_probs.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)
    keep = owners >= 0
    return torch.zeros(2 * batch.count).index_add(0, owners[keep], picked[keep])


def dpo_pair_losses(policy: torch.Tensor, reference: torch.Tensor, batch: PairBatch,
                    spec: TrialSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each pair's loss (DPO's sigmoid or IPO's, TRL's definitions), and the chosen and rejected rewards."""
    assert spec.dpo is not None
    beta = spec.dpo.beta
    chosen, rejected = policy[0::2] - reference[0::2], policy[1::2] - reference[1::2]
    if spec.dpo.loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * (chosen - rejected))
    else:  # IPO: each log-ratio per answer token
        predicted = batch.labels[:, 1:] != -100
        tokens = torch.bincount(batch.sequences[:, 1:][predicted], minlength=2 * batch.count).float()
        losses = (chosen / tokens[0::2] - rejected / tokens[1::2] - 1 / (2 * beta)) ** 2
    return losses, beta * chosen.detach(), beta * rejected.detach()


def plain_dpo_training(init_dir: Path, spec: TrialSpec, device: torch.device = CPU) -> Reference:
    """Train the DPO trial `spec` from the weights in `init_dir` with plain PyTorch (see the module docstring);
    its losses, evaluations (mean pair loss), rewards (chosen, rejected, accuracy) and final weights."""
    model = plain_model(init_dir, spec, device)
    data = trial_data(spec.data, vocab_size=model.config.vocab_size)
    size = spec.micro_batch_size
    stored: dict[int, torch.Tensor] = {}
    if spec.lora is None:  # a frozen copy of the starting model, its log-probabilities computed first
        frozen = AutoModelForCausalLM.from_pretrained(init_dir, local_files_only=True).to(device).eval()
        with torch.no_grad():
            for b in range(data.reference_batches(size)):
                batch = data.reference_batch(batch=b, batch_size=size)
                for key, values in zip(batch.keys.tolist(), answer_log_probs(frozen, batch).view(-1, 2), strict=True):
                    stored[key] = values
        del frozen

    def reference(batch: PairBatch) -> torch.Tensor:
        if spec.lora is None:
            return torch.cat([stored[key] for key in batch.keys.tolist()])
        training = model.training
        with torch.no_grad(), model.disable_adapter():
            model.eval()
            values = answer_log_probs(model, batch)
        model.train(training)
        return values

    optimizer, scheduler = plain_optimizer(spec, [p for p in model.parameters() if p.requires_grad])
    out = Reference([], [], {})
    for step in range(spec.steps):
        batch = train_batch(data, seed=spec.seed, step=step, batch_size=spec.batch_size)
        total, rewards = 0.0, [0.0, 0.0, 0.0]
        for index in range(spec.micro_batches):
            micro_batch = batch.micro_batch(spec.micro_batches, index, device)
            ref = reference(micro_batch)  # dropout off: it draws no random numbers
            torch.manual_seed(micro_batch_seed(spec.seed, step, index))
            losses, chosen, rejected = dpo_pair_losses(answer_log_probs(model, micro_batch), ref, micro_batch, spec)
            loss = losses.sum() / batch.pairs
            loss.backward()
            total += loss.item()
            for i, part in enumerate((chosen.sum(), rejected.sum(), (chosen > rejected).sum())):
                rewards[i] += part.item() / batch.pairs
        out.losses.append(total)
        out.rewards.append((rewards[0], rewards[1], rewards[2]))
        if spec.optimizer.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                           spec.optimizer.clip_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if spec.eval_every and ((step + 1) % spec.eval_every == 0 or step == spec.steps - 1):
            model.eval()
            pairs, summed, sums = 0, 0.0, [0.0, 0.0, 0]
            with torch.no_grad():
                for b in range(spec.eval_batches):
                    micro_batch = eval_batch(data, batch=b, batch_size=size).micro_batch(1, 0, device)
                    losses, chosen, rejected = dpo_pair_losses(answer_log_probs(model, micro_batch),
                                                               reference(micro_batch), micro_batch, spec)
                    pairs += micro_batch.count
                    summed += losses.sum().item()
                    sums[0] += chosen.sum().item()
                    sums[1] += rejected.sum().item()
                    sums[2] += int((chosen > rejected).sum())
            out.eval_losses.append(summed / pairs)
            out.eval_rewards.append((sums[0] / pairs, sums[1] / pairs, sums[2] / pairs))
            model.train()
    out.weights = trained_weights(model, spec)
    return out


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
