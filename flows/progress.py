"""A rich progress display on stderr: stage, segments done/total, best so far."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


class JobProgress:
    """Context manager that draws one progress line for the job."""

    def __init__(self, metric: str, total: int | None, console: Console | None = None):
        self.metric = metric
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("segments · best {task.fields[metric]} [cyan]{task.fields[best]}"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
        )
        self._task = self._progress.add_task("starting", total=total, metric=metric, best="-")

    def __enter__(self) -> JobProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def update(self, stage: str, best: float | None, total: int | None = None) -> None:
        fields = {"best": "-" if best is None else f"{best:.4g}"}
        self._progress.update(self._task, description=stage, advance=1, total=total, **fields)
