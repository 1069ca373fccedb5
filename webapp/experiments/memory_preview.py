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
"""

from __future__ import annotations

import functools
from typing import Any

from webapp.experiments.model_shapes import ModelShape
from worker.engine.errors import BudgetError
from worker.engine.partition import AUTO_BUDGET_FRACTION, LayerCost, solve
from worker.engine.sizes import FP32, optimizer_slots

CPU_DEVICE_BUDGET = 4 << 30  # per CPU device when no GPU is present


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


def layer_costs(shape: ModelShape, *, batch: int, seq_len: int, slots: int) -> list[LayerCost]:
    """Estimated bytes per layer (embedding, blocks, head) for one micro-batch of ``batch`` x ``seq_len``."""
    C, V, a = shape.n_embd, shape.vocab_size, shape.n_head  # the paper's names
    tokens = batch * seq_len

    def cost(name: str, params: int, activations: int, borrowed: int = 0) -> LayerCost:
        # A borrowed (tied) weight and its gradient are held by the borrower too: the engine's lent bytes.
        return LayerCost(name=name, param_bytes=params * FP32, grad_bytes=params * FP32,
                         optim_bytes=params * slots * FP32, activation_bytes=activations,
                         lent_bytes=2 * borrowed * FP32)

    if shape.family == "gpt2":
        embedding_acts = 3 * tokens * C * FP32
        block_acts = 2 * tokens * (34 * C + 5 * a * seq_len) + 2 * tokens * C * FP32
    else:
        arch = shape.architecture()
        kv = arch.kv_heads * arch.head_dim
        embedding_acts = 2 * tokens * C * FP32  # the embeddings and the rotary tables' share
        block_acts = tokens * (6 * C + 2 * kv + 4 * arch.intermediate + 2 * a * seq_len) * FP32
    # The head: the logits, their softmax and gradient (3V) and the final norm's tensors (4C).
    head_acts = tokens * (3 * V + 4 * C) * FP32
    acts = {"embedding": embedding_acts, "head": head_acts}
    return [cost(name, owned, acts.get(name, block_acts), borrowed)
            for name, owned, borrowed in shape.architecture().layer_params()]


def memory_plan(shape: ModelShape, *, batch: int, seq_len: int, optimizer: str, momentum: float,
                budget_bytes: int) -> dict[str, Any]:
    """The estimated plan as plain data (the engine's `MemoryPlan.to_dict()` plus spill totals).

    Raises `FitError` when a layer cannot fit one shard, naming the layer and the overage.
    """
    return _memory_plan(shape, batch, seq_len, optimizer_slots(optimizer, momentum), budget_bytes)


@functools.lru_cache(maxsize=512)
def _memory_plan(shape: ModelShape, batch: int, seq_len: int, slots: int, budget_bytes: int) -> dict[str, Any]:
    costs = layer_costs(shape, batch=batch, seq_len=seq_len, slots=slots)
    try:
        plan = solve(costs, budget_bytes).to_dict()
    except BudgetError as error:
        raise FitError(layer=error.layer or "?", needed_bytes=error.needed_bytes or budget_bytes + 1,
                       budget_bytes=budget_bytes) from None
    owned = sum(c.param_bytes for c in costs)
    boundary = batch * seq_len * shape.n_embd * FP32
    plan["source"] = "estimate"
    plan["spilled_bytes"] = {
        "parameters": owned,
        "optimizer": sum(c.optim_bytes for c in costs),
        "boundary_activations": 2 * boundary * (len(plan["shards"]) - 1),  # each cut's output and its gradient
    }
    return plan


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
