"""Prefect's ephemeral server for a local ``elastune run``: started first, and never
outliving the command.

With no ``PREFECT_API_URL``, Prefect starts a server subprocess the first time a flow
needs it (``SubprocessASGIServer``); that takes seconds, only begins once the command has
imported everything, and a command killed with SIGKILL left the server running.
:func:`early_server` starts the same server (the same uvicorn command and environment, its
app from :func:`elastune.infra.prefect_app.create_app`: Prefect's, its SQLite writes immediate)
before the command imports torch, MLflow and the flows, so the two overlap on separate
cores, and points the command's Prefect settings at it once it answers. Before that, the
command imports what the job imports later anyway (:data:`WARM`), however soon the server
answers.

It points the settings, as Prefect's own test harness does (``prefect_test_harness``:
``PREFECT_API_URL`` in the command's settings and in the process-wide ones that threads
without a copied context read), rather than registering the server as Prefect's ephemeral
one: Prefect's clients find that one through ``prefect.server.api.server``, a module that
takes 1.2-1.7 s of the command's one busy core to import. When the command ends, its logs
and events are sent (Prefect's log and events workers drained, as the harness does: the
events worker is a process-wide singleton that would keep this address) and the settings
are restored, so a later command of the same process that names a server of its own
reaches that one. The server itself lives as long as the process, which reuses it for its
later commands, as Prefect does its own.

The server never outlives the command: a watchdog (``sh``) holds the read end of a pipe
only the command writes to, and when the command dies, however it dies (SIGKILL included),
the kernel closes the pipe, the watchdog reads end-of-file and stops the server. (A pipe
rather than Linux's ``PR_SET_PDEATHSIG``, which ``elastune.infra.server`` uses for its test
servers: laptops run macOS too.) Server and watchdog have a session of their own, so a
signal to the command's process group (Ctrl-C, ``timeout``) reaches the command alone,
which still needs the server to end its flow run.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from elastune.infra.prefect_app import FACTORY
from elastune.infra.server import free_port, stop_group, wait_healthy

# The server's task-run recorder writes the runs' state events in batches, at most a
# second late, instead of one transaction per event (Prefect's default): a segment's task
# run costs the server 9 ms of CPU instead of 24 (docs/prefect-server.md, "What a Prefect
# server costs"). A user's own settings still win (start_server).
RECORDER_BATCHES = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}
# Prefect's server registers every installed collection's block types when it starts:
# it imports each collection (prefect-aws: boto3, aiohttp) and hashes the registry even when
# its memo says nothing changed, about 1 s of CPU on the core the command imports on. The
# job's own server needs no block type: a local job saves no block, and a block saved from
# a client registers its type itself (Block.save). docs/prefect-server.md, "What a Prefect
# server costs".
NO_BLOCK_REGISTRATION = {
    "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "0",
    "PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION": "0",
}
# Prefect's own ephemeral server has no UI and knows it is ephemeral
# (prefect.server.api.server.SubprocessASGIServer sets the same).
SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
    **RECORDER_BATCHES,
    **NO_BLOCK_REGISTRATION,
}
# The watchdog: wait for end-of-file on stdin, then stop the process (SIGTERM, then SIGKILL
# if it still runs 5 s later), then remove what it leaves behind. $0 is its pid, $@ those
# folders.
WATCHDOG = (
    "cat >/dev/null; kill -TERM $0 2>/dev/null; sleep 5; kill -KILL $0 2>/dev/null;"
    ' [ $# -eq 0 ] || { sleep 1; rm -rf -- "$@"; }'
)

# Imported while the server starts, all of them even when it answers first: MLflow's SQL
# store (a job's tracker builds one), and torch's compiler, which every torch.optim
# optimizer imports when it is made. Left to the job, the compiler's 0.8-1.9 s would land in
# its first segment or not, by that race, moving a calibration job's wall by as much from
# one run to the next, and it would import with the collector on (flows/gc_freeze.py).
WARM = ("mlflow.store.tracking.sqlalchemy_store", "torch._dynamo")

# The API address of the server this process started and answered, once it has.
_api_url: str | None = None


@contextlib.contextmanager
def early_server() -> Iterator[Callable[[], None]]:
    """Start the ephemeral server now when this command will need one (or reuse the one an
    earlier command of this process started), and yield a function that waits for it and
    points Prefect at it until the block ends. Leaving the block without calling it (bad
    input) stops a server it started."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value() or has_ephemeral_server():
        yield lambda: None
        return
    started = None if _api_url is not None else start_server()
    pointed = contextlib.ExitStack()

    def wait() -> None:
        global _api_url
        nonlocal started
        if started is not None:
            port, server, stop = started
            started = None
            api = f"http://127.0.0.1:{port}/api"
            try:
                warm()
                wait_healthy(server, f"{api}/health", startup_timeout(), Path(os.devnull))
            except RuntimeError:
                # Prefect's own start then tries again and fails the job with its message.
                stop()
                return
            atexit.register(stop)
            _api_url = api
        if _api_url is not None:
            pointed.enter_context(pointed_at(_api_url))

    try:
        yield wait
    finally:
        pointed.close()
        if started is not None:  # never waited for: bad input
            started[2]()


@contextlib.contextmanager
def pointed_at(api_url: str) -> Iterator[None]:
    """Prefect's settings name ``api_url`` in this context and in the process-wide one, as
    in Prefect's test harness; on leaving, the logs and events sent and the settings back."""
    import prefect.context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings({PREFECT_API_URL: api_url}),
        prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()),
    ):
        try:
            yield
        finally:
            APILogWorker.drain_all()
            EventsWorker.drain_all()


def warm() -> None:
    """Import what every job imports later (:data:`WARM`)."""
    for module in WARM:
        importlib.import_module(module)


def has_ephemeral_server() -> bool:
    """Has this process Prefect's own ephemeral server running already? Prefect's server
    module is imported only by a process that has one."""
    if "prefect.server.api.server" not in sys.modules:
        return False
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer._instances.get(None)
    return server is not None and server.running


def start_server() -> tuple[int, subprocess.Popen, Callable[[], None]]:
    """Start Prefect's server as its ephemeral mode does, and its watchdog; the server's
    port, the server, and a function that stops both."""
    from prefect.settings import get_current_settings

    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "--factory", FACTORY, "--lifespan", "on"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "error"]
    settings = get_current_settings().to_environment_variables(exclude_unset=True)
    server = subprocess.Popen(
        command, env={**os.environ, **SERVER_ENV, **settings}, start_new_session=True
    )
    stand_down = watchdog(server.pid)

    def stop() -> None:
        stand_down()
        stop_group(server, signal.SIGTERM, grace=5.0)  # the server is its own group

    return port, server, stop


def watchdog(pid: int, leftovers: Sequence[Path] = ()) -> Callable[[], None]:
    """Stop the child ``pid`` when this process dies, however it dies (SIGKILL included),
    and then remove the folders ``leftovers`` (what this process would have removed): a
    watchdog (``sh``) holds the read end of a pipe only this process writes to. Returns
    the function that stands it down, to be called before the child is reaped, so that it
    never signals a pid the system reused."""
    dog = subprocess.Popen(
        ["sh", "-c", WATCHDOG, str(pid), *map(str, leftovers)],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )

    def stand_down() -> None:
        dog.kill()
        if dog.stdin is not None:
            dog.stdin.close()  # its `cat` ends too
        dog.wait()

    return stand_down


def startup_timeout() -> float:
    """Prefect's own limit for its ephemeral server's start (the CLI raises it)."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    return float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
