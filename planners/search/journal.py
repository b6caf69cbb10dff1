"""Where a job's events are kept so that a driver that dies can be resumed: a
:class:`Journal` takes one record per event, and :class:`StudyJournal` keeps them in the
Optuna study itself. :meth:`elastune.planners.search.loop.TuningLoop.replay` reads them back.

Example:
    >>> import optuna
    >>> journal = StudyJournal(optuna.create_study())
    >>> journal.append({"handed_out": [{"trial": 0}]})
    >>> journal.append({"result": {"trial": 0}, "note": None})
    >>> journal.append({"handed_out": [{"trial": 1}]})
    >>> journal.records()
    [{'handed_out': [{'trial': 0}], 'result': {'trial': 0}, 'note': None, 'cut': False}]
    >>> journal.handed_out()
    [{'trial': 1}]
"""

from __future__ import annotations

from typing import Any, Protocol

import optuna


class Journal(Protocol):
    """Durable, append-only records of a job's events: ``{"handed_out": [segment]}`` when a
    segment is handed out, ``{"result": ..., "note": ...}`` when its result is recorded
    (with ``"cut": True`` when the job's deadline stopped its segment short).

    ``records()`` gives the results, each with the segments handed out before it (since
    the previous result), as :meth:`TuningLoop.replay` takes them.
    """

    def append(self, record: dict[str, Any]) -> None: ...

    def records(self) -> list[dict[str, Any]]: ...


class StudyJournal:
    """A :class:`Journal` kept in the Optuna study's user attributes.

    The study is the one store a job already writes at every result, reachable by any
    driver that can reach its storage, and keyed by the job id; so the journal lives there.
    Each event is one attribute: one storage write, never a rewrite of earlier ones.
    """

    PREFIX = "elastune.journal."

    def __init__(self, study: optuna.Study):
        self.study = study
        self._count = len(self._events())

    def append(self, record: dict[str, Any]) -> None:
        self.study.set_user_attr(f"{self.PREFIX}{self._count:07d}", record)
        self._count += 1

    def records(self) -> list[dict[str, Any]]:
        """The results, each with the segments handed out since the previous one."""
        return self.fold()[0]

    def handed_out(self) -> list[dict[str, Any]]:
        """Segments handed out after the last result: in flight when the driver stopped."""
        return self.fold()[1]

    def _events(self) -> list[dict[str, Any]]:
        attrs = self.study.user_attrs
        return [attrs[k] for k in sorted(attrs) if k.startswith(self.PREFIX)]

    def fold(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """:meth:`records` and :meth:`handed_out` from one read of the study."""
        results: list[dict[str, Any]] = []
        pending: list[dict[str, Any]] = []
        # An event may carry both keys: journals written before hand-outs had records of
        # their own held a result with the segments handed out before it.
        for event in self._events():
            pending += event.get("handed_out", [])
            if "result" in event:
                results.append(
                    {
                        "handed_out": pending,
                        "result": event["result"],
                        "note": event.get("note"),
                        "cut": event.get("cut", False),
                    }
                )
                pending = []
        return results, pending
