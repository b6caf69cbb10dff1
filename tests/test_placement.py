"""The §5.5 placement rule: properties that hold for any trial widths, and worked cases."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elastune.planners.staging import nodes_needed, place

widths = st.lists(st.sampled_from([0.25, 0.5, 1, 2, 3, 4, 8, 12]), max_size=30)
per_node = st.sampled_from([1, 2, 4, 8])


@given(widths, per_node)
def test_every_trial_placed_and_no_node_overfull(gpus, gpus_per_node):
    placed = place(gpus, gpus_per_node)
    nodes = placed.node_trials
    assert len(nodes) == placed.nodes
    assert sorted({i for node in nodes for i in node}) == list(range(len(gpus)))
    for node in nodes:
        load = sum(min(gpus[i], gpus_per_node) for i in node)
        assert load <= gpus_per_node + 1e-9


@given(widths, per_node)
def test_slots_lie_inside_their_nodes_without_overlap(gpus, gpus_per_node):
    placed = place(gpus, gpus_per_node)
    assert placed.waves <= 1  # no node limit: every trial runs at once, one per slot
    assert sorted(placed.trial_slot) == list(range(len(placed.slots)))
    for i, slot_index in enumerate(placed.trial_slot):
        assert placed.slots[slot_index].gpus == gpus[i]
    taken: dict[int, list[tuple[float, float]]] = {}
    for slot in placed.slots:
        width = slot.gpus if slot.span == 1 else gpus_per_node
        for node in range(slot.node, slot.node + slot.span):
            taken.setdefault(node, []).append((slot.offset, slot.offset + width))
    for spans in taken.values():
        spans.sort()
        assert spans[-1][1] <= gpus_per_node + 1e-9
        assert all(a[1] <= b[0] + 1e-9 for a, b in pairwise(spans))


@given(widths, per_node)
def test_wide_trials_take_whole_nodes_of_their_own(gpus, gpus_per_node):
    nodes = place(gpus, gpus_per_node).node_trials
    for i, g in enumerate(gpus):
        if g > gpus_per_node:
            mine = [node for node in nodes if i in node]
            assert len(mine) == math.ceil(g / gpus_per_node)
            assert all(node == (i,) for node in mine)


@given(widths, per_node)
def test_node_count_between_area_bound_and_one_node_per_trial(gpus, gpus_per_node):
    n = nodes_needed(gpus, gpus_per_node)
    narrow = [g for g in gpus if g <= gpus_per_node]
    wide = sum(math.ceil(g / gpus_per_node) for g in gpus if g > gpus_per_node)
    assert wide + math.ceil(sum(narrow) / gpus_per_node - 1e-9) <= n <= wide + len(narrow)


@given(widths, per_node, st.integers(1, 6))
def test_a_node_limit_is_kept_and_only_queues_trials(gpus, gpus_per_node, limit):
    try:
        placed = place(gpus, gpus_per_node, nodes=limit)
    except ValueError as error:  # a width that got no slot at all within the limit
        assert "later wave" in str(error)
        return
    assert placed.nodes <= limit
    assert all(placed.slots[s].gpus == g for s, g in zip(placed.trial_slot, gpus, strict=True))
    if nodes_needed(gpus, gpus_per_node) <= limit:
        assert placed == place(gpus, gpus_per_node)


def test_best_fit_keeps_a_trial_on_the_tightest_node():
    # Largest first: 3 opens node A (1 free), 2 opens node B (2 free); the 1 fills A exactly.
    assert place([3, 2, 1], gpus_per_node=4).node_trials == ((0, 2), (1,))


def test_placement_co_locates_a_trial_that_fits_one_node():
    placed = place((1.0, 4.0, 2.0, 1.0), 4)
    assert placed.nodes == 2
    by_trial = [placed.slots[s] for s in placed.trial_slot]
    assert by_trial[1].node == 0 and by_trial[1].gpus == 4  # the 4-GPU trial fills a node
    assert {by_trial[i].node for i in (0, 2, 3)} == {1}  # best fit packs the rest together
    assert place((0.5,) * 9, 4).nodes == 2  # GPU shares: 8 trials per 4-GPU node


def test_a_wide_trial_spans_whole_nodes():
    placed = place((8.0, 1.0), 4)
    assert placed.nodes == 3
    assert placed.slots[placed.trial_slot[0]] == placed.slots[0]
    assert (placed.slots[0].node, placed.slots[0].span) == (0, 2)
    assert placed.node_trials == ((0,), (0,), (1,))


def test_waves_on_fewer_nodes_than_the_stage_needs():
    # 5 trials of 2 GPUs on one 4-GPU node: 2 slots; the 3 waiting trials queue on the
    # slot with the fewest trials, so the slots run 3 and 2 trials in turn.
    placed = place((2.0,) * 5, gpus_per_node=4, nodes=1)
    assert placed.nodes == 1 and len(placed.slots) == 2
    assert placed.trial_slot == (0, 1, 0, 1, 0) and placed.waves == 3
    assert placed.gather.sum(axis=0).tolist() == [3.0, 2.0]
    wide = place((8.0, 8.0), gpus_per_node=4, nodes=2)
    assert wide.trial_slot == (0, 0) and wide.waves == 2


def test_no_trials_need_no_nodes():
    assert nodes_needed((), 4) == 0
    assert place((), 4).waves == 0


@pytest.mark.parametrize(
    ("gpus", "per_node", "nodes", "message"),
    [
        ([0], 4, None, r"sizes\[0\] .* must be > 0"),
        ([1, -1], 4, None, r"sizes\[1\] .* must be > 0"),
        ([float("nan")], 4, None, r"sizes\[0\] .* must be > 0"),
        ([1], 0, None, "gpus_per_node must be >= 1, got 0"),
        ([1], 4, 0, "nodes must be >= 1, got 0"),
        ([8], 4, 1, "no slot of 8 GPUs on 1 node"),
        ([2, 1], 2, 1, "no slot of 1 GPUs"),
    ],
)
def test_bad_input_names_the_value(gpus, per_node, nodes, message):
    with pytest.raises(ValueError, match=message):
        place(gpus, per_node, nodes)


def test_docstring_examples_run():
    import doctest

    import elastune.planners.staging.placement

    assert doctest.testmod(elastune.planners.staging.placement).failed == 0
