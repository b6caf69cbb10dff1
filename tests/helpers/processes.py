"""Processes as /proc shows them: who is alive, whose child, running what; and a bounded
wait for a condition."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from elastune.infra.prefect_app import FACTORY

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Is ``pid`` a process that still runs (a zombie waiting to be reaped does not)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def is_server(pid: int) -> bool:
    return FACTORY.encode() in cmdline(pid)


def cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def parent(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    return None


def descends(pid: int | None, ancestor: int) -> bool:
    """Is ``pid`` a descendant of ``ancestor`` (a run's worker, forked by its fork server)?"""
    while pid not in (None, 0, 1):
        pid = parent(pid)
        if pid == ancestor:
            return True
    return False


def running(argument: Path) -> list[int]:
    """Processes whose command line holds ``argument``: a command, and its workers (forks)."""
    needle = str(argument).encode()
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and needle in cmdline(int(p.name))
    ]


def wait_for(condition: Callable[[], object], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False
