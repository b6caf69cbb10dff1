"""The session's real Prefect server (docs/stack.md §2), for tests.

The fixture ``prefect_api`` wraps ``elastune.infra.server.running_server`` for a whole session and
points this process's Prefect client at it; import it into a test module or ``conftest.py``
to share it (``from tests.helpers.prefect_server import prefect_api  # noqa: F401``).
``running_worker`` is re-exported for the tests that start a process worker;
``segment_runs`` lists one job's segments on a work pool (flow runs, or the background task
runs of a warm pool); ``warm_nodes`` starts a warm pool's node workers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from elastune.infra.local_cluster import warm_nodes
from elastune.infra.server import running_server, running_worker

__all__ = ["prefect_api", "running_server", "running_worker", "segment_runs", "warm_nodes"]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real server for the session; this process's Prefect client talks to it."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home = tmp_path_factory.mktemp("prefect-home")
    with running_server(home) as api, temporary_settings({PREFECT_API_URL: api}):
        try:
            yield api
        finally:
            # Logs and events still queued go while the server is up: left to Prefect's
            # exit hook, they find it gone ("Error logging to API" after the last test).
            APILogWorker.drain_all()
            EventsWorker.drain_all()


def segment_runs(job_id: str, warm: bool = False) -> list:
    """The job's ``train-segment`` flow runs, or with ``warm`` its warm task runs, oldest
    first (the server is shared by the session's jobs)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, TaskRunFilter, TaskRunFilterTags
    from prefect.client.schemas.sorting import TaskRunSort

    from elastune.flows.warm_pool import job_tag

    with get_client(sync_client=True) as client:
        if warm:
            return client.read_task_runs(
                task_run_filter=TaskRunFilter(tags=TaskRunFilterTags(all_=[job_tag(job_id)])),
                sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            )
        runs = client.read_flow_runs(flow_filter=FlowFilter(name={"any_": ["train-segment"]}))
    return [r for r in runs if r.name.startswith(job_id)]
