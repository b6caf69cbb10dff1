"""Checkpoints kept on local disk while a segment of the local pool trains
(docs/durability.md).

Each ``ctx.checkpoint`` of such a segment is a file written here (no database transaction,
no MLflow round trip); the segment hands only its newest one to MLflow when it ends. A
driver killed mid-segment leaves that newest file behind, holding the metrics reported
since they were last written to MLflow, and the segment's retry hands both over before it
restores, so the kill loses no more than the work since that checkpoint.

A file is written under a temporary name and renamed, so it is never seen torn; only the
newest file of a run is kept.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> spool = Spool(folder)
    >>> _ = spool.write("run", 2, b"two"); _ = spool.write("run", 3, b"three")
    >>> [(r, p.read_bytes()) for r, p in spool.files("run")]
    [(3.0, b'three')]
    >>> spool.clear("run"); spool.files("run")
    []
    >>> shutil.rmtree(folder)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from elastune.tasks.stores import sqlite_path


def checkpoint_name(resource: float) -> str:
    """A checkpoint's file name, in the spool as in MLflow."""
    return f"resource-{resource:g}.pt"


def checkpoint_resource(name: str) -> float | None:
    """The resource level a checkpoint file name holds; None for another file."""
    if name.startswith("resource-") and name.endswith(".pt"):
        return float(name[len("resource-") : -len(".pt")])
    return None


class Spool:
    """Local checkpoint files, one folder per trial run, under ``root``."""

    def __init__(self, root: Path):
        self.root = root

    @classmethod
    def beside(cls, mlflow_uri: str) -> Spool:
        """The spool of a tracking store: next to a SQLite database (so a resumed driver
        finds it whatever its working directory), else in ``~/.elastune/spool``."""
        database = sqlite_path(mlflow_uri)
        home = Path.home() / ".elastune" if database is None else database.parent
        return cls(home / "spool")

    def write(self, run_id: str, resource: float, payload: bytes) -> Path:
        """Keep ``payload`` as the run's checkpoint at ``resource``, replacing older ones."""
        folder = self.root / run_id
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / checkpoint_name(resource)
        partial = path.with_suffix(".part")
        partial.write_bytes(payload)
        os.replace(partial, path)
        for _, older in self.files(run_id)[1:]:
            older.unlink(missing_ok=True)
        return path

    def files(self, run_id: str) -> list[tuple[float, Path]]:
        """(resource, path) of the run's checkpoint files, highest resource first."""
        folder = self.root / run_id
        if not folder.is_dir():
            return []
        found = [(checkpoint_resource(p.name), p) for p in folder.iterdir()]
        return sorted(((r, p) for r, p in found if r is not None), reverse=True)

    def clear(self, run_id: str) -> None:
        shutil.rmtree(self.root / run_id, ignore_errors=True)
