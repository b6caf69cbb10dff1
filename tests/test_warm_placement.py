"""A warm pool's placer: a segment goes, best fit, to a live node with room for its GPUs."""

from __future__ import annotations

import pytest

from flows.pools import Placer
from flows.segment import Node, WorkerLost


@pytest.fixture
def placer(monkeypatch) -> Placer:
    """Two live nodes: ``big`` of 2 GPUs and ``small`` of 1."""
    nodes = [Node("big", 2.0, 101), Node("small", 1.0, 102)]
    monkeypatch.setattr("flows.pools.live_nodes", lambda pool: nodes)
    monkeypatch.setattr("flows.pools.draining_nodes", lambda pool: set())
    monkeypatch.setattr("flows.pools.POLL_SECONDS", 0.01)
    return Placer("warm")


def test_segments_fill_the_tightest_node_first(placer) -> None:
    assert [placer.take(1.0, timeout=0) for _ in range(3)] == ["small", "big", "big"]
    with pytest.raises(WorkerLost, match="no live node of warm pool 'warm' had 1 free GPUs"):
        placer.take(1.0, timeout=0.05)
    placer.give("small", 1.0)
    assert placer.take(0.5, timeout=0) == "small"


def test_a_segment_wider_than_any_free_node_waits(placer) -> None:
    assert placer.take(2.0, timeout=0) == "big"
    with pytest.raises(WorkerLost):
        placer.take(2.0, timeout=0.05)
    placer.give("big", 2.0)
    assert placer.take(2.0, timeout=0) == "big"
