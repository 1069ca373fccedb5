"""The arguments the queue's Python side gives the survey and complete scripts (``lua/survey.lua``,
``lua/complete.lua``), with the bounds of a survey's read, and a trial's ready lanes as every lane script
takes them: each named and checked in one place, so that `ShardQueue` and its pipelines send the same."""

from __future__ import annotations

from collections.abc import Sequence

from worker.scheduling.policy import BaseShard
from worker.scheduling.queue.records import Lease, claim_ids

# What a survey reads of each team's runnable set (see ``lua/survey.lua``): its longest trials that no other
# device holds, and of one shared base's trials the longest that the affinity rule may look at. Both are bounds
# that keep a survey's cost flat however many trials are runnable; the policy's choice over them is its choice
# over the whole set, except that a base's trials beyond the first SURVEY_BASE_WALK are not tried for affinity.
SURVEY_HEAD = 4
SURVEY_BASE_WALK = 16


def _survey_args(device: str, epoch: str, holding: BaseShard | None = None, claim: Sequence[str] = (),
                 plan: bool = False) -> dict[str, object]:
    """The survey script's arguments for the loop `epoch` of `device`, which holds base layers `holding`,
    claiming the first still runnable of `claim` (none when empty), or with `plan` a trial to plan."""
    return {"head": SURVEY_HEAD, "base_walk": SURVEY_BASE_WALK, "device": device, "epoch": epoch,
            "holding": "" if holding is None else str(holding), "claim": claim_ids(claim),
            "plan": "1" if plan else "0"}


def _complete_args(
    lease: Lease, remaining_units: int, unit_s: float, message: str, steps_done: int | None, hold_s: float, *,
    epoch: str, next_base: BaseShard | None = None, pruned: bool = False, rung: int | None = None,
    ready: Sequence[int] = (0,), ready_version: int = 0,
) -> dict[str, object]:
    """The complete script's arguments; `epoch` is the device loop's that goes on with a held trial, or ''."""
    return {"id": lease.trial_id, "token": lease.token, "remaining_units": remaining_units,
            "unit_s": repr(unit_s), "device": lease.device, "message": message,
            "steps_done": "" if steps_done is None else int(steps_done), "hold_ms": int(hold_s * 1000),
            "epoch": epoch, "next_base": "" if next_base is None else str(next_base),
            "ended": "pruned" if pruned else "finished", "rung": "" if rung is None else int(rung),
            "ready": _lanes(ready), "ready_v": int(ready_version)}


def _lanes(lanes: Sequence[int]) -> str:
    """Lanes as the scripts take them, separated by spaces; ValueError for anything not a lane number."""
    if any(isinstance(lane, bool) or not isinstance(lane, int) or lane < 0 for lane in lanes):
        raise ValueError(f"lanes must be whole numbers from 0; got {list(lanes)!r}")
    return " ".join(str(lane) for lane in lanes)
