"""Levels of detail for a trial's step metrics, kept at ingest so that dashboards never read every step.

Steps are cut into buckets of ``BASE**level`` steps. A step row's ``level`` is the highest level at which it
is a *representative* of its bucket: the bucket's first, last, lowest-loss or highest-loss row. Level 0 is
every row. The representatives of a level-k bucket are representatives of their level-(k-1) buckets too (the
first, last, minimum and maximum of a union are among those of its parts), so level k is computed from the
rows of level >= k-1 only, and ``level >= k`` reads at most ``4 * steps / BASE**k`` rows: a 50,000-step
curve at level 3 is under 400 rows, minimum and maximum of every 512 steps, so no spike is lost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

BASE = 8
MAX_LEVEL = 5  # buckets of 32,768 steps: enough for runs of millions of steps


class Point(NamedTuple):
    id: int
    step: int
    loss: float


def bucket_width(level: int) -> int:
    return BASE**level


def representatives(points: Iterable[Point], level: int) -> set[int]:
    """Ids of the first, last, lowest and highest point of each level-`level` bucket.

    Ties go to the earliest step, so the choice is stable as later points arrive.
    """
    width = bucket_width(level)
    buckets: dict[int, list[Point]] = defaultdict(list)
    for point in points:
        buckets[point.step // width].append(point)
    kept: set[int] = set()
    for bucket in buckets.values():
        bucket.sort(key=lambda p: p.step)
        kept.add(bucket[0].id)
        kept.add(bucket[-1].id)
        kept.add(min(bucket, key=lambda p: (p.loss, p.step)).id)
        kept.add(max(bucket, key=lambda p: (p.loss, -p.step)).id)
    return kept


def level_for(steps: int, budget: int) -> int:
    """The lowest level whose representatives of a `steps`-step curve number at most `budget`."""
    level = 0
    while level < MAX_LEVEL and (steps if level == 0 else 4 * -(-steps // bucket_width(level))) > budget:
        level += 1
    return level
