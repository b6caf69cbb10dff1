"""Pool sizing: one interface over the Prefect work-pool limit and cloud capacity.

Before each stage the flow calls :meth:`PoolBackend.size` with the stage's concurrency
(segments that may run at once), GPUs per trial and instance type. Each part of the
backend (the Prefect limit, the ECS Auto Scaling groups) applies its share and returns one
:class:`SizingRecord` per action; every action is also logged on ``elastune.infra``. Used
as a context manager the backend releases everything on exit, also when the job raises,
so no capacity outlives the job.

Example:
    >>> class Echo(Sizer):
    ...     def size(self, demand):
    ...         return [SizingRecord(demand.stage, "echo", "slots", None, demand.slots)]
    ...     def release(self):
    ...         return [SizingRecord("release", "echo", "slots", None, 0)]
    >>> with PoolBackend("echo", [Echo()]) as backend:
    ...     [r.after for r in backend.size("b0-r0", slots=4)]
    [4]
    >>> [(r.stage, r.after) for r in backend.records]
    [('b0-r0', 4), ('release', 0)]
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

log = logging.getLogger("elastune.infra")

RELEASE_STAGE = "release"


class InfraError(Exception):
    """Bad infrastructure input: the CLI prints the message and exits with code 2."""

    exit_code = 2


class PoolNotFound(InfraError):
    """The named Prefect work pool does not exist."""


class PoolTypeMismatch(InfraError):
    """The work pool exists but is of another worker type than the backend drives."""


class NoWorker(InfraError):
    """No worker polled the pool within the timeout."""


class MissingCredentials(InfraError):
    """AWS credentials or region could not be found; the message names where to put them."""


class CapacityError(InfraError):
    """The cluster cannot provide what a stage needs (no such instance type, above max size)."""


@dataclass(frozen=True)
class Demand:
    """What one stage asks of the pool: ``slots`` segments at once, each on ``gpus_per_trial``."""

    stage: str
    slots: int
    gpus_per_trial: float = 0.0
    instance_type: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 0:
            raise ValueError(f"slots must be an integer >= 0, got {self.slots!r}")
        if not self.gpus_per_trial >= 0:
            raise ValueError(f"gpus_per_trial must be >= 0, got {self.gpus_per_trial!r}")


@dataclass(frozen=True)
class SizingRecord:
    """One sizing action: ``target``'s ``setting`` went from ``before`` to ``after``."""

    stage: str
    target: str
    setting: str
    before: int | None
    after: int | None
    detail: str = ""
    at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    def row(self) -> dict[str, Any]:
        """A row of the sizing table artifact; an unset limit reads "none", not a blank cell."""
        return {k: ("none" if v is None else v) for k, v in asdict(self).items()}


class Sizer(ABC):
    """One part of a backend. ``check`` and ``fits`` validate before anything changes."""

    def check(self) -> None:
        """Raise :class:`InfraError` when the part cannot work; changes nothing."""
        return None  # optional hook: a part with nothing to validate passes

    def fits(self, demand: Demand) -> None:
        """Raise :class:`InfraError` when the part could not size ``demand``; changes
        nothing (called after :meth:`check`)."""
        return None  # optional hook: a Prefect limit takes any size

    @abstractmethod
    def size(self, demand: Demand) -> list[SizingRecord]:
        """Apply ``demand``; one record per setting changed."""

    @abstractmethod
    def release(self) -> list[SizingRecord]:
        """Undo every :meth:`size` (capacity to zero); one record per setting changed."""

    def wait_ready(self, timeout: float) -> None:
        """Block until what :meth:`size` asked for can run segments (default: at once)."""
        return None  # optional hook: a Prefect limit takes effect at once


class PoolBackend:
    """Sizes a pool stage by stage through its parts, in order; releases them in that order.

    Put capacity parts first: they are checked, sized and released before the Prefect limit,
    so a stage the cluster cannot hold fails before anything changes, and money stops first.
    A backend without parts sizes nothing: the pool of this machine.
    """

    def __init__(self, kind: str, parts: Sequence[Sizer]) -> None:
        self.kind = kind
        self.parts = list(parts)
        self.records: list[SizingRecord] = []
        self._checked = False

    def check(self, demands: Sequence[Demand] = ()) -> None:
        """Validate every part (pool exists, credentials, capacity providers) once, and
        that each part could size each of ``demands`` (a stage above a cluster's MaxSize
        is refused before the first stage is sized)."""
        if not self._checked:
            for part in self.parts:
                part.check()
            self._checked = True
        for demand in demands:
            for part in self.parts:
                part.fits(demand)

    def size(
        self,
        stage: str,
        slots: int,
        gpus_per_trial: float = 0.0,
        instance_type: str | None = None,
    ) -> list[SizingRecord]:
        """Apply one stage's size to every part; returns (and keeps) the actions taken."""
        demand = Demand(stage, slots, gpus_per_trial, instance_type)
        self.check()
        done: list[SizingRecord] = []
        for part in self.parts:
            done += self._keep(part.size(demand))
        return done

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Block until the last stage's capacity has joined; :class:`CapacityError` if not."""
        for part in self.parts:
            part.wait_ready(timeout)

    def release(self) -> list[SizingRecord]:
        """Scale capacity to zero and give the pool back; tries every part even if one fails."""
        done: list[SizingRecord] = []
        errors: list[BaseException] = []
        for part in self.parts:
            try:
                done += self._keep(part.release())
            except Exception as exc:
                log.error("release of %s failed: %s", type(part).__name__, exc)
                errors.append(exc)
        if errors:
            raise errors[0]
        return done

    def _keep(self, records: list[SizingRecord]) -> list[SizingRecord]:
        for r in records:
            log.info(
                "sizing %s: %s %s %s -> %s (%s)",
                r.stage, r.target, r.setting, r.before, r.after, r.detail,
            )  # fmt: skip
        self.records += records
        return records

    def __enter__(self) -> PoolBackend:
        self.check()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and self.parts:
            log.warning("job ended with %s; releasing the pool", type(exc).__name__)
        try:
            self.release()
        except Exception:
            # A release failure must not hide the job's own error; it is logged above.
            if exc is None:
                raise


def sizing_table(records: Sequence[SizingRecord]) -> list[dict[str, Any]]:
    """Rows for ``prefect.artifacts.create_table_artifact(table=...)``."""
    return [r.row() for r in records]


def publish_sizing(records: Sequence[SizingRecord], key: str = "pool-sizing") -> None:
    """Record the sizing actions as a Prefect table artifact (inside a flow or task run)."""
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        key=key,
        table=sizing_table(records),
        description="Work-pool sizing actions, stage by stage (elastune infra backend)",
    )
