"""Creating a trial: profile its layers, plan its shards and write its initial state into a new spill store.

The store a created trial starts from is exactly the state of plain training before its first step:
parameters as initialized (or as the pretrained checkpoint has them; a LoRA trial's adapters as ``peft``
initializes them, its frozen base in the host's shared copy) and zero AdamW moments; its dropout draws from
a stream per micro-batch seeded from the trial's seed (`worker.engine.rng`). Layers are initialized one at a
time and streamed into the store, so the model never exists whole in memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from worker.engine import shared_base
from worker.engine.config import TrialSpec
from worker.engine.data import trial_data
from worker.engine.errors import SpecError
from worker.engine.layers import build_layer_stack
from worker.engine.pairs import PairRows
from worker.engine.partition import MemoryPlan
from worker.engine.profile import plan_layers, profile_layers
from worker.engine.sizes import FP32
from worker.engine.spill_store import SpillStore
from worker.engine.trial_state import TrialState
from worker.engine.weights import PretrainedWeights, init_layer


def trial_exists(*, spill_dir: Path, trial_id: str) -> bool:
    """Whether ``spill_dir/trial_id`` holds a created trial."""
    return SpillStore.exists(Path(spill_dir) / trial_id)


def trial_create(*, spec: TrialSpec, spill_dir: Path, trial_id: str, device: torch.device,
                 cuts: Sequence[int] | None = None, head_token_chunk: int | None = None) -> MemoryPlan:
    """Profile, plan and initialize a trial into ``spill_dir/trial_id``; return its memory plan.

    ``cuts`` forces the shard start layers instead of solving, ``head_token_chunk`` the head's loss in chunks of
    that many tokens whatever the budget (tests and benchmarks use them). Raises
    ``BudgetError`` when a layer cannot fit the budget, ``SpecError`` for bad data or checkpoints,
    ``SpillStoreError`` if the trial directory is taken.
    """
    stack = build_layer_stack(spec.model, spec.lora)
    if spec.data.seq_len > stack.context:
        raise SpecError(f"seq_len {spec.data.seq_len} exceeds the model's context of {stack.context}")
    data = trial_data(spec.data, vocab_size=stack.config.vocab_size)  # fail on bad data before any work
    if spec.data.tokenizer_dir is not None:  # the export ships it: a missing one fails now, not after training
        tokenizer_dir = Path(spec.data.tokenizer_dir)
        if not any((tokenizer_dir / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
            raise SpecError(f"tokenizer_dir {tokenizer_dir} holds no tokenizer.json")
    stack.layers[-1].token_chunk = head_token_chunk
    costs = profile_layers(stack, spec, device)
    stack.layers[-1].token_chunk = None
    plan = plan_layers(stack, spec, device, costs, spec.budget_bytes, cuts=cuts, head_token_chunk=head_token_chunk)
    base = None
    if spec.lora is not None:  # the frozen weights go to the host's shared base; the trial owns its adapters
        assert spec.model.pretrained_dir is not None, "TrialSpec checks it"
        base = shared_base.acquire(spill_dir=Path(spill_dir), stack=stack, base_dtype=spec.model.base_dtype,
                                   pretrained_dir=Path(spec.model.pretrained_dir), trial_id=trial_id)
    # A full fine-tune's DPO reference is its starting weights: its timetable opens with the reference pass.
    reference_batches = (data.reference_batches(spec.micro_batch_size)
                         if isinstance(data, PairRows) and spec.lora is None else 0)
    state = TrialState.start(trial_id=trial_id, spec=spec, plan=plan, base=base, reference_batches=reference_batches)
    store = SpillStore.create(Path(spill_dir) / trial_id, state.to_manifest())
    source = None
    if spec.model.pretrained_dir and spec.lora is None:
        source = PretrainedWeights(Path(spec.model.pretrained_dir))

    def layer_weights(shard: int) -> Iterator[torch.Tensor]:
        for index in range(plan.shards[shard].first, plan.shards[shard].stop):
            yield from source.layer(stack, index) if source else init_layer(stack, index, spec.seed)

    for shard in plan.shards:
        store.write_stream(f"p{shard.index}", layer_weights(shard.index))
        if spec.optimizer.kind == "adamw":  # both moments start at zero (fp32), as in torch.optim.AdamW
            zeros = sum(stack.layer_numel(index) for index in range(shard.first, shard.stop)) * FP32
            store.write_zeros(f"m{shard.index}", zeros)
            store.write_zeros(f"v{shard.index}", zeros)
    store.commit()
    return plan
