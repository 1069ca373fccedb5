"""The downsampling functions against exact expected indices."""

from __future__ import annotations

import pytest

from webapp.dashboards.downsample import lttb, minmax
from webapp.telemetry import levels


def test_lttb_returns_a_short_series_whole():
    assert lttb([0, 1, 2], [5, 4, 3], 10) == [0, 1, 2]


def test_lttb_keeps_the_ends_and_the_peak_of_each_bucket():
    xs = list(range(10))
    ys = [0, 0, 9, 0, 0, 0, 0, -9, 0, 0]
    # 8 inner points in 2 buckets of 4: the spike at 2 and the dip at 7 span the largest triangles.
    assert lttb(xs, ys, 4) == [0, 2, 7, 9]


def test_lttb_gives_the_two_ends_for_a_threshold_under_three():
    assert lttb([0, 1, 2, 3], [1, 2, 3, 4], 2) == [0, 3]


def test_lttb_rejects_columns_of_different_lengths():
    with pytest.raises(ValueError, match="ys has 2"):
        lttb([0, 1, 2], [0, 1], 2)


def test_lttb_of_a_straight_line_takes_each_buckets_first_point():
    xs = list(range(101))
    # Every triangle is flat (area 0), so the first point of each bucket (width 99 / 4 = 24.75) wins.
    assert lttb(xs, [2 * x for x in xs], 6) == [0, 1, 25, 50, 75, 100]


def test_minmax_keeps_the_extremes_of_every_bucket():
    ys = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]
    # Buckets [3 1 4 1] [5 9 2 6] [5 3 5 8]: mins at 1, 6, 9; maxes at 2, 5, 11; plus both ends.
    assert minmax([0] * 4 + [1] * 4 + [2] * 4, ys) == [0, 1, 2, 5, 6, 9, 11]


def test_minmax_keeps_the_extremes_of_every_series():
    utilization = [0.1, 0.9, 0.5, 0.5, 0.2, 0.3]
    memory = [5, 5, 5, 7, 5, 1]
    assert minmax([0, 0, 0, 0, 0, 0], utilization, memory) == [0, 1, 3, 5]


def test_minmax_keeps_a_flat_bucket_once():
    assert minmax([0] * 6 + [1] * 6, [1.0] * 12) == [0, 6, 11]


def test_minmax_returns_nothing_of_nothing():
    assert minmax([], []) == []


def test_minmax_rejects_a_series_of_another_length():
    with pytest.raises(ValueError, match="a series has 2"):
        minmax([0, 0, 1], [1, 2])


def test_minmax_keeps_the_same_points_once_others_are_removed():
    ys = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]
    buckets = [i // 5 for i in range(len(ys))]
    kept = minmax(buckets, ys)
    assert kept == [0, 1, 4, 5, 6, 10, 12, 15]  # ties (9 at 12 and 14) keep the earliest
    not_kept = [i for i in range(len(ys)) if i not in kept]
    for removed in ([], not_kept[:1], not_kept[1::2], not_kept):
        left = [i for i in range(len(ys)) if i not in removed]
        again = minmax([buckets[i] for i in left], [ys[i] for i in left])
        assert [left[i] for i in again] == kept


def test_representatives_are_each_buckets_first_last_lowest_and_highest():
    points = [levels.Point(id=10 + s, step=s, loss=loss) for s, loss in enumerate([5, 7, 1, 6, 4, 4, 9, 3, 2])]
    # Level 1 buckets are 8 steps wide: steps 0..7 and 8.
    assert levels.representatives(points, 1) == {10, 17, 12, 16, 18}


def test_level_for_picks_the_coarsest_needed():
    assert levels.level_for(300, 400) == 0
    assert levels.level_for(50_000, 400) == 3  # 4 * ceil(50000 / 512) = 392
    assert levels.level_for(10**9, 400) == levels.MAX_LEVEL
