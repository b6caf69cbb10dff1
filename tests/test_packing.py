"""Fluid packing (docs/algorithms.md §6): the worked examples, validation, and the 2x property."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastune.planners.staging import (
    Assignment,
    DynamicFluid,
    Packer,
    Profile,
    Schedule,
    StaticFluid,
    Work,
)
from elastune.planners.staging.fluid import fifo_makespan

SUBLINEAR = Profile.from_speeds({2: 1.8, 4: 3.2})
HOUR = 3600.0


def group_of(heights: list[float], seconds_per_unit: float = 1.0) -> list[Work]:
    return [Work(t, h, seconds_per_unit) for t, h in enumerate(heights)]


def check_valid(packer: Packer, group: list[Work], schedule: Schedule) -> None:
    """Every trial trains exactly its resource, on one node, and no GPU is over-committed."""
    profile = packer.profile
    work = {x.trial: x for x in group}
    trained: dict[int, float] = defaultdict(float)
    for p in schedule.rectangles:
        assert {g // packer.gpus_per_node for g in p.gpus} == {p.node}
        assert len(p.gpus) == max(1, int(p.width))
        speed = profile.speed(Fraction(p.width).limit_denominator(1000))
        trained[p.trial] += max(0.0, p.end - p.start - p.overhead) * speed
    for t, x in work.items():
        assert trained[t] / x.seconds_per_unit == pytest.approx(x.resource, rel=1e-6)
    # Sweep every rectangle's start: the GPUs it holds then must have room for it.
    for p in schedule.rectangles:
        if p.end - p.start <= 1e-12:
            continue
        for gpu in p.gpus:
            live = [
                q
                for q in schedule.rectangles
                if gpu in q.gpus and q.start <= p.start < q.end - 1e-9 and q.end - q.start > 1e-12
            ]
            if p.width >= 1:
                assert live == [p]
            else:  # n sharers, each of width 1/c with n <= c
                assert len(live) <= min(round(1 / q.width) for q in live)


# --- §6.3 worked examples -----------------------------------------------------------------


def test_water_filling_gives_widths_proportional_to_work():
    packer = StaticFluid(Profile.linear(4), gpus=8)
    heights = {0: 40.0, 1: 20.0, 2: 10.0, 3: 10.0}
    assert packer.water_fill(heights, 8) == {0: 4, 1: 2, 2: 1, 3: 1}


def test_linear_scaling_finishes_everyone_at_the_area_bound():
    packer = StaticFluid(Profile.linear(4), gpus=8)
    group = group_of([40, 20, 10, 10], 60.0)
    schedule = packer.pack(group)
    check_valid(packer, group, schedule)
    assert schedule.widths == {0: 4, 1: 2, 2: 1, 3: 1}
    assert {p.end for p in schedule.rectangles} == {600.0}
    assert schedule.lower_bound == 600.0


def test_sublinear_scaling_is_optimal_at_12_5_minutes():
    packer = StaticFluid(SUBLINEAR, gpus=8, max_width=4)
    group = group_of([40, 20, 10, 10], 60.0)
    schedule = packer.pack(group)
    check_valid(packer, group, schedule)
    ends = sorted((p.trial, round(p.end / 60, 1)) for p in schedule.rectangles)
    assert ends == [(0, 12.5), (1, 11.1), (2, 10.0), (3, 10.0)]
    assert schedule.makespan == pytest.approx(12.5 * 60)
    assert schedule.lower_bound == pytest.approx(max(80 / 8, 40 / 3.2) * 60)


def test_fifo_leaves_half_the_pool_idle():
    group = group_of([40, 20, 10, 10], 60.0)
    makespan = fifo_makespan(group, 8)
    assert makespan == 40 * 60
    assert sum(x.seconds for x in group) / (8 * makespan) == 0.25


def test_multiplexing_runs_eight_trials_at_once_on_four_gpus():
    group = group_of([1] * 8, HOUR)
    alone = StaticFluid(Profile.from_speeds(), gpus=4).pack(group)
    shared_packer = StaticFluid(Profile.from_speeds(sharing={2: 0.85}), gpus=4, max_share=2)
    shared = shared_packer.pack(group)
    check_valid(shared_packer, group, shared)
    assert alone.makespan == 2 * HOUR
    assert shared.makespan == pytest.approx(HOUR / 0.85)
    assert set(shared.widths.values()) == {0.5}
    assert {p.start for p in shared.rectangles} == {0.0}
    assert shared.makespan == pytest.approx(shared.lower_bound)


def test_sharing_that_does_not_pay_is_never_chosen():
    packer = StaticFluid(Profile.from_speeds(sharing={2: 0.4}), gpus=4, max_share=2)
    assert Fraction(1, 2) not in packer.widths
    assert set(packer.pack(group_of([1] * 8, HOUR)).widths.values()) == {1.0}


# --- §6.4 worked examples -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "static_hours", "dynamic_hours"),
    [(Profile.linear(4), 6.0, 5.0), (SUBLINEAR, 12 / 1.8, 5.5)],
)
def test_dynamic_refill_widens_the_survivor(profile, static_hours, dynamic_hours):
    group = group_of([12, 4, 4], HOUR)
    section_6_3 = {0: 2, 1: 1, 2: 1}
    static_packer = StaticFluid(profile, gpus=4)
    assert static_packer.water_fill({x.trial: x.seconds for x in group}, 4) == section_6_3
    fixed = static_packer.pack(group, widths=section_6_3)
    dynamic_packer = DynamicFluid(profile, gpus=4)
    dynamic = dynamic_packer.pack(group)
    check_valid(dynamic_packer, group, dynamic)
    assert fixed.makespan == pytest.approx(static_hours * HOUR)
    assert dynamic.makespan == pytest.approx(dynamic_hours * HOUR)
    assert dynamic.widths[0] == 4


def test_static_keeps_the_shorter_of_the_two_allotments():
    # §6.3 gives the tall trial 4 GPUs (share 7.06, rounded down) and the small ones 1 each,
    # 12 GPUs on a pool of 8; the level allotment runs it on all 8 first: 7.5 + 1 = LB.
    group = group_of([60] + [1] * 8)
    packer = StaticFluid(Profile.linear(8), gpus=8)
    section_6_3 = packer.water_fill({x.trial: x.seconds for x in group}, 8)
    assert section_6_3 == {0: 4} | {t: 1 for t in range(1, 9)}
    assert packer.pack(group, widths=section_6_3).makespan == 15.0
    schedule = packer.pack(group)
    check_valid(packer, group, schedule)
    assert schedule.widths[0] == 8
    assert schedule.makespan == schedule.lower_bound == 8.5


def test_linear_dynamic_example_meets_the_lower_bound():
    group = group_of([12, 4, 4], HOUR)
    schedule = DynamicFluid(Profile.linear(4), gpus=4).pack(group)
    assert schedule.makespan == pytest.approx(schedule.lower_bound)


def test_rescale_happens_only_when_it_saves_more_than_it_costs():
    group = group_of([12, 4, 4], HOUR)
    # Widening at t=4 h saves 2.67 - 1.5 = 1.17 h of trial 0's time.
    cheap = DynamicFluid(Profile.from_speeds({2: 1.8, 4: 3.2}, overhead_s=HOUR), gpus=4)
    dear = DynamicFluid(Profile.from_speeds({2: 1.8, 4: 3.2}, overhead_s=1.2 * HOUR), gpus=4)
    cheap, dear = cheap.pack(group), dear.pack(group)
    assert cheap.widths[0] == 4 and cheap.makespan == pytest.approx(6.5 * HOUR)
    assert dear.widths[0] == 2 and dear.makespan == pytest.approx(12 / 1.8 * HOUR)


def test_event_interface_returns_assignment_changes():
    packer = DynamicFluid(SUBLINEAR, gpus=4)
    started = packer.submit(group_of([12, 4, 4], HOUR), now=0.0)
    assert started == {
        0: Assignment(2.0, 0, (0, 1)),
        1: Assignment(1.0, 0, (2,)),
        2: Assignment(1.0, 0, (3,)),
    }
    assert packer.on_segment_done(1, now=4 * HOUR) == {}  # 1 GPU free: too little to widen
    assert packer.on_segment_done(2, now=4 * HOUR) == {0: Assignment(4.0, 0, (0, 1, 2, 3))}


def test_pool_shrink_requeues_and_growth_restarts():
    packer = DynamicFluid(Profile.linear(4), gpus=8, gpus_per_node=4)
    started = packer.submit(group_of([16, 16], HOUR), now=0.0)  # 4 h each on 4 GPUs
    assert {t: a.width for t, a in started.items()} == {0: 4, 1: 4}
    on_second_node = next(t for t, a in started.items() if a.node == 1)
    changes = packer.on_pool_change(4, now=HOUR)
    assert changes == {on_second_node: None}
    regrown = packer.on_pool_change(8, now=2 * HOUR)
    assert regrown[on_second_node].node == 1 and regrown[on_second_node].width == 4


def test_a_later_group_gets_only_what_the_first_leaves():
    packer = DynamicFluid(Profile.linear(4), gpus=8)
    first = packer.submit(group_of([8]), now=0.0)
    second = packer.submit([Work(10, 1, 1.0), Work(11, 1, 1.0)], now=0.0)
    assert first == {0: Assignment(4.0, 0, (0, 1, 2, 3))}
    assert sum(a.width for a in second.values()) == 4


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": 8, "max_width": 8}, "max_width 8 is not covered by the profile"),
        ({"gpus": 2, "max_width": 4}, "max_width 4 is more GPUs than the pool has (2)"),
        ({"gpus": 8, "gpus_per_node": 2, "max_width": 4}, "max_width 4 is more GPUs than a node"),
        ({"gpus": 4, "max_share": 3}, "max_share 3 is not covered by the profile"),
        ({"gpus": 0}, "gpus must be an integer >= 1, got 0"),
    ],
)
def test_constructor_names_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StaticFluid(Profile.linear(4), **kwargs)


@pytest.mark.parametrize(
    ("width", "message"),
    [
        (3, "width 3 of trial 0 is not covered by the profile"),
        (16, r"width 16 of trial 0 is more GPUs than the pool has \(8\)"),
        (8, r"width 8 of trial 0 is more GPUs than a node has \(4\)"),
    ],
)
def test_fixed_widths_are_validated(width, message):
    packer = StaticFluid(Profile.linear(8), gpus=8, gpus_per_node=4)
    with pytest.raises(ValueError, match=message):
        packer.pack(group_of([1, 1]), widths={0: width})


def test_fixed_widths_are_kept():
    packer = StaticFluid(Profile.linear(4), gpus=8)
    assert packer.pack(group_of([8, 1]), widths={0: 1, 1: 2}).widths == {0: 1, 1: 2}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Profile.from_speeds({2: 0.0}), r"speedup S\(2\) must be > 0, got 0.0"),
        (lambda: Profile.from_speeds(sharing={2: 1.5}), r"sharing sigma\(2\) must lie in"),
        (
            lambda: Profile.from_speeds(sharing={2: 0.6, 3: 0.7}),
            r"sigma\(3\) must lie in \(0, 0.6\]",
        ),
        (lambda: Work(0, 0, 1.0), "resource of trial 0 must be > 0"),
        (lambda: Work(0, 1, -1.0), "seconds_per_unit of trial 0 must be > 0"),
        (lambda: Work(0, 1, 1.0, -0.5), "overhead of trial 0 must be >= 0, got -0.5"),
    ],
)
def test_model_values_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_events_are_checked():
    packer = DynamicFluid(Profile.from_speeds(), gpus=2)
    packer.submit(group_of([1]), now=5.0)
    with pytest.raises(ValueError, match="trial 0 is already in a group"):
        packer.submit(group_of([1]), now=5.0)
    with pytest.raises(ValueError, match="trial 3 is not running"):
        packer.on_segment_done(3, now=6.0)
    with pytest.raises(ValueError, match="now must not go back in time"):
        packer.on_segment_done(0, now=1.0)


# --- the 2x property ----------------------------------------------------------------------

POOLS = st.sampled_from([(1, 1), (2, 2), (4, 4), (8, 4), (8, 8), (12, 4), (16, 8), (32, 8)])


@st.composite
def sublinear_profiles(draw: st.DrawFn) -> Profile:
    """Diminishing returns: each doubling of the width speeds up by 1x to 2x, and by no more
    than the doubling before it (communication grows with the width). Without the second
    rule ``S = {2: 1, 4: 2}`` makes even the best rigid schedule of 1, 2, 2 on 8 GPUs
    exactly 2x the bound."""
    speedup, s, gain = {}, 1.0, 2.0
    for g in (2, 4, 8):
        gain = draw(st.floats(1.0, gain))
        s *= gain
        speedup[g] = s
    return Profile.from_speeds(speedup)


@settings(max_examples=400, deadline=None)
@given(
    pool=POOLS,
    profile=sublinear_profiles(),
    heights=st.lists(st.floats(0.05, 100.0), min_size=1, max_size=40),
    dynamic=st.booleans(),
)
def test_makespan_is_within_twice_the_lower_bound(pool, profile, heights, dynamic):
    gpus, per_node = pool
    kind = DynamicFluid if dynamic else StaticFluid
    packer = kind(profile, gpus=gpus, gpus_per_node=per_node)
    group = group_of(heights, 7.0)
    schedule = packer.pack(group)
    check_valid(packer, group, schedule)
    assert schedule.lower_bound <= schedule.makespan * (1 + 1e-9)
    # A static packer keeps each trial at one width, and few trials on many GPUs cannot all
    # take their most efficient width: its bound counts the width each needs to end by T.
    bound = (
        schedule.lower_bound
        if dynamic
        else max(schedule.lower_bound, one_width_bound(packer, group))
    )
    assert schedule.makespan <= 2.0 * bound * (1 + 1e-9)


def test_few_equal_trials_on_many_gpus_are_held_to_the_one_width_bound():
    # Found by the property above: 9 equal trials on 32 GPUs. Their least-area width is 1,
    # so the plain bound (9 * 7 / 32 = 1.97 h) assumes 23 GPUs idle trials cannot use; at
    # one width each, 9 trials end no sooner than 3.07 h (width 4, 9 * 4 * 2.73 / 32).
    profile = Profile.from_speeds({2: 1.6, 4: 2.56, 8: 3.584})
    packer = StaticFluid(profile, gpus=32, gpus_per_node=8)
    group = group_of([1.0] * 9, 7.0)
    schedule = packer.pack(group)
    assert schedule.lower_bound == pytest.approx(63 / 32)
    assert one_width_bound(packer, group) == pytest.approx(9 * 4 * 7 / 2.56 / 32)
    assert schedule.makespan <= 2 * one_width_bound(packer, group)


def one_width_bound(packer: Packer, group: list[Work]) -> float:
    """The least ``T`` such that, each trial at the least-area width that ends it by ``T``,
    the group's area fits in ``M * T``: no schedule that keeps each trial at one width
    beats it."""
    widths = packer._placeable()
    heights = {(x.trial, w): packer.height(x, w) for x in group for w in widths}
    levels = sorted(
        {h for h in heights.values()}
        | {max(min(heights[x.trial, w] for w in widths) for x in group)}
    )
    best = float("inf")
    for i, level in enumerate(levels):
        areas = [
            min(
                (float(w) * heights[x.trial, w] for w in widths if heights[x.trial, w] <= level),
                default=float("inf"),
            )
            for x in group
        ]
        t = max(level, sum(areas) / packer.gpus)
        if i + 1 == len(levels) or t < levels[i + 1]:
            best = min(best, t)
    return best


SHARING = st.sampled_from(
    [
        (Profile.from_speeds({2: 1.9, 4: 3.5, 8: 6.0}, sharing={2: 0.85, 4: 0.4}), 4),
        (Profile.from_speeds({2: 1.3, 4: 1.5}, sharing={2: 0.6, 3: 0.45}), 3),
        (Profile.from_speeds(sharing={2: 0.9}), 2),
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    pool=POOLS,
    sharing=SHARING,
    heights=st.lists(st.floats(0.05, 100.0), min_size=1, max_size=40),
    dynamic=st.booleans(),
)
def test_schedules_with_sharing_are_valid(pool, sharing, heights, dynamic):
    gpus, per_node = pool
    profile, share = sharing
    kind = DynamicFluid if dynamic else StaticFluid
    packer = kind(profile, gpus=gpus, gpus_per_node=per_node, max_share=share)
    group = group_of(heights, 7.0)
    schedule = packer.pack(group)
    check_valid(packer, group, schedule)
    assert schedule.lower_bound <= schedule.makespan * (1 + 1e-9)


def test_with_sharing_no_rigid_schedule_meets_twice_the_bound():
    """Why the 2x property is tested without sharing: the bound's area term assumes every
    trial shares a GPU, its height term that the tallest runs wide; both cannot happen.
    Three 1 h trials on 4 GPUs, sharing free: LB = 3 * 0.5 / 4 = 0.375 h, yet every choice
    of widths needs max(area / M, tallest) >= 0.79 h."""
    profile = Profile.from_speeds({2: 1.9, 4: 3.5}, sharing={2: 1.0})
    packer = StaticFluid(profile, gpus=4, max_share=2)
    group = group_of([1.0] * 3)
    best = min(
        max(
            sum(w * packer.height(x, w) for x, w in zip(group, ws, strict=True)) / 4,
            max(packer.height(x, w) for x, w in zip(group, ws, strict=True)),
        )
        for ws in product(packer.widths, repeat=3)
    )
    assert packer.lower_bound(group) == 0.375
    assert best > 2 * packer.lower_bound(group)


def test_docstring_examples_run():
    import doctest

    import elastune.planners.staging.fluid
    import elastune.planners.staging.packing

    assert doctest.testmod(elastune.planners.staging.packing).failed == 0
    assert doctest.testmod(elastune.planners.staging.fluid).failed == 0
