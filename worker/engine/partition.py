"""The pure partition solver and the memory plan it produces.

A shard is a contiguous run of layers. While a shard's unit runs, the device holds that shard's weights
and fresh gradients (``device_bytes``; the accumulated gradients and the optimizer state only stream through
in small chunks), its activations for one micro-batch, and — double buffering — the next shard's weights
being copied in. So
with ``reserve`` = the largest shard's device bytes in the plan, every shard must satisfy
``device_bytes + activations + reserve <= budget``. The solver tries every possible reserve
(each contiguous run's state), packs greedily (optimal for contiguous packing under a monotone limit),
and keeps the plan with the fewest shards, then the smallest reserve.

The LM head's activations grow with the vocabulary (a micro-batch's whole logits, their log-softmax and
gradient): when they alone keep the head from fitting, :func:`solve_with_head_chunks` plans the head's loss in
token chunks (:mod:`worker.engine.chunked_loss`, the same numbers without the whole logits), the largest chunk
under which the plan fits. Chunking recomputes the logits, so a plan that fits without it does not chunk.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from worker.engine.errors import BudgetError

# The share of a GPU's memory that "auto" budgets: the rest is the CUDA context and the allocator's slack.
AUTO_BUDGET_FRACTION = 0.9
# The fewest token rows a planned head chunk has: the chunked loss's smallest exact matmul
# (worker.engine.chunked_loss.MIN_SPAN); smaller chunks would save little memory for much per-chunk overhead.
MIN_HEAD_CHUNK = 16


@dataclass(frozen=True, kw_only=True)
class Bytes:
    """Bytes by category, for a layer or a whole shard.

    ``param_bytes``, ``grad_bytes`` and ``optim_bytes`` are the share of the training state (owned
    parameters only); ``lent_bytes`` is a borrowed (tied) parameter and its gradient, held on the device
    by the borrower too (the parameter alone when the gradient streams to the store as it is made: a head
    whose loss runs in chunks). On the device a unit holds parameters and fresh gradients; the gradients
    accumulated over micro-batches stream through in chunks (:mod:`worker.engine.gradients`).
    ``frozen_bytes`` are a LoRA trial's frozen base weights: on the device while a unit runs, with no
    gradient and no optimizer state, and not the trial's state (the host's shared base holds them).
    """

    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    activation_bytes: int
    lent_bytes: int = 0
    frozen_bytes: int = 0

    @property
    def state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optim_bytes

    @property
    def device_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.lent_bytes + self.frozen_bytes


@dataclass(frozen=True, kw_only=True)
class LayerCost(Bytes):
    """Measured cost of one layer for the trial's micro-batch (bytes, seconds)."""

    name: str
    forward_s: float = 0.0
    time_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ShardPlan(Bytes):
    """Layers ``[first, stop)`` as one shard, with their bytes summed by category."""

    index: int
    first: int
    stop: int
    layers: tuple[str, ...]
    keep_activations: bool = False


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Pure data (JSON-able through :meth:`to_dict`): the shards, the prefetch reserve and the budget.

    ``head_token_chunk``: the token rows of logits the head's loss computes at once (None: a micro-batch's
    whole logits); the head's ``LayerCost`` is measured with it.
    """

    budget_bytes: int
    reserve_bytes: int
    shards: tuple[ShardPlan, ...]
    layers: tuple[LayerCost, ...]
    head_token_chunk: int | None = None

    @property
    def peak_bytes(self) -> int:
        """Planned device peak: the fullest shard's unit plus the prefetch reserve."""
        return max(self.unit_peak_bytes(s.index) for s in self.shards)

    def unit_peak_bytes(self, shard: int) -> int:
        """Planned device peak while a unit of ``shard`` runs: its state and activations plus the reserve."""
        s = self.shards[shard]
        return s.device_bytes + s.activation_bytes + self.reserve_bytes

    @property
    def state_bytes(self) -> int:
        return sum(s.state_bytes for s in self.shards)

    @property
    def frozen_bytes(self) -> int:
        """The frozen base weights the trial reads from its host's shared base (0 without LoRA)."""
        return sum(s.frozen_bytes for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget_bytes,
            "reserve_bytes": self.reserve_bytes,
            "head_token_chunk": self.head_token_chunk,
            "peak_bytes": self.peak_bytes,
            "state_bytes": self.state_bytes,
            "frozen_bytes": self.frozen_bytes,
            "shards": [dataclasses.asdict(s) | {"state_bytes": s.state_bytes, "device_bytes": s.device_bytes}
                       for s in self.shards],
            "layers": [dataclasses.asdict(layer) for layer in self.layers],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> MemoryPlan:
        shards = []
        for shard in raw["shards"]:
            fields = {k: v for k, v in shard.items() if k not in ("state_bytes", "device_bytes")}
            shards.append(ShardPlan(**fields | {"layers": tuple(fields["layers"])}))
        return cls(
            budget_bytes=raw["budget_bytes"],
            reserve_bytes=raw["reserve_bytes"],
            shards=tuple(shards),
            layers=tuple(LayerCost(**layer) for layer in raw["layers"]),
            head_token_chunk=raw.get("head_token_chunk"),
        )


def _pack(states: Sequence[int], work: Sequence[int], reserve: int, budget: int) -> list[int] | None:
    """Greedy cut points (shard start indices) under ``reserve``; ``None`` if a layer cannot fit."""
    starts: list[int] = []
    state = act = 0
    for index, (s, w) in enumerate(zip(states, work, strict=True)):
        if s > reserve or s + w + reserve > budget:
            return None
        if not starts or state + s > reserve or state + s + act + w + reserve > budget:
            starts.append(index)
            state = act = 0
        state += s
        act += w
    return starts


def solve(costs: Sequence[LayerCost], budget_bytes: int) -> MemoryPlan:
    """Pack contiguous layers into the fewest shards that fit ``budget_bytes`` with the prefetch reserve.

    Raises :class:`BudgetError` naming the layer that cannot fit even alone.
    """
    states = [c.device_bytes for c in costs]
    work = [c.activation_bytes for c in costs]
    smallest = max(states)
    for cost in costs:
        needed = cost.device_bytes + cost.activation_bytes + smallest
        if needed > budget_bytes:
            raise BudgetError(
                f"layer {cost.name!r} needs {needed} bytes "
                f"(weights and gradients {cost.device_bytes} + activations {cost.activation_bytes} + prefetch "
                f"reserve {smallest} for the largest layer) but the budget is {budget_bytes} bytes; raise the "
                "budget or shrink the micro-batch",
                layer=cost.name, needed_bytes=needed, budget_bytes=budget_bytes,
            )
    reserves = sorted({sum(states[i:j]) for i in range(len(states)) for j in range(i + 1, len(states) + 1)})
    best: list[int] | None = None
    for reserve in reserves:  # ascending, so ties in shard count keep the smaller reserve
        if reserve < smallest:
            continue
        starts = _pack(states, work, reserve, budget_bytes)
        if starts is not None and (best is None or len(starts) < len(best)):
            best = starts
    assert best is not None, "one layer per shard always fits once every layer fits alone"
    return plan_with_shards(costs, best, budget_bytes)


def head_chunk_candidates(tokens: int) -> list[int]:
    """Token chunks to try for a head that does not fit whole, largest first: the micro-batch's tokens halved
    until a chunk would be under ``MIN_HEAD_CHUNK`` rows."""
    out, chunk = [], tokens
    while (chunk := math.ceil(chunk / 2)) >= MIN_HEAD_CHUNK:
        out.append(chunk)
    return out


def solve_with_head_chunks(costs: Sequence[LayerCost], budget_bytes: int, *, tokens: int,
                           chunked_head: Callable[[int], LayerCost] | None) -> MemoryPlan:
    """:func:`solve`; when the head (the last layer) is what cannot fit, the head's loss in token chunks:
    ``chunked_head(chunk)`` is the head's cost with ``chunk`` rows of logits at once, and the largest chunk of
    :func:`head_chunk_candidates` under which the plan fits is planned. ``chunked_head`` None (a head with no
    chunked form) and a layer other than the head that cannot fit raise the solver's ``BudgetError``."""
    try:
        return solve(costs, budget_bytes)
    except BudgetError as error:
        if chunked_head is None or error.layer != costs[-1].name:
            raise
        for chunk in head_chunk_candidates(tokens):
            try:
                plan = solve([*costs[:-1], chunked_head(chunk)], budget_bytes)
            except BudgetError as smaller:
                if smaller.layer != costs[-1].name:
                    raise
                continue
            return dataclasses.replace(plan, head_token_chunk=chunk)
        raise


def plan_with_shards(costs: Sequence[LayerCost], cuts: Sequence[int], budget_bytes: int, *,
                     head_token_chunk: int | None = None) -> MemoryPlan:
    """A plan with explicit shard start indices ``cuts`` (first must be 0), not checked against the budget,
    and the head's token chunk when given.

    The prefetch reserve is the largest shard's device bytes. Also used by tests that need a given shard shape.
    """
    assert cuts and cuts[0] == 0 and list(cuts) == sorted(set(cuts)) and cuts[-1] < len(costs)
    stops = [*cuts[1:], len(costs)]
    shards = tuple(
        ShardPlan(
            index=index, first=first, stop=stop, layers=tuple(c.name for c in costs[first:stop]),
            param_bytes=sum(c.param_bytes for c in costs[first:stop]),
            grad_bytes=sum(c.grad_bytes for c in costs[first:stop]),
            optim_bytes=sum(c.optim_bytes for c in costs[first:stop]),
            activation_bytes=sum(c.activation_bytes for c in costs[first:stop]),
            lent_bytes=sum(c.lent_bytes for c in costs[first:stop]),
            frozen_bytes=sum(c.frozen_bytes for c in costs[first:stop]),
        )
        for index, (first, stop) in enumerate(zip(cuts, stops, strict=True))
    )
    return MemoryPlan(budget_bytes=budget_bytes, reserve_bytes=max(s.device_bytes for s in shards),
                      shards=shards, layers=tuple(costs), head_token_chunk=head_token_chunk)


def choose_kept(plan: MemoryPlan, copy_bytes_per_s: float | None) -> MemoryPlan:
    """Per shard, keep the activations its forward unit saves (instead of recomputing them in its
    backward unit) when moving them off the device and back costs less than the forward it saves.

    ``copy_bytes_per_s`` is the measured device<->host bandwidth; ``None`` means the device memory is host
    memory (CPU), so keeping costs no copy. The last shard never recomputes (its unit is forward+backward).
    """
    shards = []
    for shard in plan.shards:
        layers = plan.layers[shard.first:shard.stop]
        forward_s = sum(layer.forward_s for layer in layers)
        copy_s = 0.0 if copy_bytes_per_s is None else 2 * shard.activation_bytes / copy_bytes_per_s
        keep = shard.index < len(plan.shards) - 1 and copy_s < forward_s
        shards.append(dataclasses.replace(shard, keep_activations=keep))
    return dataclasses.replace(plan, shards=tuple(shards))
