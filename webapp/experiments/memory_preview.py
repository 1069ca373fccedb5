"""Memory plans before launch: analytic GPT-2 layer costs, packed by the engine's own pure solver.

The real plan is measured by profiling on a device worker when a trial starts (the trial's ``planning``
state) and replaces this estimate. The estimate uses the engine's byte categories, its sizes
(`worker.engine.sizes`) and its solver (`worker.engine.partition.solve`, pure Python, no torch), so there is
one rule for "does it fit": whatever the solver refuses is a `FitError` here, with the solver's numbers.

Parameters per layer are the engine's own counts (`worker.engine.families`: each family's blocks, grouped-query
attention, gated MLP, tied or untied head). Activation bytes of a GPT-2 block follow Korthikanti et al. (2022),
"Reducing Activation Recomputation in Large Transformer Models": about ``s*b*h*(34 + 5*a*s/h)`` bytes in 16-bit,
so twice that in fp32. A Llama-style block (pre-norm RMSNorm, rotary attention with ``kv`` key/value heads, a
gated MLP of width ``i``) keeps per token, in fp32: its two norms' inputs and outputs (4h), queries, keys and
values (h + 2*kv*d), the attention output (h), the softmax scores (2*a*s with their dropout) and the MLP's
gate, up, activation and product (4i).

A LoRA trial (``lora``, the engine's `LoraSpec`) trains only its adapters: per layer the engine's own counts
(`Architecture.lora_layer_params`: ``r * (in + out)`` per targeted linear module) are its parameters, with
gradients and optimizer state, and every base weight the layer registers is ``frozen_bytes``: on the device
while a unit of its shard runs, not in the trial's state, read from the host's one shared copy of the base
(``base_bytes`` in the plan: the model's parameters once, at the experiment's ``base_dtype``, with
``base_bytes_fp32`` beside it for comparison). A base in bf16, int8 or nf4 counts each layer's frozen weights at
that precision, an nf4 base's token embedding and head at int8 (`Architecture.frozen_layer_bytes`, the engine's
`stored_bytes` of each matrix), and a unit also
holds one module's weights dequantized while it runs: the layer's largest matrix in fp32 is added to its
activations. Its activations are those of full training
(an upper bound: a frozen weight's input need not be kept) plus each adapter's rank-wide intermediate, and its
dropout's output and mask when it has dropout.

The head keeps its whole logits' log-softmax for backward, where backward adds the gradients of it and of the
logits (3V per token). When that is what keeps the head from fitting, the engine computes its loss in token
chunks (`worker.engine.chunked_loss`) and the estimate does the same, through the same solver: the head then
holds a chunk's three logits-sized tensors (`chunked_head_transient_bytes`) beside its norm's, a tied weight
without its gradient (which streams to the store), and the plan names the chunk (``head_token_chunk``). A LoRA
adapter on ``lm_head`` has no chunked form.
"""

from __future__ import annotations

import functools
from typing import Any

from webapp.catalog.sizing import CPU_DEVICE_BUDGET
from webapp.experiments.model_shapes import ModelShape
from webapp.worker_door import (
    AUTO_BUDGET_FRACTION,
    FP32,
    BudgetError,
    LayerCost,
    LoraSpec,
    chunked_head_transient_bytes,
    optimizer_slots,
    solve_with_head_chunks,
)


class FitError(ValueError):
    """A layer that cannot fit the budget even alone in its shard."""

    def __init__(self, *, layer: str, needed_bytes: int, budget_bytes: int) -> None:
        super().__init__(layer, needed_bytes, budget_bytes)
        self.layer, self.needed_bytes, self.budget_bytes = layer, needed_bytes, budget_bytes

    def __str__(self) -> str:
        over = self.needed_bytes - self.budget_bytes
        return (
            f"Layer {self.layer} needs {_gib(self.needed_bytes)} on the device (its state, activations and the "
            f"prefetch reserve) but the budget is {_gib(self.budget_bytes)}: {_gib(over)} over. Raise the memory "
            "budget, or lower the batch size, sequence length or width."
        )


def _gib(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.1f} MiB"


def layer_costs(shape: ModelShape, *, batch: int, seq_len: int, slots: int,
                lora: LoraSpec | None = None, head_token_chunk: int | None = None) -> list[LayerCost]:
    """Estimated bytes per layer (embedding, blocks, head) for one micro-batch of ``batch`` x ``seq_len``;
    with ``lora``, a LoRA trial's: its adapters are the state, the base weights frozen bytes; with
    ``head_token_chunk``, the head's loss in chunks of that many tokens."""
    C, V, a = shape.n_embd, shape.vocab_size, shape.n_head  # the paper's names
    tokens = batch * seq_len
    arch = shape.architecture()

    if shape.family == "gpt2":
        embedding_acts = 3 * tokens * C * FP32
        block_acts = 2 * tokens * (34 * C + 5 * a * seq_len) + 2 * tokens * C * FP32
    else:
        kv = arch.kv_heads * arch.head_dim
        embedding_acts = 2 * tokens * C * FP32  # the embeddings and the rotary tables' share
        block_acts = tokens * (6 * C + 2 * kv + 4 * arch.intermediate + 2 * a * seq_len) * FP32
    # The head: the logits, their softmax and gradient (3V) and the final norm's tensors (4C); in chunks, a
    # chunk's logits-sized tensors instead of the whole ones.
    if head_token_chunk is None:
        head_acts = tokens * (3 * V + 4 * C) * FP32
    else:
        head_acts = tokens * 4 * C * FP32 + chunked_head_transient_bytes(tokens, V, head_token_chunk)
    acts = {"embedding": embedding_acts, "head": head_acts}
    if lora is None:
        # A borrowed (tied) weight and its gradient are held by the borrower too: the engine's lent bytes. A
        # chunked head hands the gradient to the store as it makes it, and holds the weight only.
        copies = {"head": 1 if head_token_chunk is not None else 2}
        return [LayerCost(name=name, param_bytes=owned * FP32, grad_bytes=owned * FP32,
                          optim_bytes=owned * slots * FP32, activation_bytes=acts.get(name, block_acts),
                          lent_bytes=copies.get(name, 2) * borrowed * FP32)
                for name, owned, borrowed in arch.layer_params()]

    r, dropout, targets = lora.r, lora.dropout, lora.target_modules

    def adapter_acts(linears: list[tuple[str, int, int]]) -> int:
        """What the adapters of these modules keep for backward: A's output (r wide) and, with dropout, the
        dropped input and its mask (a byte an element)."""
        return sum(tokens * (r * FP32 + (n_in * (FP32 + 1) if dropout else 0))
                   for name, n_in, _ in linears if name in targets)

    acts["head"] += adapter_acts([("lm_head", C, V)])
    block_acts += adapter_acts(arch.block_linears())
    frozen = arch.frozen_layer_bytes(shape.base_dtype)
    dequantized = {}  # a low-bit base: a module's weights full precision while it runs, the largest matrix in fp32
    if shape.base_dtype != "fp32":
        dequantized = {name: FP32 * max(rows * cols for rows, cols in matrices)
                       for name, matrices in arch.layer_matrices()}
    return [LayerCost(name=name, param_bytes=adapters * FP32, grad_bytes=adapters * FP32,
                      optim_bytes=adapters * slots * FP32,
                      activation_bytes=acts.get(name, block_acts) + dequantized.get(name, 0),
                      frozen_bytes=frozen_bytes)
            for (name, adapters, _), frozen_bytes in zip(arch.lora_layer_params(r=r, targets=targets), frozen,
                                                         strict=True)]


def memory_plan(shape: ModelShape, *, batch: int, seq_len: int, optimizer: str, momentum: float,
                budget_bytes: int, lora: LoraSpec | None = None, dpo_pairs: int | None = None) -> dict[str, Any]:
    """The estimated plan as plain data (the engine's `MemoryPlan.to_dict()` plus spill totals, and for a
    LoRA trial ``base_bytes``, the host's one shared copy of the frozen base).

    A DPO trial (`dpo_pairs`: the pairs of its dataset; None for any other trial) is planned as the same rows
    (``batch`` counts rows, two a pair) and adds the reference's costs to its store, with ``dpo_reference``
    saying where its reference comes from: a LoRA trial's is the shared base with the adapters off, whose
    boundary outputs it keeps beside its own (one per cut, no gradient); a full fine-tune's is its starting
    weights, run once in a first pass over every pair before training (that pass's boundary outputs, then two
    fp32 log-probabilities a pair kept for the whole trial), never a second copy of the model.

    Raises `FitError` when a layer cannot fit one shard, naming the layer and the overage.
    """
    plan = _memory_plan(shape, batch, seq_len, optimizer_slots(optimizer, momentum), budget_bytes, lora)
    if dpo_pairs is None:
        return plan
    spilled = dict(plan["spilled_bytes"])
    spilled["reference_boundaries"] = batch * seq_len * shape.n_embd * FP32 * (len(plan["shards"]) - 1)
    if lora is None:
        spilled["reference_log_probs"] = 2 * FP32 * dpo_pairs
    return {**plan, "spilled_bytes": spilled,
            "dpo_reference": "shared base, adapters off" if lora is not None else "first pass, log-probs kept"}


@functools.lru_cache(maxsize=512)
def _memory_plan(shape: ModelShape, batch: int, seq_len: int, slots: int, budget_bytes: int,
                 lora: LoraSpec | None) -> dict[str, Any]:
    costs = layer_costs(shape, batch=batch, seq_len=seq_len, slots=slots, lora=lora)

    def chunked_head(chunk: int) -> LayerCost:
        return layer_costs(shape, batch=batch, seq_len=seq_len, slots=slots, lora=lora, head_token_chunk=chunk)[-1]

    adapted_head = lora is not None and "lm_head" in lora.target_modules
    try:
        plan = solve_with_head_chunks(costs, budget_bytes, tokens=batch * seq_len,
                                      chunked_head=None if adapted_head else chunked_head).to_dict()
    except BudgetError as error:
        raise FitError(layer=error.layer or "?", needed_bytes=error.needed_bytes or budget_bytes + 1,
                       budget_bytes=budget_bytes) from None
    owned = sum(c.param_bytes for c in costs)
    boundary = batch * seq_len * shape.n_embd * FP32
    plan["source"] = "estimate"
    plan["spilled_bytes"] = {  # the trial's own store: a LoRA trial's holds its adapters, not the base
        "parameters": owned,
        "optimizer": sum(c.optim_bytes for c in costs),
        "boundary_activations": 2 * boundary * (len(plan["shards"]) - 1),  # each cut's output and its gradient
    }
    if lora is not None:
        plan["base_bytes"] = shape.architecture().base_bytes(shape.base_dtype)
        plan["base_dtype"] = shape.base_dtype
        plan["base_bytes_fp32"] = shape.architecture().base_bytes("fp32")
    return plan


def shared_base_costs(plans: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the LoRA trials among ``plans`` (estimated plans of one experiment's trials, all on the same
    pretrained model) cost in host memory: with the shared base, one base plus each trial's own spilled state;
    without it, a copy of the base per trial. None when no plan is a LoRA trial's.

    ``read_bytes`` is what one trial's shards read of the base onto the devices: more than the base when the
    head is tied, for the embedding's shard and the head's shard each read the one matrix they share."""
    lora = [plan for plan in plans if plan.get("base_bytes")]
    if not lora:
        return None
    base = max(plan["base_bytes"] for plan in lora)
    states = sum(sum(plan["spilled_bytes"].values()) for plan in lora)
    return {"trials": len(lora), "base_bytes": base, "state_bytes": states,
            "shared_bytes": base + states, "unshared_bytes": len(lora) * base + states,
            "read_bytes": max(plan.get("frozen_bytes") or 0 for plan in lora),
            "base_dtype": lora[0].get("base_dtype", "fp32"),
            "base_bytes_fp32": max(plan.get("base_bytes_fp32", plan["base_bytes"]) for plan in lora)}


def auto_budget_bytes() -> tuple[int, str]:
    """The budget "auto" means on this host, and where it came from: 90% of the smallest GPU, else 4 GiB."""
    try:
        import pynvml
    except ImportError:
        return CPU_DEVICE_BUDGET, "no GPU: a CPU device's default budget"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return CPU_DEVICE_BUDGET, "no GPU: a CPU device's default budget"
    try:
        count = pynvml.nvmlDeviceGetCount()
        if not count:
            return CPU_DEVICE_BUDGET, "no GPU: a CPU device's default budget"
        smallest = min(
            pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total for i in range(count)
        )
        return int(smallest * AUTO_BUDGET_FRACTION), f"90% of the smallest of {count} GPU(s)"
    finally:
        pynvml.nvmlShutdown()
