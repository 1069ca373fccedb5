"""Sharded-LRTF against exact expected sequences (worker/scheduling/policy.py)."""

from __future__ import annotations

import pytest

from worker.scheduling.fair_share import arrival_usage, decayed, team_turn
from worker.scheduling.policy import BaseShard, Candidate, Slot, TrialLoad, pick, timetable, unit_time_estimate

DEVICES = ["cpu0", "cpu1"]


def slots(trials: list[TrialLoad], devices: list[str]) -> list[tuple[str, str, int, float, float]]:
    return [(s.device, s.trial_id, s.unit, s.start, s.end) for s in timetable(trials, devices)]


def test_it_picks_the_longest_remaining_time() -> None:
    candidates = [Candidate("a", 3.0), Candidate("b", 7.5), Candidate("c", 7.0)]
    assert pick(candidates, "cpu0") == Candidate("b", 7.5)


def test_it_prefers_the_trial_the_device_last_ran_on_a_tie() -> None:
    candidates = [Candidate("a", 4.0, "cpu1"), Candidate("b", 4.0, "cpu0"), Candidate("c", 4.0, None)]
    assert pick(candidates, "cpu0").trial_id == "b"
    assert pick(candidates, "cpu1").trial_id == "a"
    assert pick(candidates, "cpu2").trial_id == "a"


def test_remaining_times_within_a_tenth_of_the_longest_count_as_tied() -> None:
    candidates = [Candidate("a", 10.0, "cpu1"), Candidate("b", 9.5, "cpu0"), Candidate("c", 9.8, None)]
    assert pick(candidates, "cpu0").trial_id == "b"  # its own trial, 5% shorter than the longest
    assert pick(candidates, "cpu1").trial_id == "a"
    assert pick(candidates, "cpu2").trial_id == "a"  # no affinity: the longest
    assert pick([Candidate("a", 10.0, "cpu1"), Candidate("b", 8.9, "cpu0")], "cpu0").trial_id == "a"


def test_a_device_finishes_the_micro_batch_it_holds_before_the_longest_trial() -> None:
    candidates = [Candidate("a", 10.0, "cpu1"), Candidate("b", 2.0, "cpu0", held_by="cpu0")]
    assert pick(candidates, "cpu0").trial_id == "b"


def test_other_devices_pass_over_a_held_trial_even_if_that_leaves_them_idle() -> None:
    held = Candidate("a", 10.0, "cpu0", held_by="cpu0")
    assert pick([held, Candidate("b", 2.0, "cpu1")], "cpu1").trial_id == "b"
    assert pick([held], "cpu1") is None
    assert pick([held], "cpu0") == held


X0, X1, X2 = (BaseShard("X", i, i + 1) for i in range(3))


def test_on_a_tie_it_prefers_the_trial_whose_next_unit_reads_the_base_layers_the_device_holds() -> None:
    candidates = [Candidate("a", 4.0, "cpu0", next_base=X1), Candidate("b", 4.0, "cpu1", next_base=X0),
                  Candidate("c", 4.0, None)]
    assert pick(candidates, "cpu0", holding=X0).trial_id == "b"  # beats the trial cpu0 last ran
    assert pick(candidates, "cpu0", holding=X2).trial_id == "a"  # nothing held matches: last device
    assert pick(candidates, "cpu0").trial_id == "a"
    assert pick(candidates, "cpu2", holding=BaseShard("Y", 0, 1)).trial_id == "a"  # another base: by id


def test_base_affinity_counts_overlapping_layers_and_only_among_tied_trials() -> None:
    # Two trials on one base whose plans cut it differently still share the layers both shards hold.
    assert X1.overlaps(BaseShard("X", 0, 3)) and not X1.overlaps(X2) and not X1.overlaps(BaseShard("Y", 1, 2))
    candidates = [Candidate("a", 10.0), Candidate("b", 9.5, next_base=BaseShard("X", 0, 3))]
    assert pick(candidates, "cpu0", holding=X1).trial_id == "b"
    assert pick([Candidate("a", 10.0), Candidate("b", 8.9, next_base=X1)], "cpu0", holding=X1).trial_id == "a"


def test_base_shards_round_trip_through_the_queue_s_text() -> None:
    shard = BaseShard("3f2a" * 8, 4, 9)
    assert BaseShard.parse(str(shard)) == shard
    assert BaseShard.parse("") is None


def test_it_picks_nothing_from_nothing() -> None:
    assert pick([], "cpu0") is None


def test_it_smooths_unit_times_towards_measurements() -> None:
    assert unit_time_estimate(1.0, 2.0) == pytest.approx(1.2)


def test_it_interleaves_homogeneous_trials_on_two_devices() -> None:
    trials = [TrialLoad("A", 3, 1.0), TrialLoad("B", 3, 1.0), TrialLoad("C", 3, 1.0)]
    # The timetable drawn in policy.py's docstring.
    assert slots(trials, DEVICES) == [
        ("cpu0", "A", 0, 0.0, 1.0),
        ("cpu1", "B", 0, 0.0, 1.0),
        ("cpu0", "C", 0, 1.0, 2.0),
        ("cpu1", "B", 1, 1.0, 2.0),
        ("cpu0", "A", 1, 2.0, 3.0),
        ("cpu1", "C", 1, 2.0, 3.0),
        ("cpu0", "A", 2, 3.0, 4.0),
        ("cpu1", "B", 2, 3.0, 4.0),
        ("cpu0", "C", 2, 4.0, 5.0),
    ]


def test_it_runs_the_longest_trial_first_with_heterogeneous_lengths() -> None:
    # A: 4 s in 1 s units, B: 3 s in 1.5 s units, C: one 2 s unit.
    trials = [TrialLoad("A", 4, 1.0), TrialLoad("B", 2, 1.5), TrialLoad("C", 1, 2.0)]
    assert slots(trials, DEVICES) == [
        ("cpu0", "A", 0, 0.0, 1.0),
        ("cpu1", "B", 0, 0.0, 1.5),
        ("cpu0", "A", 1, 1.0, 2.0),
        ("cpu1", "C", 0, 1.5, 3.5),  # A is in flight; C (2 s) outranks B (1.5 s)
        ("cpu0", "A", 2, 2.0, 3.0),
        ("cpu0", "B", 1, 3.0, 4.5),  # B (1.5 s) now outranks A (1 s)
        ("cpu1", "A", 3, 3.5, 4.5),
    ]


def test_it_keeps_two_devices_busy_with_more_trials_than_devices() -> None:
    trials = [TrialLoad(name, 2, 1.0) for name in "ABCD"]
    assert slots(trials, DEVICES) == [
        ("cpu0", "A", 0, 0.0, 1.0),
        ("cpu1", "B", 0, 0.0, 1.0),
        ("cpu0", "C", 0, 1.0, 2.0),
        ("cpu1", "D", 0, 1.0, 2.0),
        ("cpu0", "A", 1, 2.0, 3.0),
        ("cpu1", "B", 1, 2.0, 3.0),
        ("cpu0", "C", 1, 3.0, 4.0),
        ("cpu1", "D", 1, 3.0, 4.0),
    ]


def test_it_runs_one_unit_of_a_trial_at_a_time_with_fewer_trials_than_devices() -> None:
    trials = [TrialLoad("A", 3, 1.0), TrialLoad("B", 1, 1.0)]
    assert slots(trials, ["cpu0", "cpu1", "cpu2"]) == [
        ("cpu0", "A", 0, 0.0, 1.0),
        ("cpu1", "B", 0, 0.0, 1.0),
        ("cpu0", "A", 1, 1.0, 2.0),  # cpu2 waited for A's unit to end; cpu0 claims first and keeps A
        ("cpu0", "A", 2, 2.0, 3.0),
    ]


def test_it_yields_slots() -> None:
    assert next(timetable([TrialLoad("A", 1, 0.5)], ["cuda0"])) == Slot("cuda0", "A", 0, 0.0, 0.5)


def test_it_needs_a_device() -> None:
    with pytest.raises(ValueError, match="at least one device"):
        list(timetable([TrialLoad("A", 1, 1.0)], []))


def test_lora_trials_on_one_base_follow_each_other_through_its_shards() -> None:
    # The timetable drawn in policy.py's docstring: C follows A through X0, X1, X0 and reads none of them.
    trials = [TrialLoad("A", 3, 1.0, (X0, X1, X0)), TrialLoad("B", 3, 1.0), TrialLoad("C", 3, 1.0, (X0, X1, X0))]
    order = [(s.trial_id, s.unit, s.start, s.base_held) for s in timetable(trials, ["cpu0"])]
    assert order == [
        ("A", 0, 0.0, False), ("C", 0, 1.0, True), ("B", 0, 2.0, False),
        ("A", 1, 3.0, False), ("C", 1, 4.0, True), ("B", 1, 5.0, False),
        ("A", 2, 6.0, False), ("C", 2, 7.0, True), ("B", 2, 8.0, False),
    ]
    # Without a shared base the same trials run by id, as Sharded-LRTF always did.
    plain = [TrialLoad(t.trial_id, t.units, t.unit_s) for t in trials]
    assert [s.trial_id for s in timetable(plain, ["cpu0"])][:3] == ["A", "B", "C"]


def test_four_lora_trials_on_two_devices_read_each_base_shard_once_per_pair() -> None:
    # Three shards: a micro-batch reads X0, X1, X2 (forward and backward), X1, X0.
    trials = [TrialLoad(name, 5, 1.0, (X0, X1, X2, X1, X0)) for name in "ABCD"]
    got = [(s.device, s.trial_id, s.unit, s.start, s.base_held) for s in timetable(trials, DEVICES)]
    expected = []
    for unit in range(5):
        expected += [("cpu0", "A", unit, 2.0 * unit, False), ("cpu1", "B", unit, 2.0 * unit, False),
                     ("cpu0", "C", unit, 2.0 * unit + 1, True), ("cpu1", "D", unit, 2.0 * unit + 1, True)]
    assert sorted(got, key=lambda g: (g[3], g[0])) == expected
    assert max(s.end for s in timetable(trials, DEVICES)) == 10.0  # no unit waits for the affinity


def teams(trials: list[TrialLoad], devices: list[str], weights: dict[str, float]) -> str:
    return "".join(s.trial_id for s in timetable(trials, devices, weights))


def test_two_teams_of_equal_weight_take_turns_from_the_late_one_s_arrival() -> None:
    # The timetable drawn in fair_share.py's docstring: B arrives at 0.5 at A's usage and, never served, goes
    # first on the tie; turns alternate while both have work.
    trials = [TrialLoad("a", 6, 1.0, team="A"), TrialLoad("b", 3, 1.0, team="B", arrival=0.5)]
    assert [(s.start, s.trial_id) for s in timetable(trials, ["cpu0"], {})] == [
        (0.0, "a"), (1.0, "b"), (2.0, "a"), (3.0, "b"), (4.0, "a"), (5.0, "b"), (6.0, "a"), (7.0, "a"), (8.0, "a")]
    # Without shares (one team's queue, as before) the longer trial goes first and B waits behind it.
    assert [s.trial_id for s in timetable(trials, ["cpu0"])][:5] == ["a", "a", "a", "a", "b"]


def test_weights_divide_device_time_between_three_teams() -> None:
    trials = [TrialLoad(name, 9, 1.0, team=name.upper()) for name in "abc"]
    order = teams(trials, ["cpu0"], {"A": 2, "B": 1, "C": 1})
    assert order == "abcabcaabcaabcaabcabcbcbcbc"
    # While all three have work (the first 18 units), A gets half the device and B and C a quarter each.
    assert [order[:16].count(t) for t in "abc"] == [8, 4, 4]
    assert teams([TrialLoad("a", 8, 1.0, team="A"), TrialLoad("b", 8, 1.0, team="B")], ["cpu0"],
                 {"A": 3, "B": 1}) == "abaabaaabaabbbbb"


def test_a_team_arriving_late_with_short_trials_starts_at_the_next_boundary_on_two_devices() -> None:
    long = [TrialLoad(f"a{i}", 6, 1.0, team="A") for i in range(4)]
    short = [TrialLoad(f"b{i}", 2, 1.0, team="B", arrival=2.5) for i in range(2)]
    slots = list(timetable(long + short, DEVICES, {}))
    first_b = min(s.start for s in slots if s.trial_id.startswith("b"))
    assert first_b == 3.0  # the first unit boundary after its arrival
    during = [s for s in slots if 3.0 <= s.start < 7.0]  # while both teams have work
    assert sum(s.trial_id.startswith("b") for s in during) == 4 and len(during) == 8


def test_priority_orders_trials_inside_a_team_before_remaining_time() -> None:
    trials = [TrialLoad("a", 3, 1.0, team="A"), TrialLoad("h", 2, 1.0, team="A", priority=2),
              TrialLoad("l", 4, 1.0, team="A", priority=0)]
    assert teams(trials, ["cpu0"], {}) == "hhaaallll"
    # Priorities order a team's own trials only: another team's low-priority trial still gets its turns.
    other = [TrialLoad("h", 4, 1.0, team="A", priority=2), TrialLoad("l", 4, 1.0, team="B", priority=0)]
    assert teams(other, ["cpu0"], {}) == "hlhlhlhl"


def test_no_team_starves_whatever_the_weights() -> None:
    trials = [TrialLoad("a", 40, 1.0, team="A"), TrialLoad("b", 10, 1.0, team="B")]
    order = teams(trials, ["cpu0"], {"A": 3, "B": 1})
    gaps = [len(run) for run in order[: order.rindex("b")].split("b") if run]
    assert max(gaps) <= 3  # B waits at most its weight's share of turns
    assert order.count("b") == 10
    assert teams([TrialLoad("a", 20, 1.0, team="A"), TrialLoad("b", 2, 1.0, team="B", arrival=3)], ["cpu0"],
                 {"A": 100, "B": 1}) == "aaab" + "a" * 17 + "b"  # a hundredth of the time is still a share


def test_fair_share_rules() -> None:
    assert team_turn(["B", "A"], {"A": 2.0, "B": 1.0}, {"A": 2.0}) == "A"  # 1.0 per weight ties 1.0; name
    assert team_turn(["B", "A"], {"A": 2.0, "B": 1.0}, {"A": 2.0}, served={"A": 5.0, "B": 3.0}) == "B"
    assert team_turn([], {}, {}) is None
    assert arrival_usage("B", {"A": 6.0, "C": 4.0}, {"C": 2.0, "B": 3.0}, ["A", "C"]) == 6.0  # C: 2 per weight
    assert arrival_usage("B", {"A": 6.0, "B": 30.0}, {}, ["A"]) == 30.0  # pausing does not reset usage
    assert decayed(8.0, 7200.0) == 2.0 and decayed(8.0, -5.0) == 8.0


# Wavefronts: a trial on several devices ------------------------------------------------------------------


def lanes(trials: list[TrialLoad], devices: list[str]) -> list[tuple[str, str, int, int, float]]:
    return [(s.device, s.trial_id, s.lane, s.unit, s.start) for s in timetable(trials, devices)]


WAVE = TrialLoad("a", 6, 1.0, segments=((2, 3),))  # one step of 2 micro-batches, 3 units each


def test_a_lone_trial_widens_onto_the_idle_device_as_its_docstring_draws() -> None:
    assert lanes([WAVE], DEVICES) == [
        ("cpu0", "a", 0, 0, 0.0),
        ("cpu0", "a", 0, 1, 1.0), ("cpu1", "a", 1, 3, 1.0),  # micro-batch 1 starts after 0's first unit
        ("cpu0", "a", 0, 2, 2.0), ("cpu1", "a", 1, 4, 2.0),
        ("cpu0", "a", 1, 5, 3.0),  # cpu1 waits: unit 5 needs unit 4
    ]


def test_a_step_of_one_shard_runs_its_first_micro_batch_alone_its_last_after_all_and_the_rest_side_by_side() -> None:
    gathered = TrialLoad("a", 12, 1.0, segments=((6, 1, True), (6, 1, True)))  # two steps of 6 micro-batches
    assert lanes([gathered], DEVICES) == [
        ("cpu0", "a", 0, 0, 0.0),
        ("cpu0", "a", 1, 1, 1.0), ("cpu1", "a", 2, 2, 1.0),
        ("cpu0", "a", 3, 3, 2.0), ("cpu1", "a", 4, 4, 2.0),
        ("cpu0", "a", 5, 5, 3.0),  # the last micro-batch, after every other; cpu1 waits for the next step
        ("cpu0", "a", 0, 6, 4.0),
        ("cpu0", "a", 1, 7, 5.0), ("cpu1", "a", 2, 8, 5.0),
        ("cpu0", "a", 3, 9, 6.0), ("cpu1", "a", 4, 10, 6.0),
        ("cpu0", "a", 5, 11, 7.0),
    ]


def test_a_step_of_one_shard_with_its_own_step_unit_runs_every_micro_batch_side_by_side() -> None:
    """A step of 4 micro-batches, then its S unit (which finishes the sum and applies the update), twice: the
    micro-batches need nothing of each other, so both devices run two each, and the S unit runs alone."""
    stepped = TrialLoad("a", 10, 1.0, segments=((4, 1, True, False, False), (1, 1), (4, 1, True, False, False),
                                                (1, 1)))
    assert lanes([stepped], DEVICES) == [
        ("cpu0", "a", 0, 0, 0.0), ("cpu1", "a", 1, 1, 0.0),
        ("cpu0", "a", 2, 2, 1.0), ("cpu1", "a", 3, 3, 1.0),
        ("cpu0", "a", 0, 4, 2.0),  # the S unit
        ("cpu0", "a", 0, 5, 3.0), ("cpu1", "a", 1, 6, 3.0),
        ("cpu0", "a", 2, 7, 4.0), ("cpu1", "a", 3, 8, 4.0),
        ("cpu0", "a", 0, 9, 5.0),
    ]


def test_a_widened_trial_gives_the_device_back_when_another_trial_can_run() -> None:
    b = TrialLoad("b", 3, 1.0, arrival=1.0)
    assert lanes([WAVE, b], DEVICES) == [
        ("cpu0", "a", 0, 0, 0.0),
        ("cpu0", "a", 0, 1, 1.0), ("cpu1", "b", 0, 0, 1.0),  # a could widen, but b has no unit in flight
        ("cpu0", "a", 1, 3, 2.0), ("cpu1", "b", 0, 1, 2.0),  # lane 1 has the longer chain left (3 units to 2)
        ("cpu0", "a", 0, 2, 3.0), ("cpu1", "b", 0, 2, 3.0),
        ("cpu0", "a", 1, 4, 4.0),
        ("cpu0", "a", 1, 5, 5.0),
    ]


def test_the_lane_with_the_longest_chain_left_goes_first_so_that_no_lane_ends_the_step_alone() -> None:
    """Three micro-batches of 5 units on 2 devices. Taking the most advanced lane would run lanes 0 and 1 to their
    ends side by side and leave lane 2's five units to one device (the step ends at 10); in critical-path order
    lane 2 starts as soon as it can and the step ends at 9, with both devices busy until 7."""
    three = TrialLoad("a", 15, 1.0, segments=((3, 5),))
    assert lanes([three], DEVICES) == [
        ("cpu0", "a", 0, 0, 0.0),
        ("cpu0", "a", 0, 1, 1.0), ("cpu1", "a", 1, 5, 1.0),
        ("cpu0", "a", 0, 2, 2.0), ("cpu1", "a", 1, 6, 2.0),
        ("cpu0", "a", 2, 10, 3.0), ("cpu1", "a", 0, 3, 3.0),  # lane 2 (5 units to follow) before lane 0 (2)
        ("cpu0", "a", 1, 7, 4.0), ("cpu1", "a", 2, 11, 4.0),
        ("cpu0", "a", 0, 4, 5.0), ("cpu1", "a", 1, 8, 5.0),
        ("cpu0", "a", 2, 12, 6.0), ("cpu1", "a", 1, 9, 6.0),
        ("cpu0", "a", 2, 13, 7.0),
        ("cpu0", "a", 2, 14, 8.0),
    ]


def test_a_trial_never_runs_on_more_devices_than_its_width_or_its_micro_batches() -> None:
    narrow = TrialLoad("a", 6, 1.0, segments=((2, 3),), width=1)
    assert {s.device for s in timetable([narrow], DEVICES)} == {"cpu0"}
    four = TrialLoad("a", 8, 1.0, segments=((2, 4),))
    most = max(sum(1 for s in timetable([four], ["cpu0", "cpu1", "cpu2"]) if s.start <= t < s.end) for t in range(8))
    assert most == 2


@pytest.mark.parametrize(("y_weight", "cpu0_from_clock_2"), [(1.0, "yxxxx"), (3.0, "yyyyx")])
def test_every_unit_of_a_widened_trial_is_charged_to_its_team(y_weight: float, cpu0_from_clock_2: str) -> None:
    """Team x's lone trial takes both devices until y arrives at clock 2, having used 3 device seconds (its second
    device's unit counts): y arrives at that usage, goes first (never served), and from then on fair share
    decides at every unit boundary; x widens onto whatever device y leaves."""
    x = TrialLoad("x", 8, 1.0, segments=((2, 4),), team="x")
    y = TrialLoad("y", 4, 1.0, team="y", arrival=2.0)
    got = [(s.device, s.trial_id, s.start) for s in timetable([x, y], DEVICES, weights={"x": 1.0, "y": y_weight})]
    assert got[:3] == [("cpu0", "x", 0.0), ("cpu0", "x", 1.0), ("cpu1", "x", 1.0)]
    assert "".join(trial for device, trial, start in got if device == "cpu0" and start >= 2.0) == cpu0_from_clock_2
    assert max(end for end in (s.end for s in timetable([x, y], DEVICES))) == 7.0  # 12 units on 2 devices: 6, +1 wait
