"""SIGTERM and SIGINT reach a driver where it waits for segments, not inside a store write.

Python runs a signal's handler in the main thread between any two bytecodes, and the
handlers a driver has raise there: Prefect's flow engine turns SIGTERM into
``TerminationSignal``, Python turns SIGINT into ``KeyboardInterrupt``. Raised inside
SQLAlchemy in the middle of an MLflow or Optuna write, the exception left that write's
SQLite lock with a connection nobody would release: the segments' metric writes and the
job's own abort each waited out MLflow's 20 s busy timeout, and a run stopped with SIGTERM
took 41 s to end, with an error, instead of one second.

:class:`DeferredSignals` holds the two signals while the driver works and hands them to the
handlers that were installed where it waits (:meth:`DeferredSignals.delivered`), which is where
it spends nearly all of its time, so a stop is as quick as before. A second signal while
one deferred is delivered at once: a driver stuck outside its wait still ends. Prefect's
handler is the installed one while the driver waits, so a cancellation from Prefect's UI
that arrives then is acknowledged as before (one that arrives during a write ends the run
as crashed, as a cancellation Prefect cannot acknowledge does).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

HELD = (signal.SIGTERM, signal.SIGINT)


class DeferredSignals:
    """Hold SIGTERM and SIGINT in this block, except in its :meth:`delivered` blocks; a
    signal deferred when the block ends is delivered then. Outside the main thread, where
    Python runs no signal handler, it does nothing.

    Example:
        .. code-block:: python

            with DeferredSignals() as signals:
                write_to_the_stores()  # a SIGTERM waits until ...
                with signals.delivered():
                    wait_for_the_next_segment()  # ... here, or the block's end
    """

    def __init__(self) -> None:
        self.active = threading.current_thread() is threading.main_thread()
        self.handlers: dict[int, Any] = {}
        self.caught: list[int] = []

    def __enter__(self) -> DeferredSignals:
        self.hold()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()

    @contextlib.contextmanager
    def delivered(self) -> Iterator[None]:
        """The installed handlers run in this block, first for a signal deferred before it."""
        self.release()
        try:
            yield
        finally:
            self.hold()

    def hold(self) -> None:
        if self.active:
            self.handlers = {sig: signal.signal(sig, self._caught) for sig in HELD}

    def release(self) -> None:
        """Put the installed handlers back and deliver a deferred signal to them."""
        if not self.active or not self.handlers:
            return
        for sig, handler in self.handlers.items():
            # None: a handler not installed from Python, which cannot be put back.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self.handlers = {}
        if self.caught:
            signal.raise_signal(self.caught.pop())  # the handler runs before this returns

    def _caught(self, signum: int, frame: FrameType | None) -> None:
        self.caught.append(signum)
        if len(self.caught) > 1:  # the second: at once
            self.release()
