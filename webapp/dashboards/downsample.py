"""Shape-keeping downsampling of long series, as pure functions that return the indices to keep.

Both keep the first and last point, so a curve still starts and ends where it does, and return indices in
ascending order, so the caller can pick any parallel columns (step, tokens, time) with them.

- `lttb` (largest-triangle-three-buckets, Steinarsson 2013) keeps the point of each bucket that spans the
  largest triangle with its neighbours: the best visual fidelity for a smooth learning curve.
- `minmax` keeps each bucket's lowest and highest point: no spike or dip is ever lost, which is what a
  utilization or memory trace needs (a memory peak must stay visible against the budget). Its buckets are
  given by the caller (time buckets of a device trace), so that the choice is stable as points are removed.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def lttb(xs: Sequence[float], ys: Sequence[float], threshold: int) -> list[int]:
    """Indices of at most `threshold` points of (xs, ys) chosen by largest-triangle-three-buckets.

    `xs` must be ascending. A series of at most `threshold` points (or a `threshold` under 3) is returned
    whole, resp. as its two ends. Raises ValueError when the columns differ in length.
    """
    n = len(xs)
    if len(ys) != n:
        raise ValueError(f"xs has {n} points but ys has {len(ys)}.")
    if n <= threshold or n <= 2:
        return list(range(n))
    if threshold < 3:
        return [0, n - 1]
    # The inner n-2 points fall into threshold-2 buckets of (fractional) width `every`.
    every = (n - 2) / (threshold - 2)
    kept = [0]
    a = 0
    for i in range(threshold - 2):
        start = int(i * every) + 1
        end = int((i + 1) * every) + 1
        # The next bucket's average is the third corner of every triangle of this bucket.
        next_start = end
        next_end = min(int((i + 2) * every) + 1, n)
        span = next_end - next_start
        avg_x = sum(xs[next_start:next_end]) / span
        avg_y = sum(ys[next_start:next_end]) / span
        ax, ay = xs[a], ys[a]
        best, best_area = start, -1.0
        for j in range(start, end):
            area = abs((ax - avg_x) * (ys[j] - ay) - (ax - xs[j]) * (avg_y - ay))
            if area > best_area:
                best, best_area = j, area
        kept.append(best)
        a = best
    kept.append(n - 1)
    return kept


def minmax(buckets: Sequence[Hashable], *series: Sequence[float]) -> list[int]:
    """Indices of the first and last point and of each bucket's lowest and highest point in every series,
    ascending.

    ``buckets[i]`` names the bucket of point i; a bucket's points need not be adjacent. Ties keep the
    earliest point. What a bucket keeps depends on that bucket's points only, never on how many other points
    there are, so removing points that were not kept changes nothing that is: for every S' with
    ``minmax(S) <= S' <= S``, ``minmax(S')`` keeps exactly the same points (the telemetry compaction deletes
    old device samples by this). Raises ValueError when a series differs from `buckets` in length.
    """
    n = len(buckets)
    for column in series:
        if len(column) != n:
            raise ValueError(f"buckets has {n} points but a series has {len(column)}.")
    if n == 0:
        return []
    kept = {0, n - 1}
    for column in series:
        low: dict[Hashable, int] = {}
        high: dict[Hashable, int] = {}
        for i, bucket in enumerate(buckets):
            if bucket not in low or column[i] < column[low[bucket]]:
                low[bucket] = i
            if bucket not in high or column[i] > column[high[bucket]]:
                high[bucket] = i
        kept.update(low.values())
        kept.update(high.values())
    return sorted(kept)
