"""Sharded, spilled training gives plain PyTorch's per-step losses and final weights, bit for bit.

On CPU with one thread every kernel adds in a fixed order, so the engine's shards, spills and streamed
optimizer steps must not change a single bit: losses compare with ``==`` and weights with ``torch.equal``.

The reference is genuinely plain: ``GPT2LMHeadModel`` loaded from the engine's initial weights (the
engine's streamed init is checked against GPT-2's distribution in test_init.py), ``torch.optim``,
``clip_grad_norm_`` and a ``LambdaLR`` over the documented schedule definition.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from transformers import GPT2LMHeadModel

from tests.engine.conftest import CPU, run_all, tiny_spec
from worker.engine import OptimizerSpec, TrialSession, TrialSpec, trial_create
from worker.engine.data import TokenBlocks
from worker.engine.schedule import lr_factor

PLANS = {"1-shard": [0], "2-shards": [0, 3], "3-shards": [0, 2, 4], "per-layer": [0, 1, 2, 3, 4, 5]}
OPTIMIZERS = {
    "adamw": OptimizerSpec(kind="adamw", lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, clip_norm=0.5),
    "sgd": OptimizerSpec(kind="sgd", lr=0.05, momentum=0.9, weight_decay=0.01, clip_norm=0.5),
}


@dataclasses.dataclass
class Reference:
    losses: list[float]
    eval_losses: list[float]
    weights: dict[str, torch.Tensor]


def plain_training(init_dir: Path, spec: TrialSpec, device: torch.device = CPU) -> Reference:
    """Train the way anyone would with plain PyTorch (no engine code except the batch order)."""
    model = GPT2LMHeadModel.from_pretrained(init_dir, local_files_only=True).to(device).train()
    params = list(model.parameters())
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
    data = TokenBlocks(spec.data, vocab_size=model.config.vocab_size)
    torch.manual_seed(spec.seed)
    losses, eval_losses = [], []
    for step in range(spec.steps):
        batch = data.train_batch(seed=spec.seed, step=step, batch_size=spec.batch_size).to(device)
        total = 0.0
        for micro_batch in batch.chunk(spec.micro_batches):
            loss = model(micro_batch, labels=micro_batch).loss
            (loss / spec.micro_batches).backward()
            total += loss.item()
        losses.append(total / spec.micro_batches)
        torch.nn.utils.clip_grad_norm_(params, opt.clip_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if (step + 1) % spec.eval_every == 0 or step == spec.steps - 1:
            model.eval()
            with torch.no_grad():
                batches = [data.eval_batch(batch=b, batch_size=spec.micro_batch_size).to(device)
                           for b in range(spec.eval_batches)]
                eval_losses.append(sum(model(b, labels=b).loss.item() for b in batches) / len(batches))
            model.train()
    return Reference(losses, eval_losses, {k: v.detach().clone() for k, v in model.named_parameters()})


def exported_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The parameters of an exported model directory, as plain PyTorch loads them."""
    model = GPT2LMHeadModel.from_pretrained(directory, local_files_only=True)
    return {name: weight.detach() for name, weight in model.named_parameters()}


def assert_bit_identical(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Every tensor equal bit for bit: same names, dtypes, shapes and values (a difference names its largest gap)."""
    assert actual.keys() == expected.keys()
    differ = {name: (actual[name] - tensor).abs().max().item() for name, tensor in expected.items()
              if not torch.equal(actual[name], tensor) or actual[name].dtype != tensor.dtype}
    assert not differ, f"not bit-identical (largest difference per tensor): {differ}"


@pytest.fixture(scope="module")
def references(tokens_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Reference]:
    out = {}
    for kind, optimizer in OPTIMIZERS.items():
        root = tmp_path_factory.mktemp(f"reference-{kind}")
        spec = tiny_spec(tokens_path, optimizer=optimizer)
        trial_create(spec=spec, spill_dir=root, trial_id="init", device=CPU, cuts=[0])
        TrialSession.open(spill_dir=root, trial_id="init", device=CPU).export(root / "init")
        assert lr_factor(spec.schedule, 10, spec.steps) == 0.5 * (1 + math.cos(math.pi * 7 / 17))
        out[kind] = plain_training(root / "init", spec)
    return out


@pytest.mark.parametrize("tier", ["host", "disk"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_it_trains_exactly_like_plain_pytorch(
    kind: str, plan: str, tier: str, references: dict[str, Reference], tokens_path: Path, tmp_path: Path,
    shm_dir: Path,
) -> None:
    spill_dir = shm_dir if tier == "host" else tmp_path
    spec = tiny_spec(tokens_path, optimizer=OPTIMIZERS[kind])
    created = trial_create(spec=spec, spill_dir=spill_dir, trial_id="t", device=CPU, cuts=PLANS[plan])
    assert len(created.shards) == len(PLANS[plan])
    session = TrialSession.open(spill_dir=spill_dir, trial_id="t", device=CPU)
    results = run_all(session)
    session.export(tmp_path / "final")
    reference = references[kind]

    losses = [r.loss for r in results if r.loss is not None]
    eval_losses = [r.eval_loss for r in results if r.eval_loss is not None]
    assert losses == reference.losses
    assert eval_losses == reference.eval_losses
    assert_bit_identical(exported_weights(tmp_path / "final"), reference.weights)


def test_it_recomputes_instead_of_keeping_with_the_same_numbers(
    references: dict[str, Reference], tokens_path: Path, tmp_path: Path
) -> None:
    numbers = {}
    for policy in ("auto", "recompute"):
        spec = tiny_spec(tokens_path, optimizer=OPTIMIZERS["adamw"], activations=policy)
        plan = trial_create(spec=spec, spill_dir=tmp_path, trial_id=policy, device=CPU, cuts=PLANS["3-shards"])
        # On CPU keeping costs no copy, so "auto" keeps every shard but the last (whose unit is FB).
        assert [s.keep_activations for s in plan.shards] == ([True, True, False] if policy == "auto" else [False] * 3)
        session = TrialSession.open(spill_dir=tmp_path, trial_id=policy, device=CPU)
        results = run_all(session)
        numbers[policy] = [r.loss for r in results if r.loss is not None]
        backward_reads = sum(r.bytes_read for r in results if r.unit.phase == "B")
        numbers[f"{policy}-reads"] = backward_reads
    assert numbers["auto"] == numbers["recompute"] == references["adamw"].losses
    assert numbers["auto-reads"] < numbers["recompute-reads"]  # kept graphs need no saved input or RNG state


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_it_streams_the_optimizer_step_in_chunks_exactly(
    kind: str, references: dict[str, Reference], tokens_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("worker.engine.optimizer_step.STEP_CHUNK", 1000)  # shards hold ~13k-30k parameters
    spec = tiny_spec(tokens_path, optimizer=OPTIMIZERS[kind])
    trial_create(spec=spec, spill_dir=tmp_path, trial_id="t", device=CPU, cuts=PLANS["2-shards"])
    session = TrialSession.open(spill_dir=tmp_path, trial_id="t", device=CPU)
    run_all(session)
    session.export(tmp_path / "final")
    assert_bit_identical(exported_weights(tmp_path / "final"), references[kind].weights)
