"""Prefect's server as elastune starts it (infra/prefect_app.py): its SQLite write
transactions begin IMMEDIATE, so a burst of writers waits its turn instead of getting 503s."""

from __future__ import annotations

import asyncio
import gc
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from prefect.server.database.configurations import SQLITE_BEGIN_MODE, AioSqliteConfiguration

from elastune.infra import prefect_app

BEGIN = AioSqliteConfiguration.begin_transaction  # Prefect's own


async def create_background_runs(api: str, runs: int, concurrency: int) -> dict[int, int]:
    """Create ``runs`` background task runs (a warm segment is one), ``concurrency`` at a
    time, straight over HTTP (no client retries); how many answers had each status."""
    statuses: dict[int, int] = {}
    gate = asyncio.Semaphore(concurrency)

    async def create(client: httpx.AsyncClient, i: int) -> None:
        async with gate:
            run = {"task_key": f"burst-{i % 4}", "dynamic_key": str(uuid.uuid4()), "name": f"b{i}"}
            response = await client.post(
                "/task_runs/", json={**run, "state": {"type": "SCHEDULED"}}
            )
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    async with httpx.AsyncClient(base_url=api, timeout=60) as client:
        await asyncio.gather(*(create(client, i) for i in range(runs)))
    return statuses


def test_a_burst_of_run_creations_gets_no_503(prefect_api: str) -> None:
    # Prefect's own `prefect server start` answered 503 to 286 of 300 such creations here:
    # each reads before it writes, in a DEFERRED transaction.
    assert asyncio.run(create_background_runs(prefect_api, 120, 16)) == {201: 120}


@pytest.fixture
def prefect_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefect's SQLite configuration as it was, restored after the test (this process is
    a client, whose server code stays Prefect's)."""
    monkeypatch.setattr(AioSqliteConfiguration, "begin_transaction", BEGIN)


@pytest.mark.usefixtures("prefect_class")
def test_write_transactions_begin_immediate(tmp_path: Path) -> None:
    prefect_app.immediate_sqlite_writes()
    patched = AioSqliteConfiguration.begin_transaction
    prefect_app.immediate_sqlite_writes()
    assert AioSqliteConfiguration.begin_transaction is patched  # wraps once
    config = AioSqliteConfiguration(f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}")

    async def mode() -> str | None:
        engine = await config.engine()
        async with await config.session(engine) as session, config.begin_transaction(session):
            return SQLITE_BEGIN_MODE.get()

    assert asyncio.run(mode()) == "IMMEDIATE"


@pytest.mark.usefixtures("prefect_class")
def test_the_ephemeral_app_and_the_cli_apply_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefect.cli
    import prefect.server.api.server

    seen: list[str] = []

    async def app(scope: dict, receive: object, send: object) -> None:  # Prefect's, as seen
        seen.append(scope["path"])

    monkeypatch.setattr(prefect.server.api.server, "create_app", lambda: app)
    try:
        assert prefect_app.create_app() is app
        # One request that no route matches, before it serves: FastAPI builds every route.
        assert seen == ["/api/elastune-builds-the-routes"]
        # The server process's imports are left out of its later full collections.
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # this test's process goes on
    assert AioSqliteConfiguration.begin_transaction.immediate

    monkeypatch.setattr(AioSqliteConfiguration, "begin_transaction", BEGIN)
    started: list[list[str]] = []
    monkeypatch.setattr(sys, "argv", ["python"])
    monkeypatch.setattr(prefect.cli, "app", lambda: started.append(sys.argv))
    prefect_app.main(["--port", "4201"])
    assert started == [["prefect", "server", "start", "--port", "4201"]]
    assert AioSqliteConfiguration.begin_transaction.immediate
