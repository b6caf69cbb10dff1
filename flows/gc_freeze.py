"""Python's cyclic garbage collector in a job's processes (docs/benchmarks.md, "Where the
time goes" and "Where the time goes besides training").

Importing torch, Prefect, MLflow and Optuna makes about a million objects, and each of
CPython's full collections walks every one while the process's threads wait: it was a
quarter of a command's start, a pause of every training thread later on, and 1.5-2.8 s at
the process's exit, where CPython's last collections walk them once more.

Example (a process that starts a job):
    >>> with start_uncollected() as started:
    ...     import json  # the imports, with no collection
    ...     started()  # what they made is frozen out of later collections; the job runs
    >>> exit_uncollected()  # and at exit, what lives then is left out of the last ones
"""

from __future__ import annotations

import atexit
import contextlib
import gc
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def start_uncollected() -> Iterator[Callable[[], None]]:
    """The collector paused while a job's process starts, and what it made by then frozen
    out of later collections; the yielded function, called just before the job runs, turns
    collections back on. On leaving, the collector is as it was: a process that goes on (a
    test, a notebook) collects those objects again."""
    enabled = gc.isenabled()
    gc.disable()

    def started() -> None:
        gc.freeze()
        if enabled:
            gc.enable()

    try:
        yield started
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def exit_uncollected() -> None:
    """Whatever lives when this process exits is frozen by its last exit handler, so that
    CPython's last collections skip it. Called before the imports that register exit
    handlers of their own, it runs after them; called again, it moves, and runs once."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
