"""Does the Prefect UI tell a finished job's story, and does the MLflow UI show its runs?

``python -m elastune.infra.ui_job --out docs/img`` starts a real Prefect server with the deployments
of ``prefect.yaml`` as :mod:`elastune.infra.ui_check` does, and a process worker on its pool; runs
the ``tune`` deployment as the UI's *Run* button does, on ``examples/digits.yaml`` cut to a
3-epoch ladder (6 segments, a minute on a laptop's CPU) with its stores in a temporary
folder; then ``mlflow server`` on loopback over the job's SQLite store. Headless Chromium
opens the flow run's page (its Logs, Task Runs and Artifacts tabs) and the MLflow
experiment's runs, checks that each page shows the job's log lines, run names and artifact
keys, and saves a screenshot of each in ``--out`` (``prefect-logs.png``,
``prefect-task-runs.png``, ``prefect-artifacts.png``, ``mlflow-runs.png``). It prints
what it found, exits 1 when something is missing (2 without Chromium), and stops every
process it started whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from elastune.infra.server import (
    MLFLOW_SERVER_ENV,
    free_port,
    running_worker,
    stop_group,
    wait_healthy,
)
from elastune.infra.ui_check import (
    ATTEMPTS,
    BUDGET_MS,
    CHROMIUM,
    POOL,
    WINDOW,
    chromium,
    deployed_server,
    page_texts,
    shrink,
)

JOB_FILE = "examples/digits.yaml"
EXPERIMENT, METRIC = "digits-cnn", "val_accuracy"  # the job file's name and metric
JOB_TIMEOUT = 600.0
MLFLOW_START_TIMEOUT = 120.0
# The flow run's story is INFO (flows/job_log.py); a worker's default, said out loud since
# the isolated environment of infra/server.py quiets Prefect to warnings.
STORY_LOGGING = {"PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO"}


@dataclass
class View:
    """One page to open: what it must show and where its screenshot goes."""

    name: str  # the screenshot's file stem
    url: str
    expected: list[str]  # texts some text node of the page must contain
    height: int = WINDOW[1]
    shown: dict[str, bool] = field(default_factory=dict)

    @property
    def missing(self) -> list[str]:
        return [f"{self.name}: {text!r}" for text, seen in self.shown.items() if not seen]


def look(view: View, out: Path) -> View:
    """Open ``view`` (longer on each attempt, the UI's API calls can be slow), note which
    expected texts it shows and save its screenshot to ``out``."""
    out.unlink(missing_ok=True)  # a stale file must not pass for a new screenshot
    size = f"--window-size={WINDOW[0]},{view.height}"
    for attempt in range(ATTEMPTS):
        budget = f"--virtual-time-budget={BUDGET_MS * 2**attempt}"
        html = chromium(view.url, size, budget, "--dump-dom", f"--screenshot={out.resolve()}")
        texts = page_texts(html)
        view.shown = {text: any(text in t for t in texts) for text in view.expected}
        if not view.missing:
            break
    if not out.exists():
        raise RuntimeError(f"chromium wrote no screenshot of {view.url}")
    shrink(out)
    return view


def run_tune(api: str, stores: Path) -> Any:
    """Run the ``tune`` deployment on :data:`JOB_FILE` and wait for it; its flow run."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    overrides = [
        "scheduler.max_resource=3",
        f"tracking.mlflow_uri=sqlite:///{stores}/mlflow.db",
        f"tracking.optuna_storage=sqlite:///{stores}/optuna.db",
    ]
    with temporary_settings({PREFECT_API_URL: api}):
        run = run_deployment(
            "tune/tune",
            parameters={"job_file": JOB_FILE, "overrides": overrides},
            timeout=JOB_TIMEOUT,
            poll_interval=2,
        )
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(run.id)  # with the name the flow gave it
    if not run.state or not run.state.is_completed():
        raise RuntimeError(f"the tune flow run ended {run.state_name}: {run.state}")
    return run


def wait_for_log(api: str, flow_run_id: Any, text: str, timeout: float = 60.0) -> None:
    """Wait until a log line of the flow run holds ``text`` on the server (or ``timeout``
    passes: the check then reports the line missing)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    deadline = time.monotonic() + timeout
    flow_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            newest = client.read_logs(log_filter=flow_run, limit=20, sort=LogSort.TIMESTAMP_DESC)
            if any(text in log.message for log in newest):
                return
            time.sleep(1)


def prefect_views(base_url: str, api: str, run: Any) -> list[View]:
    """The flow run's tabs, expecting its story, its task runs and its artifacts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    job_id = run.name
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
        )
    page = f"{base_url}/v2/runs/flow-run/{run.id}"
    story = [
        f"job {job_id}: hyperband on local",
        "stage b0-r0 started",
        "promoted from rung 0",
        "best so far: val_accuracy",
        f"job {job_id} done",
    ]
    return [
        View("prefect-logs", f"{page}?tab=Logs", [job_id, *story], height=4000),
        View("prefect-task-runs", f"{page}?tab=TaskRuns", sorted({t.name for t in tasks})),
        View("prefect-artifacts", f"{page}?tab=Artifacts", [f"{job_id}-leaderboard"]),
    ]


@contextlib.contextmanager
def mlflow_ui(store: Path) -> Iterator[str]:
    """``mlflow server`` on loopback over the SQLite store ``store``; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--backend-store-uri", f"sqlite:///{store}"]
    log = store.with_suffix(".log")
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **MLFLOW_SERVER_ENV},
        )  # fmt: skip
    try:
        wait_healthy(process, f"{url}/health", MLFLOW_START_TIMEOUT, log)
        yield url
    finally:
        stop_group(process, signal.SIGTERM)


def mlflow_view(url: str, job_id: str) -> View:
    """The experiment's runs: the job's parent run and its trial runs."""
    from mlflow import MlflowClient

    client = MlflowClient(url)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id], f"tags.`elastune.job_id` = '{job_id}'")
    names = sorted({r.info.run_name for r in runs})
    # Sorted by time, the list folds the trial runs under their parent; sorted by the
    # metric, it lists every run, best trial first (the parent, which has none, last).
    order = f"orderByKey={quote(f'metrics.`{METRIC}`')}&orderByAsc=false"
    page = f"{url}/#/experiments/{experiment.experiment_id}/runs?{order}"
    return View("mlflow-runs", page, names)


def check_job_ui(out: Path) -> list[View]:
    """The whole check; screenshots in the folder ``out``. Every process is stopped."""
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="elastune-ui-job-") as scratch,
        deployed_server() as base_url,
    ):
        stores, api = Path(scratch), f"{base_url}/api"
        with running_worker(api, POOL, stores / "worker", **STORY_LOGGING):
            run = run_tune(api, stores)
            # The run ends before its process ships its last log lines; stopping the worker
            # first could lose them.
            wait_for_log(api, run.id, f"job {run.name} done")
        views = prefect_views(base_url, api, run)
        with mlflow_ui(stores / "mlflow.db") as url:
            views.append(mlflow_view(url, run.name))
            return [look(view, out / f"{view.name}.png") for view in views]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elastune.infra.ui_job", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        print(f"{CHROMIUM} not found: apt-get install -y chromium", file=sys.stderr)
        return 2
    # A SIGTERM unwinds like Ctrl-C, through the blocks that stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    views = check_job_ui(args.out)
    missing = [gap for view in views for gap in view.missing]
    for view in views:
        print(view.url)
        for text, seen in view.shown.items():
            print(f"  {'shown  ' if seen else 'MISSING'} {text}")
    for gap in missing:
        print(f"missing: {gap}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
