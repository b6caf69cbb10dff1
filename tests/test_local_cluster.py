"""``python -m elastune.infra.local_cluster``: it prints where its server and pool are, and nothing
it started outlives it, whether it is stopped (SIGTERM) or killed (SIGKILL); a node worker
that dies is started again. A server's new home starts from a copy of Prefect's migrated
database."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastune.infra.server import new_database
from elastune.planners.spec.cache import cache_dir

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="/proc")]
ROOT = Path(__file__).resolve().parent.parent


def children_by_parent() -> dict[int, list[int]]:
    """The living processes' children, by parent."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # it ended meanwhile
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid``."""
    children = children_by_parent()
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie has finished)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.add(pid)
    return running


def start_cluster(home: Path) -> tuple[subprocess.Popen, list[str]]:
    """The CLI with one node, and the ``export`` lines it printed once ready."""
    process = subprocess.Popen(
        [sys.executable, "-m", "elastune.infra.local_cluster", "--nodes", "1", "--home", str(home)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    exports = [process.stdout.readline().strip() for _ in range(2)]
    return process, exports


def stop_and_await(process: subprocess.Popen, how: signal.Signals) -> set[int]:
    """Send ``how`` to the cluster command; those of its processes still alive 60 s on."""
    started = descendants(process.pid)
    assert len(started) >= 2, started  # the server and the node's worker
    os.kill(process.pid, how)
    process.wait(60)
    deadline = time.monotonic() + 60
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(started)


def test_nothing_outlives_a_killed_cluster(tmp_path) -> None:
    process, exports = start_cluster(tmp_path)
    try:
        assert exports[0].startswith("export PREFECT_API_URL=http://127.0.0.1:"), exports
        assert exports[1] == "export ELASTUNE_POOL=warm"
        assert not stop_and_await(process, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_a_dead_node_worker_is_started_again_and_a_stop_ends_everything(tmp_path) -> None:
    process, _ = start_cluster(tmp_path)
    try:
        worker = tmp_path / "warm-node-0" / "worker.log"
        (node,) = node_workers(process.pid)
        os.kill(node, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            again = node_workers(process.pid)
            if again and again != [node]:
                break
            time.sleep(0.2)
        assert again and node not in again, worker.read_text()[-2000:]
        # Stopped (SIGTERM), it ends what it started, the restarted worker included.
        assert not stop_and_await(process, signal.SIGTERM)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def node_workers(cluster: int) -> list[int]:
    """The node workers the cluster process started (not their fork servers, copies of
    them that their segments' worker processes fork from)."""
    started = children_by_parent().get(cluster, [])
    return [p for p in started if "elastune.flows.segment" in cmdline(p)]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def test_a_new_server_home_starts_from_prefects_migrated_database(tmp_path) -> None:
    """Made once per machine and Prefect version by Prefect's own migration, shared by the
    session's servers (which start on such copies); a database already there is kept."""
    first, second = tmp_path / "a" / "prefect.db", tmp_path / "b" / "prefect.db"
    for database in (first, second):
        database.parent.mkdir()
        new_database(database)
    empty = cache_dir() / f"prefect-{importlib.metadata.version('prefect')}-empty.db"
    assert first.read_bytes() == second.read_bytes() == empty.read_bytes()
    with sqlite3.connect(first) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        assert {"flow_run", "task_run", "work_pool", "alembic_version"} <= tables
        assert db.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
        assert db.execute("SELECT count(*) FROM flow_run").fetchone() == (0,)
    first.write_bytes(b"a user's database")
    new_database(first)
    assert first.read_bytes() == b"a user's database"
