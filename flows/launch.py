"""A job's segments in flight: each a Prefect task run, training in a worker process of
the driver's (the local pool, tasks/worker_processes.py) or on a work pool's workers
(flows/pools.py, flows/warm_pool.py), and collected in the order they finish (each
future's done callback queues it). Waiting for the next one is where the driver takes
SIGTERM and SIGINT (flows/signals.py).

A segment that fails to produce a report (its worker was lost on every retry, it ran
over ``compute.segment_timeout``: tasks/train.py, or anything else raised) comes back as a
failed report: its trial fails, the job carries on. Only a width the job cannot run
(a SpecError) ends the job, as bad input.
"""

from __future__ import annotations

import contextlib
import queue
from typing import Any

from elastune.flows.pools import Launched, PoolTarget
from elastune.flows.segment import WorkerLost
from elastune.flows.signals import DeferredSignals
from elastune.planners.search.schedulers.base import Segment
from elastune.planners.spec import SpecError
from elastune.tasks.contract import JobRef, SegmentReport


class Launcher:
    """Submits segments to the job's pool and hands back their reports as they finish.

    Args:
        job: What each segment needs to know about its job (its ``segment_timeout`` too).
        pool: The pool segments go to, opened.
    """

    def __init__(self, job: JobRef, pool: PoolTarget):
        self.ref = job
        self.pool = pool
        self._flight: dict[Launched, Segment] = {}
        self._done: queue.SimpleQueue[Launched] = queue.SimpleQueue()
        # Held in the driver's ``with launcher.signals:`` block, delivered in next_report.
        self.signals = DeferredSignals()

    @property
    def running(self) -> list[Segment]:
        return list(self._flight.values())

    def submit(
        self, segment: Segment, config: dict[str, Any], run_id: str, instance_type: str | None
    ) -> None:
        """Start ``segment`` at its width (``segment.gpus``), on ``instance_type`` in a
        planned job on a work pool."""
        # The driver's own limit too, for a node or flow run that hangs as a whole.
        timeout = self.ref.segment_timeout
        future = self.pool.submit(self.ref, segment, config, run_id, instance_type, timeout)
        self._flight[future] = segment
        future.add_done_callback(self._done.put)

    def next_report(self) -> tuple[Segment, SegmentReport]:
        """Wait for the next segment to finish; it and its report."""
        with self.signals.delivered():
            future = self._done.get()
        segment = self._flight.pop(future)
        try:
            return segment, future.result()
        except WorkerLost as exc:  # every retry lost its worker
            return segment, SegmentReport.failure(segment, f"worker lost: {exc}")
        except SpecError:
            raise  # a width the job cannot run (tasks/train.py): bad input, not a trial's
        except Exception as exc:  # whatever else ended the segment ends its trial alone
            return segment, SegmentReport.failure(segment, f"{type(exc).__name__}: {exc}")

    def wait_all(self) -> None:
        """Let every segment in flight end (the job is ending with an error)."""
        for future in self._flight:
            with contextlib.suppress(Exception):  # the job's own error is the one to raise
                future.result()

    def close(self) -> None:
        """Free what the pool holds for the job (the local pool's workers), once no
        segment runs."""
        self.pool.close()
