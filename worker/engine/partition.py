"""The pure partition solver and the memory plan it produces.

A shard is a contiguous run of layers. While a shard's unit runs, the device holds that shard's state
(parameters, gradients, optimizer state), its activations for one micro-batch, and — double buffering —
the next shard's state being copied in. So with ``reserve`` = the largest shard state in the plan, every
shard must satisfy ``state + activations + reserve <= budget``. The solver tries every possible reserve
(each contiguous run's state), packs greedily (optimal for contiguous packing under a monotone limit),
and keeps the plan with the fewest shards, then the smallest reserve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.engine.errors import BudgetError


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    """Measured cost of one layer for the trial's micro-batch (bytes on the device, seconds)."""

    name: str
    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    activation_bytes: int
    time_s: float = 0.0

    @property
    def state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optim_bytes


@dataclass(frozen=True, kw_only=True)
class ShardPlan:
    """Layers ``[first, stop)`` as one shard, with their bytes summed by category."""

    index: int
    first: int
    stop: int
    layers: tuple[str, ...]
    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    activation_bytes: int

    @property
    def state_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optim_bytes


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Pure data (JSON-able through :meth:`to_dict`): the shards, the prefetch reserve and the budget."""

    budget_bytes: int
    reserve_bytes: int
    shards: tuple[ShardPlan, ...]
    layers: tuple[LayerCost, ...]

    @property
    def peak_bytes(self) -> int:
        """Planned device peak: the fullest shard's unit plus the prefetch reserve."""
        return max(s.state_bytes + s.activation_bytes for s in self.shards) + self.reserve_bytes

    @property
    def state_bytes(self) -> int:
        return sum(s.state_bytes for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget_bytes,
            "reserve_bytes": self.reserve_bytes,
            "peak_bytes": self.peak_bytes,
            "state_bytes": self.state_bytes,
            "shards": [dataclasses.asdict(s) | {"state_bytes": s.state_bytes} for s in self.shards],
            "layers": [dataclasses.asdict(layer) for layer in self.layers],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> MemoryPlan:
        shards = []
        for shard in raw["shards"]:
            fields = {k: v for k, v in shard.items() if k != "state_bytes"}
            shards.append(ShardPlan(**fields | {"layers": tuple(fields["layers"])}))
        return cls(
            budget_bytes=raw["budget_bytes"],
            reserve_bytes=raw["reserve_bytes"],
            shards=tuple(shards),
            layers=tuple(LayerCost(**layer) for layer in raw["layers"]),
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
    states = [c.state_bytes for c in costs]
    work = [c.activation_bytes for c in costs]
    smallest = max(states)
    for cost in costs:
        if cost.state_bytes + cost.activation_bytes + smallest > budget_bytes:
            raise BudgetError(
                f"layer {cost.name!r} needs {cost.state_bytes + cost.activation_bytes + smallest} bytes "
                f"(state {cost.state_bytes} + activations {cost.activation_bytes} + prefetch reserve {smallest}"
                f" for the largest layer) but the budget is {budget_bytes} bytes; raise the budget or shrink "
                "the micro-batch"
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


def plan_with_shards(costs: Sequence[LayerCost], cuts: Sequence[int], budget_bytes: int) -> MemoryPlan:
    """A plan with explicit shard start indices ``cuts`` (first must be 0), not checked against the budget.

    The prefetch reserve is the largest shard state. Also used by tests that need a given shard shape.
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
        )
        for index, (first, stop) in enumerate(zip(cuts, stops, strict=True))
    )
    return MemoryPlan(budget_bytes=budget_bytes, reserve_bytes=max(s.state_bytes for s in shards),
                      shards=shards, layers=tuple(costs))
