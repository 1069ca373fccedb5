"""Fair share between teams: whose trial a device that frees up runs next. Pure; the queue keeps the numbers.

Device time is divided between the teams that have runnable work in proportion to their weights (an
administrator sets them; 1 by default). A team's *usage* is the device time of the units it was leased,
decayed by half every ``USAGE_HALF_LIFE_S`` (an hour): the sliding window shares are judged over, kept in
Redis, so it outlives a worker's restart. The team with the least usage per weight goes next
(`team_turn`); inside the team, the experiment's priority (high, normal, low), then Sharded-LRTF
(`worker.scheduling.policy`).

A team that *arrives* (it had nothing runnable or running) starts at the least usage per weight of the
teams already waiting, times its own weight (`arrival_usage`): it neither takes every device to catch up on
time it did not ask for, nor waits behind what other teams used before it came. Its own past usage counts
when it is the larger, so a team cannot escape its share by pausing.

Switching between teams costs nothing: every trial's state is in its spill store after each unit (no
process keeps a team's trial warm, except the activations of a micro-batch in flight, which the policy lets
its holder finish first, see `policy.py`), so a device can run any team's unit next. Keep it that way: no
per-team warm state on a device.

With two teams of weight 1 each submitting trials of 1-second units on one device, A arriving first::

    clock   0    1    2    3    4    5
    cpu0    A    B    A    B    A    B

B arrives at 0.5 and starts at A's usage (1 s): they tie at clock 1 and B, never served, goes first; from
then on turns alternate.

With weights 3 (A) and 1 (B), A runs three units for each of B's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

USAGE_HALF_LIFE_S = 3600.0
PRIORITIES = {"low": 0, "normal": 1, "high": 2}


def decayed(usage: float, elapsed_s: float, half_life_s: float = USAGE_HALF_LIFE_S) -> float:
    """`usage` seen `elapsed_s` later: halved every `half_life_s` (no decay when it is infinite)."""
    return usage * 0.5 ** (max(0.0, elapsed_s) / half_life_s)


def normalized(usage: Mapping[str, float], weights: Mapping[str, float], team: str) -> float:
    """A team's usage per unit of weight (a team without a weight weighs 1)."""
    return usage.get(team, 0.0) / weights.get(team, 1.0)


def team_turn(teams: Iterable[str], usage: Mapping[str, float], weights: Mapping[str, float],
              served: Mapping[str, float] | None = None) -> str | None:
    """Of `teams` (those with runnable trials), the one whose turn it is: the least usage per weight; on a
    tie the one served least recently (`served`: when each team's last unit was leased; never comes
    first), then the smallest name, so that every device and test agrees. None when there is no team."""
    served = served or {}
    return min(teams, key=lambda team: (normalized(usage, weights, team), served.get(team, float("-inf")), team),
               default=None)


def arrival_usage(team: str, usage: Mapping[str, float], weights: Mapping[str, float],
                  waiting: Iterable[str]) -> float:
    """The usage `team` starts at when it arrives while `waiting` teams have work: the least usage per
    weight among them times its weight, or its own usage if that is larger."""
    others = [normalized(usage, weights, other) for other in waiting if other != team]
    start = min(others, default=0.0) * weights.get(team, 1.0)
    return max(usage.get(team, 0.0), start)
