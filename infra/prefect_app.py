"""Prefect's server as elastune starts it: on SQLite, every write transaction takes the
database's write lock when it begins (docs/prefect-server.md, "What a Prefect server costs").

Prefect's server opens most write transactions on SQLite as ``DEFERRED``: one that reads and
then writes (creating a background task run does: it looks for the run first) fails at
once with ``database is locked`` when another connection wrote since its read, without
waiting on SQLite's busy timeout. Prefect answers ``503`` and its client waits 2, 4, then 8
s before it tries again. Under a warm pool's writers (runs created, their states, node
heartbeats) that was about one ``POST /task_runs/`` in ten. Prefect's own remedy, which it
applies to the transactions it passes ``with_for_update``, is ``BEGIN IMMEDIATE``: the
transaction takes the write lock first and waits its turn. :func:`immediate_sqlite_writes`
applies it to every write transaction of the process; PostgreSQL servers are untouched.

- ``python -m elastune.infra.prefect_app [OPTIONS]`` is ``prefect server start [OPTIONS]`` with it
  (``elastune.infra.server.running_server`` and ``elastune.infra.local_cluster`` start their server
  so);
- :func:`create_app` is the uvicorn factory of ``elastune run``'s ephemeral server
  (``flows/ephemeral.py``), Prefect's own ``create_app`` with it.
"""

from __future__ import annotations

import gc
import sys
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

# uvicorn's import path of :func:`create_app`, for ``--factory``.
FACTORY = "elastune.infra.prefect_app:create_app"


def immediate_sqlite_writes() -> None:
    """Make every write transaction of this process's Prefect server on SQLite begin
    ``IMMEDIATE`` (Prefect's ``with_for_update``). Idempotent."""
    from prefect.server.database.configurations import AioSqliteConfiguration

    begin = AioSqliteConfiguration.begin_transaction
    if getattr(begin, "immediate", False):
        return

    def begin_immediate(
        self: AioSqliteConfiguration, session: Any, with_for_update: bool = False
    ) -> AbstractAsyncContextManager[Any]:
        return begin(self, session, with_for_update=True)

    begin_immediate.immediate = True  # type: ignore[attr-defined]
    AioSqliteConfiguration.begin_transaction = begin_immediate  # type: ignore[method-assign]


def create_app() -> FastAPI:
    """Prefect's server app (``prefect.server.api.server:create_app``, which reads the rest
    from the environment as it does for Prefect's own ephemeral server), its SQLite writes
    immediate.

    Python's cyclic garbage collector is paused while the server's modules are imported,
    and what they made is then frozen out of later collections, as ``elastune run`` does
    with its own start (``flows/cli.py``): a quarter of the import went to collections.
    And its routes are built before it serves (:func:`build_routes`).
    """
    gc.disable()
    try:
        from prefect.server.api.server import create_app as prefect_app

        immediate_sqlite_writes()
        app = prefect_app()
        build_routes(app)
        return app
    finally:
        gc.freeze()
        gc.enable()


def build_routes(app: FastAPI) -> None:
    """Have FastAPI build its routes now, while the command that started this server is
    still importing, instead of on their first request: FastAPI builds the routes of the
    routers it includes when a request first walks them (their parameters' pydantic
    models), and the command's first API call waited 0.3-0.5 s for Prefect's. One request
    that matches no route walks them all. It runs in a thread of its own: uvicorn calls
    the factory in its event loop."""
    import asyncio
    import contextlib
    import threading

    import httpx

    async def request_nothing() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            # Routes not built now are built on their first request, as without it.
            with contextlib.suppress(Exception):
                await client.get("/api/elastune-builds-the-routes")

    thread = threading.Thread(target=asyncio.run, args=(request_nothing(),))
    thread.start()
    thread.join()


def main(argv: list[str] | None = None) -> None:
    """``prefect server start`` with ``argv`` as its options, its SQLite writes immediate."""
    from prefect.cli import app

    immediate_sqlite_writes()
    # Prefect's CLI reads its arguments from sys.argv only.
    sys.argv = ["prefect", "server", "start", *(sys.argv[1:] if argv is None else argv)]
    app()


if __name__ == "__main__":
    main()
