"""What a warm pool's driver does when a service or a node drops out for a while
(docs/durability.md, "Across hosts").

- *The Prefect server is unreachable* (it restarts, the driver's link is down): the driver
  waits for it, at most :data:`OUTAGE_SECONDS`, instead of failing the segments it was
  launching or waiting on; nodes are not judged by heartbeats the server could not take
  until they have had :data:`LIVE_SECONDS` to beat again, and a node is given up on only
  once it has stayed silent :data:`LIVE_SECONDS` past its first missed beat.
- *A run scheduled before the server died* is not sent to its node by the restarted server
  (Prefect queues background runs in memory): the driver launches it again.
- *A node is given up on* (its heartbeats stopped, or it was restarted): the driver fences
  the segment's trial run (tasks/fence.py), so the launch it gave up on writes nothing more
  to MLflow, and then reads the segment's report: one saved before the fence means the
  segment had finished, and is not run again.

Example:
    >>> import httpx
    >>> unreachable(httpx.ConnectError("refused")), unreachable(ValueError("bad"))
    (True, False)
"""

from __future__ import annotations

import time

import httpx
from prefect.exceptions import PrefectHTTPStatusError

from elastune.infra.warm_nodes import LIVE_SECONDS
from elastune.planners.search.schedulers.base import Segment
from elastune.tasks.fence import TAG, token
from elastune.tasks.tracking import shared_tracker
from elastune.tasks.train import JobRef, SegmentReport, report_name

# How long a driver waits for the Prefect server to answer again before it gives up on a
# segment (a server's restart takes seconds; a host's reboot, minutes).
OUTAGE_SECONDS = 300.0


def unreachable(exc: BaseException) -> bool:
    """Does ``exc`` mean the Prefect server could not be reached, or could not answer?"""
    if isinstance(exc, httpx.TransportError | ConnectionError | TimeoutError):
        return True
    return isinstance(exc, PrefectHTTPStatusError) and exc.response.status_code >= 500


class Outage:
    """The Prefect server's unavailability as one waiter sees it."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.ended = -float("inf")

    def wait(self, exc: BaseException, pause: float) -> None:
        """The server did not answer (``exc``): wait ``pause`` s, or raise ``exc`` once it
        has not answered for :data:`OUTAGE_SECONDS`."""
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        if now - self.since > OUTAGE_SECONDS:
            raise exc
        time.sleep(pause)

    def answered(self, slow: bool = False) -> None:
        """The server answered (``slow``: only after its client had retried for a while)."""
        if self.since is not None or slow:
            self.since, self.ended = None, time.monotonic()

    def settling(self) -> bool:
        """Has the server answered again too recently for nodes to have beaten since?"""
        return time.monotonic() - self.ended < LIVE_SECONDS

    def lost_queue(self) -> bool:
        """Was the server away long enough ago that a run still scheduled now was lost with
        its queue? Prefect's server queues background runs in memory: one scheduled but not
        yet sent to its worker when the server died is never sent."""
        away = self.ended != -float("inf")
        return away and time.monotonic() - self.ended > 3 * LIVE_SECONDS


class Silence:
    """A node's silence as one waiter sees it: the node is dead once it has been seen
    without a live heartbeat for :data:`LIVE_SECONDS` more, not at the first look (a
    heartbeat the server missed while it restarted, or a node slow to send one under load,
    is no death)."""

    def __init__(self) -> None:
        self.since: float | None = None

    def dead(self, beating: bool) -> bool:
        if beating:
            self.since = None
            return False
        now = time.monotonic()
        self.since = now if self.since is None else self.since
        return now - self.since > LIVE_SECONDS


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def give_up(job: JobRef, segment: Segment, run_id: str) -> SegmentReport | None:
    """Fence ``segment``'s trial run against the launches before now; its report if one was
    saved before the fence (the segment had finished: it is not run again)."""
    tracker = shared_tracker(job.mlflow_uri, job.experiment)
    tracker.set_tags(run_id, {TAG: token(segment.start, now_ms(), 0)})
    saved = tracker.load_report(run_id, report_name(segment))
    return None if saved is None else SegmentReport.from_dict(saved)
