"""The §5.5 placement rule: properties that hold for any trial widths."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planners.placement import nodes_needed, place

widths = st.lists(st.sampled_from([0.25, 0.5, 1, 2, 3, 4, 8, 12]), max_size=30)
per_node = st.sampled_from([1, 2, 4, 8])


@given(widths, per_node)
def test_every_trial_placed_and_no_node_overfull(gpus, gpus_per_node):
    nodes = place(gpus, gpus_per_node)
    placed = sorted({i for node in nodes for i in node})
    assert placed == list(range(len(gpus)))
    for node in nodes:
        load = sum(min(gpus[i], gpus_per_node) for i in node)
        assert load <= gpus_per_node + 1e-9


@given(widths, per_node)
def test_wide_trials_take_whole_nodes_of_their_own(gpus, gpus_per_node):
    nodes = place(gpus, gpus_per_node)
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


def test_best_fit_keeps_a_trial_on_the_tightest_node():
    # Largest first: 3 opens node A (1 free), 2 opens node B (2 free); the 1 fills A exactly.
    assert place([3, 2, 1], gpus_per_node=4) == [(0, 2), (1,)]


@pytest.mark.parametrize(("gpus", "per_node"), [([0], 4), ([-1], 4), ([1], 0)])
def test_bad_input_names_the_value(gpus, per_node):
    with pytest.raises(ValueError, match="must be"):
        place(gpus, per_node)
