"""Prefect's ephemeral server for a local ``elastune run``: started early, and never
outliving the command.

With no ``PREFECT_API_URL``, Prefect starts a server subprocess the first time a flow
needs it and stops it at exit; that takes seconds, and a command killed with SIGKILL left
it running. :func:`start_early` starts the same server (Prefect's ``SubprocessASGIServer``,
which Prefect's own clients then find and reuse) in a thread while the command imports the
rest of elastune, and ties it to the command: a watchdog (``sh``) holds the read end of a
pipe only the command can write to, and when the command dies, however it dies, the kernel
closes the pipe, the watchdog reads end-of-file and stops the server.
"""

from __future__ import annotations

import atexit
import contextlib
import subprocess
import threading
from collections.abc import Callable

# The watchdog: wait for end-of-file on stdin, then stop the server (SIGTERM, then SIGKILL
# if it still runs 5 s later). $0 is the server's pid.
WATCHDOG = "cat >/dev/null; kill -TERM $0 2>/dev/null; sleep 5; kill -KILL $0 2>/dev/null"


def start_early() -> Callable[[], None]:
    """Start the ephemeral server in the background when this process will need one;
    returns a function that waits until the start is over."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return lambda: None

    def start() -> None:
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer()
        # A start that fails leaves the server stopped: the flow's own start then tries
        # again and fails the job with Prefect's message, as without this early start.
        with contextlib.suppress(Exception):
            server.start()
        if server.running and server.server_process is not None:
            tie(server.server_process.pid)

    thread = threading.Thread(target=start, name="prefect-server-start", daemon=True)
    thread.start()
    return thread.join


_TIED: set[int] = set()  # pids a watchdog of this process already guards


def tie(pid: int) -> None:
    """Stop process ``pid`` when this process dies, even by SIGKILL (once per pid: a process
    that runs several jobs reuses Prefect's server)."""
    if pid in _TIED:
        return
    _TIED.add(pid)
    watchdog = subprocess.Popen(
        ["sh", "-c", WATCHDOG, str(pid)], stdin=subprocess.PIPE, start_new_session=True
    )
    # On a normal exit Prefect stops the server itself; the watchdog goes first, so that it
    # never signals a pid the system may have reused. (atexit runs last-registered first.)
    atexit.register(watchdog.wait)
    atexit.register(watchdog.kill)
