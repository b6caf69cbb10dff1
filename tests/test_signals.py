"""The driver holds SIGTERM and SIGINT while it writes to its stores and takes them where it
waits (flows/signals.py); an end-to-end stop is tests/test_ephemeral.py's sigterm-group."""

from __future__ import annotations

import itertools
import os
import random
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from elastune.flows.signals import DeferredSignals


class Stopped(Exception):
    pass


@pytest.fixture
def stopping() -> Iterator[list[int]]:
    """SIGTERM raises Stopped (as Prefect's handler raises TerminationSignal)."""
    seen: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        seen.append(signum)
        raise Stopped

    previous = signal.signal(signal.SIGTERM, handler)
    yield seen
    signal.signal(signal.SIGTERM, previous)


def test_a_held_signal_reaches_the_handler_where_the_driver_waits(stopping: list[int]) -> None:
    with DeferredSignals() as signals:
        signal.raise_signal(signal.SIGTERM)
        written = True  # the store write under way ends
        assert stopping == []
        with pytest.raises(Stopped), signals.delivered():
            pytest.fail("the held signal was not delivered on entering the wait")
    assert written and stopping == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) != signals._caught  # the handler is back


def test_a_signal_while_waiting_goes_straight_to_the_handler(stopping: list[int]) -> None:
    waited_on = False
    with pytest.raises(Stopped), DeferredSignals() as signals, signals.delivered():
        signal.raise_signal(signal.SIGTERM)
        waited_on = True
    assert not waited_on and stopping == [signal.SIGTERM]


def test_a_signal_held_at_the_end_is_delivered_then(stopping: list[int]) -> None:
    with pytest.raises(Stopped), DeferredSignals():
        signal.raise_signal(signal.SIGTERM)
    assert stopping == [signal.SIGTERM]


def test_a_second_signal_is_delivered_at_once(stopping: list[int]) -> None:
    """A driver stuck outside its wait still ends."""
    went_on = False
    with pytest.raises(Stopped), DeferredSignals():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        went_on = True
    assert not went_on and stopping == [signal.SIGTERM]


@pytest.fixture
def interrupting() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, as in a command started in the foreground: one
    started in the background by a shell without job control inherits SIGINT ignored, and
    a held SIGINT then goes where the process sent it, nowhere."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("interrupting")
def test_sigint_is_held_too() -> None:
    with pytest.raises(KeyboardInterrupt), DeferredSignals():
        signal.raise_signal(signal.SIGINT)
        held = True
    assert held


def test_outside_the_main_thread_it_does_nothing(stopping: list[int]) -> None:
    installed = []

    def work() -> None:
        with DeferredSignals() as signals, signals.delivered():
            installed.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert installed == [signal.getsignal(signal.SIGTERM)]


def test_a_stop_never_leaves_a_store_locked(tmp_path: Path, stopping: list[int]) -> None:
    """Stops at random moments of a loop of MLflow writes (a driver's, with its wait between
    them) each land between two writes: another thread's write then goes through. Raised
    inside MLflow's SQLAlchemy session, a stop left the SQLite lock held, in 13 of 36 stops
    here, and every later write waited out MLflow's 20 s busy timeout."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("stops")
    driver, segment = (client.create_run(experiment).info.run_id for _ in range(2))
    step = itertools.count()
    for _ in range(10):
        threading.Timer(random.uniform(0.02, 0.2), os.kill, (os.getpid(), signal.SIGTERM)).start()
        with pytest.raises(Stopped), DeferredSignals() as signals:
            while True:
                i = next(step)
                client.log_batch(driver, [Metric("m", i, 0, i)], [Param(f"p{i}", "v")])
                with signals.delivered():
                    pass
        other = threading.Thread(target=client.log_metric, args=(segment, "m", 1.0))
        other.start()
        other.join(5)
        assert not other.is_alive(), "a stop left the store locked"
