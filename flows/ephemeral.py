"""Prefect's ephemeral server for a local ``elastune run``: started first, and never
outliving the command.

With no ``PREFECT_API_URL``, Prefect starts a server subprocess the first time a flow
needs it (``SubprocessASGIServer``); that takes seconds, only begins once the command has
imported everything, and a command killed with SIGKILL left the server running.
:func:`early_server` starts the same server (the same uvicorn command and environment, its
app from :func:`infra.prefect_app.create_app`: Prefect's, its SQLite writes immediate)
before the command imports torch, MLflow and the flows, so the two overlap on separate
cores, and hands it to Prefect once it answers, as the process's ephemeral server
(:func:`adopt`).

The server never outlives the command: a watchdog (``sh``) holds the read end of a pipe
only the command writes to, and when the command dies, however it dies (SIGKILL included),
the kernel closes the pipe, the watchdog reads end-of-file and stops the server. (A pipe
rather than Linux's ``PR_SET_PDEATHSIG``, which ``infra.server`` uses for its test
servers: laptops run macOS too.) Server and watchdog have a session of their own, so a
signal to the command's process group (Ctrl-C, ``timeout``) reaches the command alone,
which still needs the server to end its flow run.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from infra.prefect_app import FACTORY
from infra.server import free_port, stop_group, wait_healthy

# Prefect's own ephemeral server has no UI and knows it is ephemeral
# (prefect.server.api.server.SubprocessASGIServer sets the same).
SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
}
# The watchdog: wait for end-of-file on stdin, then stop the server (SIGTERM, then SIGKILL
# if it still runs 5 s later). $0 is the server's pid.
WATCHDOG = "cat >/dev/null; kill -TERM $0 2>/dev/null; sleep 5; kill -KILL $0 2>/dev/null"


@contextlib.contextmanager
def early_server() -> Iterator[Callable[[], None]]:
    """Start the ephemeral server now when this command will need one, and yield a function
    that waits for it and hands it to Prefect. Leaving the block without calling it (bad
    input) stops the server; after it, the server lives as long as the process, which
    reuses it for its later commands, as Prefect does its own."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value() or has_ephemeral_server():
        yield lambda: None
        return
    port, server, stop = start_server()
    ready = False

    def wait() -> None:
        nonlocal ready
        ready = True
        # Imported while the server starts, not after: it takes a second or two.
        import prefect.server.api.server  # noqa: F401

        try:
            health = f"http://127.0.0.1:{port}/api/health"
            wait_healthy(server, health, startup_timeout(), Path(os.devnull))
        except RuntimeError:
            # Prefect's own start then tries again and fails the job with its message.
            stop()
            return
        adopt(server, port)
        atexit.register(stop)

    try:
        yield wait
    finally:
        if not ready:
            stop()


def has_ephemeral_server() -> bool:
    """Has this process an ephemeral server already (Prefect's, or one :func:`adopt`ed)?
    Prefect's server module is imported only by a process that has one."""
    if "prefect.server.api.server" not in sys.modules:
        return False
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer._instances.get(None)
    return server is not None and server.running


def adopt(server: subprocess.Popen, port: int) -> None:
    """Make ``server`` this process's ephemeral server: the instance Prefect's clients,
    events and logs find when they call ``SubprocessASGIServer()``, already running. (Prefect's
    own test harness registers its server the same way.) Prefect stays in ephemeral mode, as
    without this early start: no setting changes, so nothing leaks into a later command of
    the same process that names a server of its own."""
    from prefect.server.api.server import SubprocessASGIServer

    adopted = SubprocessASGIServer(port)
    adopted.server_process = server
    adopted.running = True
    SubprocessASGIServer._instances[None] = adopted


def start_server() -> tuple[int, subprocess.Popen, Callable[[], None]]:
    """Start Prefect's server as its ephemeral mode does, and its watchdog; the server's
    port, the server, and a function that stops both."""
    from prefect.settings import get_current_settings

    port = free_port()
    # uvicorn finds the app's module in the folder that holds flows/ and infra/.
    command = [sys.executable, "-m", "uvicorn", "--factory", FACTORY]
    command += ["--app-dir", str(Path(__file__).resolve().parents[1]), "--lifespan", "on"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "error"]
    settings = get_current_settings().to_environment_variables(exclude_unset=True)
    server = subprocess.Popen(
        command, env={**os.environ, **SERVER_ENV, **settings}, start_new_session=True
    )
    watchdog = subprocess.Popen(
        ["sh", "-c", WATCHDOG, str(server.pid)], stdin=subprocess.PIPE, start_new_session=True
    )

    def stop() -> None:
        # The watchdog goes first, so that it never signals a pid the system reused.
        watchdog.kill()
        if watchdog.stdin is not None:
            watchdog.stdin.close()  # its `cat` ends too
        watchdog.wait()
        stop_group(server, signal.SIGTERM, grace=5.0)  # the server is its own group

    return port, server, stop


def startup_timeout() -> float:
    """Prefect's own limit for its ephemeral server's start (the CLI raises it)."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    return float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
