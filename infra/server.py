"""A real Prefect server and process worker on loopback, for tests and checks (docs/stack.md §2).

``running_server`` starts ``python -m elastune.infra.prefect_app`` (``prefect server start`` with
its SQLite writes immediate) on a free port with its own ``PREFECT_HOME`` and waits for
``/api/health``; ``running_worker`` starts ``python -m prefect worker start --type process``
that polls every second. Both run in their own process group, which is stopped at exit
whatever happens, so no process outlives the block. The pytest fixture that shares one
server across a test session is in ``tests/helpers/prefect_server.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from elastune.planners.spec.cache import copy_of_empty

# A fresh SQLite DB takes ~10 s to migrate on an idle 2-core box (a server's home gets a
# copy of a migrated one, new_database); leave room for a busy one.
SERVER_START_TIMEOUT = 90.0
# Every `mlflow server` elastune starts: MLflow's job runner (GenAI jobs, which elastune
# never submits) would otherwise start Huey consumer processes that poll its database,
# a third of a core of the 2-core development machine between them.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def isolated_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without any ``PREFECT_*`` setting, plus a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="WARNING",
        **extra,
    )
    return env


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGTERM when the process that started it dies, even
    by SIGKILL (Linux ``prctl(PR_SET_PDEATHSIG)``; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def stop_group(process: subprocess.Popen, first: int, grace: float = 10.0) -> None:
    """Signal the whole process group with ``first``, then SIGKILL it if it lingers."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, first)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running_server(
    home: Path, port: int | None = None, ui: bool = False, database: str | None = None
) -> Iterator[str]:
    """Yield the API URL (``http://127.0.0.1:PORT/api``) of a server started for the block.

    With ``ui`` the server also serves the web UI, told to call this port's API (left alone,
    the UI's API URL is ``PREFECT_SERVER_API_PORT``, 4200, whatever ``--port`` says).
    ``database``: Prefect's ``PREFECT_API_DATABASE_CONNECTION_URL`` for the server (e.g.
    ``postgresql+asyncpg://...``); None: SQLite in ``home``.
    """
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    api = f"http://127.0.0.1:{port}/api"
    log = home / "server.log"
    command = [sys.executable, "-m", "elastune.infra.prefect_app"]  # prefect server start, amended
    command += ["--host", "127.0.0.1", "--port", str(port)]
    env = isolated_env(home, PREFECT_UI_ENABLED=str(ui).lower(), PREFECT_UI_API_URL=api)
    if database is not None:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database
    else:
        new_database(home / "prefect.db")
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    try:
        wait_healthy(process, f"{api}/health", SERVER_START_TIMEOUT, log)
        yield api
    finally:
        stop_group(process, signal.SIGTERM)


def new_database(database: Path) -> None:
    """Start a server's new SQLite database as a copy of an empty one Prefect migrated once
    per machine and Prefect version (``prefect server database upgrade``, in the cache):
    the server would otherwise run every migration since Prefect's first as it starts, about
    12 s of a slow machine's, for each new home (each test's server, each new cluster)."""

    def migrate(tmp: Path) -> None:
        url = f"sqlite+aiosqlite:///{tmp}"
        command = [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"]
        with tempfile.TemporaryDirectory() as home:
            env = isolated_env(Path(home), PREFECT_API_DATABASE_CONNECTION_URL=url)
            subprocess.run(command, env=env, check=True, capture_output=True)

    version = importlib.metadata.version("prefect")
    copy_of_empty(database, f"prefect-{version}-empty.db", migrate)


def answers(health: str, timeout: float = 2.0) -> bool:
    """Does the server answer 200 at ``health`` now?"""
    with (
        contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
        urllib.request.urlopen(health, timeout=timeout) as response,
    ):
        return response.status == 200
    return False


def wait_healthy(process: subprocess.Popen, health: str, timeout: float, log: Path) -> None:
    """Wait until the server ``process`` answers 200 at ``health``; raise if it exits first
    (with the tail of its ``log``) or stays unhealthy ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}:\n{_tail(log)}")
        if answers(health):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{health} not healthy after {timeout} s")
        time.sleep(0.1)


@contextlib.contextmanager
def running_worker(
    api: str,
    pool: str,
    home: Path,
    worker_type: str = "process",
    query_seconds: int = 1,
    **settings: str,
) -> Iterator[subprocess.Popen]:
    """A worker polling ``pool`` every ``query_seconds``, with more Prefect ``settings`` for
    its flow runs; stopped with SIGINT at exit."""
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"worker-{pool}.log"
    command = [sys.executable, "-m", "prefect", "worker", "start"]
    command += ["--pool", pool, "--type", worker_type]
    env = isolated_env(
        home,
        PREFECT_API_URL=api,
        PREFECT_WORKER_QUERY_SECONDS=str(query_seconds),
        PREFECT_WORKER_PREFETCH_SECONDS="0",
        **settings,
    )
    with log.open("w") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        # A worker shuts down cleanly on SIGINT (docs/stack.md §2); SIGKILL follows if it hangs.
        stop_group(process, signal.SIGINT)
