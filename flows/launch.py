"""A job's segments in flight: each a Prefect task run, training in a worker process of
the driver's (the local pool, tasks/workers.py) or on a work pool's workers
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
import threading
from typing import Any

from elastune.flows.pools import Launched, PoolTarget
from elastune.flows.segment import WorkerLost
from elastune.flows.signals import HeldSignals
from elastune.planners.search.schedulers.base import Segment
from elastune.planners.spec import SpecError
from elastune.planners.staging.devices import LocalDevices
from elastune.tasks.train import JobRef, SegmentReport, release_devices, train_segment
from elastune.tasks.workers import LocalWorkers


class Launcher:
    """Submits segments and hands back their reports as they finish.

    Args:
        job: What each segment needs to know about its job (its ``segment_timeout`` too).
        pool: The work pool segments go to; None: the local pool (this process's workers).
        devices: CUDA devices of this machine that local segments share out (None on CPU
            or on a work pool).
        threads: torch's threads in each local worker.
    """

    def __init__(self, job: JobRef, pool: PoolTarget | None, devices: int | None, threads: int = 1):
        self.ref = job
        self.pool = pool
        self.workers = None if pool is not None else LocalWorkers(threads)
        # Which of the devices each running trial holds (local jobs with CUDA only).
        self.assigned = None if pool is not None or devices is None else LocalDevices(devices)
        # A trainable left running past its segment frees its devices from its own thread.
        self._assigning = threading.Lock()
        self._flight: dict[Launched, tuple[Segment, str]] = {}  # and its trial's run id
        self._done: queue.SimpleQueue[Launched] = queue.SimpleQueue()
        # Held in the driver's ``with launcher.signals:`` block, delivered in next_report.
        self.signals = HeldSignals()

    @property
    def running(self) -> list[Segment]:
        return [segment for segment, _ in self._flight.values()]

    def submit(
        self, segment: Segment, config: dict[str, Any], run_id: str, instance_type: str | None
    ) -> None:
        """Start ``segment`` at its width (``segment.gpus``), on ``instance_type`` in a
        planned job on a work pool."""
        if self.pool is None:
            ids = None
            if self.assigned is not None:
                with self._assigning:
                    ids = self.assigned.take(segment.trial, segment.gpus)
            future = train_segment.submit(self.workers, self.ref, segment, config, run_id, ids)
        else:
            # The driver's own limit too, for a node or flow run that hangs as a whole.
            timeout = self.ref.segment_timeout
            future = self.pool.submit(self.ref, segment, config, run_id, instance_type, timeout)
        self._flight[future] = (segment, run_id)
        future.add_done_callback(self._done.put)

    def next_report(self) -> tuple[Segment, SegmentReport]:
        """Wait for the next segment to finish; it and its report."""
        with self.signals.delivered():
            future = self._done.get()
        segment, run_id = self._flight.pop(future)
        if self.assigned is not None:
            release_devices(self.assigned, self._assigning, segment.trial, run_id)
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
        """End the local workers, once no segment runs."""
        if self.workers is not None:
            self.workers.close()
