"""A job's segments in flight: each a Prefect task run, training in the driver's process
(the local pool) or on a work pool's workers (flows/pools.py, flows/warm_pool.py), and
collected in the order they finish (each future's done callback queues it). Waiting for
the next one is where the driver takes SIGTERM and SIGINT (flows/signals.py).

A segment that fails to produce a report (its worker was lost on every retry, it ran
over ``compute.segment_timeout``: tasks/train.py, or anything else raised) comes back as a
failed report: its trial fails, the job carries on. Only a width the job cannot run
(a SpecError) ends the job, as bad input.

A local segment's limit raises in its thread at the trainable's next line of Python, so a
trainable blocked inside a C call (a hung collective, a data loader waiting on a dead
process) would hold the job forever: the driver gives up on a segment still inside its
trainable's call ``GIVE_UP_GRACE_SECONDS`` past its limit (never on one in its own writes
to MLflow), fails its trial and leaves the thread behind (:class:`DriverRunner` does not
wait for it when the flow ends; ``elastune``'s exit goes without it: flows/cli.py). A work
pool's segments have their driver's limit in flows/pools.py and flows/warm_pool.py, where
the worker kills the process.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import time
from typing import Any

from prefect.client.orchestration import get_client
from prefect.exceptions import PrefectHTTPStatusError
from prefect.states import Failed
from prefect.task_runners import ThreadPoolTaskRunner

from flows.pools import Launched, PoolTarget
from flows.segment import WorkerLost
from flows.signals import HeldSignals
from planners.search.schedulers.base import Segment
from planners.spec import SpecError
from planners.staging.devices import LocalDevices
from tasks.train import JobRef, SegmentReport, train_segment, training_since

# How long past ``compute.segment_timeout`` the driver waits for a local segment still in
# its trainable's call: its own limit ends a trainable in Python code at once.
GIVE_UP_GRACE_SECONDS = 5.0
# How often the driver looks for such a segment while it waits.
BLOCKED_POLL_SECONDS = 1.0


class Launcher:
    """Submits segments and hands back their reports as they finish.

    Args:
        job: What each segment needs to know about its job (its ``segment_timeout`` too).
        pool: The work pool segments go to; None: the local pool (this process).
        devices: CUDA devices of this machine that local segments share out (None on CPU
            or on a work pool).
    """

    def __init__(self, job: JobRef, pool: PoolTarget | None, devices: int | None):
        self.ref = job
        self.pool = pool
        # Which of the devices each running trial holds (local jobs with CUDA only).
        self.assigned = None if pool is not None or devices is None else LocalDevices(devices)
        self._flight: dict[Launched, Segment] = {}
        self._done: queue.SimpleQueue[Launched] = queue.SimpleQueue()
        # Local segments with a limit: the driver looks for one blocked past it.
        self._limited = pool is None and job.segment_timeout is not None
        # Held in the driver's ``with launcher.signals:`` block, delivered in next_report.
        self.signals = HeldSignals()

    @property
    def running(self) -> list[Segment]:
        return list(self._flight.values())

    def submit(
        self, segment: Segment, config: dict[str, Any], run_id: str, instance_type: str | None
    ) -> None:
        """Start ``segment`` at its width (``segment.gpus``), on ``instance_type`` in a
        planned job on a work pool."""
        if self.pool is None:
            ids = None if self.assigned is None else self.assigned.take(segment.trial, segment.gpus)
            future = train_segment.submit(self.ref, segment, config, run_id, ids)
        else:
            # The driver's own limit, for a trainable its node's limit cannot end (a C call).
            timeout = self.ref.segment_timeout
            future = self.pool.submit(self.ref, segment, config, run_id, instance_type, timeout)
        self._flight[future] = segment
        future.add_done_callback(self._done.put)

    def next_report(self) -> tuple[Segment, SegmentReport]:
        """Wait for the next segment to finish, or to be given up on; it and its report."""
        future = None
        while future not in self._flight:  # skips a segment given up on that ended after
            with self.signals.delivered():
                future = self._next_done()
        segment = self._flight.pop(future)
        if self.assigned is not None:
            self.assigned.release(segment.trial)
        # A local segment still running here is blocked past its limit: its thread stays,
        # and the process's exit ends it.
        if self._limited and not future.wrapped_future.done():
            return segment, self._given_up(future, segment)
        try:
            return segment, future.result()
        except WorkerLost as exc:  # every retry lost its worker
            return segment, SegmentReport.failure(segment, f"worker lost: {exc}")
        except SpecError:
            raise  # a width the job cannot run (tasks/train.py): bad input, not a trial's
        except Exception as exc:  # whatever else ended the segment ends its trial alone
            return segment, SegmentReport.failure(segment, f"{type(exc).__name__}: {exc}")

    def _next_done(self) -> Launched | None:
        """The next segment to end, or a local one blocked past its limit; None if neither
        came within ``BLOCKED_POLL_SECONDS``."""
        if not self._limited:
            return self._done.get()
        try:
            return self._done.get(timeout=BLOCKED_POLL_SECONDS)
        except queue.Empty:
            return next((f for f, s in self._flight.items() if self._blocked(s)), None)

    def _given_up(self, future: Launched, segment: Segment) -> SegmentReport:
        """The report of a local segment blocked past its limit; its task run, which its
        thread cannot end, is marked TimedOut (Prefect's name for a task's timeout)."""
        assert self.ref.segment_timeout is not None
        report = SegmentReport.timed_out(segment, self.ref.segment_timeout)
        state = Failed(message=report.error, name="TimedOut")
        # One the server has not recorded yet keeps the state its events gave it.
        with get_client(sync_client=True) as client, contextlib.suppress(PrefectHTTPStatusError):
            client.set_task_run_state(future.task_run_id, state, force=True)
        return report

    def _blocked(self, segment: Segment) -> bool:
        """Whether a local ``segment`` is still in its trainable's call past its limit."""
        since = training_since(self.ref, segment)
        assert self.ref.segment_timeout is not None
        limit = self.ref.segment_timeout + GIVE_UP_GRACE_SECONDS
        return since is not None and time.monotonic() > since + limit

    def wait_all(self) -> None:
        """Let every segment in flight end, except a local one blocked past its limit (the
        job is ending with an error)."""
        for future, segment in self._flight.items():
            if self._limited:
                while not future.wrapped_future.done() and not self._blocked(segment):
                    concurrent.futures.wait([future.wrapped_future], BLOCKED_POLL_SECONDS)
                continue
            with contextlib.suppress(Exception):  # the job's own error is the one to raise
                future.result()


class DriverRunner(ThreadPoolTaskRunner):
    """Prefect's thread pool for a driver's local segments, whose end does not wait for
    a segment the driver gave up on (its thread blocked in a C call): every other segment
    has ended by then (:meth:`Launcher.next_report`, :meth:`Launcher.wait_all`)."""

    def __exit__(self, *exc_info: Any) -> None:
        # Prefect's own exit (3.8) shuts its executor down waiting for every thread.
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        super().__exit__(*exc_info)
