"""A warm pool's placer (a segment goes, best fit, to a live node with room for its GPUs,
else to the queue of one), its relaunches (a segment whose node died is launched again,
at most twice), and a node's gate (a queued segment trains once its GPUs are free)."""

from __future__ import annotations

import threading

import pytest

from elastune.flows.segment import GpuGate, WorkerLost
from elastune.flows.warm_pool import Placement, Placer, relaunched
from elastune.infra.warm_nodes import Node


@pytest.fixture
def placer(monkeypatch) -> Placer:
    """Two live nodes: ``big`` of 2 GPUs and ``small`` of 1."""
    nodes = [Node("big", 2.0, 101), Node("small", 1.0, 102)]
    monkeypatch.setattr("elastune.flows.warm_pool.live_nodes", lambda pool: nodes)
    monkeypatch.setattr("elastune.flows.warm_pool.draining_nodes", lambda pool: set())
    monkeypatch.setattr("elastune.flows.warm_pool.POLL_SECONDS", 0.01)
    return Placer("warm")


def test_segments_fill_the_tightest_node_first_then_queue_behind(placer) -> None:
    taken = [placer.take(1.0, timeout=0) for _ in range(6)]
    # Room to train first, tightest node first; then queued, as many GPUs' worth again.
    assert taken == [
        Placement("small", False),
        Placement("big", False),
        Placement("big", False),
        Placement("small", True),
        Placement("big", True),
        Placement("big", True),
    ]
    with pytest.raises(WorkerLost, match="no live node of warm pool 'warm' had 1 free GPUs"):
        placer.take(1.0, timeout=0.05)
    placer.give("small", 1.0)  # the queued one on small now trains: its queue has room
    assert placer.take(0.5, timeout=0) == Placement("small", True)


def test_a_free_node_trains_before_a_busy_one_queues(placer) -> None:
    assert placer.take(1.0, timeout=0) == Placement("small", False)
    assert placer.take(1.0, timeout=0) == Placement("big", False)
    # small's queue is the tighter fit, but big still has a free GPU.
    assert placer.take(1.0, timeout=0) == Placement("big", False)


def test_a_segment_wider_than_any_free_node_queues_then_waits(placer) -> None:
    assert placer.take(2.0, timeout=0) == Placement("big", False)
    assert placer.take(2.0, timeout=0) == Placement("big", True)
    with pytest.raises(WorkerLost):
        placer.take(2.0, timeout=0.05)
    placer.give("big", 2.0)
    assert placer.take(2.0, timeout=0) == Placement("big", True)


def test_a_segment_is_launched_again_while_its_node_dies(monkeypatch) -> None:
    monkeypatch.setattr("elastune.flows.warm_pool.time.sleep", lambda seconds: None)
    attempts: list[int] = []

    def launch(attempt: int) -> str:
        attempts.append(attempt)
        if attempt < 3:
            raise WorkerLost(f"node died under launch {attempt}")
        return "report"

    given_up: list[int] = []

    def nothing_saved() -> None:
        given_up.append(len(attempts))  # the launch given up on is fenced off here

    assert relaunched(None, "job", launch, nothing_saved) == "report" and attempts == [1, 2, 3]
    assert given_up == [1, 2]

    def always_lost(attempt: int) -> str:
        raise WorkerLost(f"node died under launch {attempt}")

    with pytest.raises(WorkerLost, match="launch 3"):
        relaunched(None, "job", always_lost, nothing_saved)
    # A segment whose report was saved before its node went had finished: not run again.
    attempts.clear()
    assert relaunched(None, "job", launch, lambda: "saved") == "saved" and attempts == [1]


def test_a_queued_segment_trains_once_the_gpus_it_needs_are_free() -> None:
    gate = GpuGate(1.0)
    with gate.held(0.1), gate.held(0.2):
        pass  # 1.0 - 0.1 - 0.2 + 0.2 + 0.1 is not 1.0 in floats: a whole GPU must still fit
    trained = threading.Event()

    def queued() -> None:
        with gate.held(1.0):
            trained.set()

    with gate.held(0.5):
        waiter = threading.Thread(target=queued, daemon=True)
        waiter.start()
        assert not trained.wait(0.2)  # half the GPU is held: the segment waits
    assert trained.wait(2.0)
    waiter.join(2.0)
    assert gate.free == pytest.approx(1.0)


def test_a_segment_launch_ships_none_of_the_drivers_settings(monkeypatch) -> None:
    """A delayed run's parameters are stored where every host reads them: they carry no
    settings (a node runs under its own), so none of the driver's secrets, while the
    driver's own client keeps its credentials."""
    import contextvars
    import json
    from types import SimpleNamespace
    from uuid import uuid4

    from prefect.context import serialize_context
    from prefect.settings import PREFECT_API_AUTH_STRING, get_current_settings, temporary_settings

    from elastune.flows.warm_pool import detached_delay

    shipped: dict = {}

    class Send:
        def delay(self, *arguments):
            shipped.update(serialize_context())
            shipped["driver's own"] = get_current_settings().api.auth_string.get_secret_value()
            return SimpleNamespace(task_run_id=uuid4())

    with temporary_settings({PREFECT_API_AUTH_STRING: "elastune:planted-secret-0042"}):
        assert "planted-secret-0042" in json.dumps(serialize_context(), default=str)  # by default
        contextvars.copy_context().run(detached_delay, Send(), ())
    assert shipped.pop("driver's own") == "elastune:planted-secret-0042"
    assert shipped["settings_context"] == {}
    assert "planted-secret-0042" not in json.dumps(shipped, default=str)


def test_a_run_is_watched_on_the_incarnations_that_beat_before_it_ran() -> None:
    """A node restarted before the driver first saw its run running: the new incarnation,
    which never runs it, does not keep the driver waiting on the run."""
    from datetime import UTC, datetime, timedelta

    from prefect.states import Running

    from elastune.flows.warm_pool import holding_it

    running = Running()
    old = Node("node-0", 1.0, 11, running.timestamp - timedelta(seconds=30))
    new = Node("node-0", 1.0, 12, running.timestamp + timedelta(seconds=4))
    now = running.timestamp + timedelta(seconds=5)
    assert holding_it([old, new], running, now) == {11}
    assert holding_it([new], running, now) == set()  # the old one died: nobody runs it
    assert holding_it([Node("node-0", 1.0, 13)], running, now) == {13}  # its start unknown
    assert old == Node.parse(old.worker_name, datetime.now(UTC))  # an incarnation is its pid


def test_a_run_not_yet_running_is_lost_with_the_incarnation_that_took_it() -> None:
    """A run the server handed to a node that died before running it stays Scheduled
    forever: the node's new incarnation waits for it only while it could still take the
    run from the server's queue."""
    from datetime import timedelta

    from prefect.states import Scheduled

    from elastune.flows.warm_pool import TAKE_SECONDS, holding_it

    waiting = Scheduled()
    sent = waiting.timestamp
    old = Node("node-0", 1.0, 11, sent - timedelta(seconds=30))
    new = Node("node-0", 1.0, 12, sent + timedelta(seconds=2))
    assert holding_it([old, new], waiting, sent + timedelta(seconds=3)) == {11, 12}
    assert holding_it([new], waiting, sent + timedelta(seconds=3)) == {12}  # from the queue
    late = sent + timedelta(seconds=2 + TAKE_SECONDS + 1)
    assert holding_it([new], waiting, late) == set()  # the dead one took it
    assert holding_it([old], waiting, late) == {11}  # the one that took it may yet run it
    assert holding_it([Node("node-0", 1.0, 13)], waiting, late) == {13}  # its start unknown
