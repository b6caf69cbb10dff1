"""A local ``elastune run`` killed (SIGKILL, or SIGTERM to its process group) leaves no
Prefect server behind, and ends at once (the ephemeral server is a child that
dies with its command and outlives a signal to the command's group, flows/ephemeral.py);
a killed ``elastune profile`` leaves none of its calibration runs."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from elastune.infra.server import new_database
from tests.helpers.processes import (
    ROOT,
    alive,
    children,
    cmdline,
    descends,
    is_server,
    running,
    wait_for,
)

pytestmark = pytest.mark.slow


def job_here(
    tmp_path: Path, trainable: str, scheduler: dict, compute: dict | None = None, **env: str
) -> dict[str, str]:
    """``tmp_path/job.yaml`` of ``tests.trainables:<trainable>``, its stores and Prefect home
    in ``tmp_path``; the environment a command runs it in, with ``env`` added."""
    job = {
        "name": trainable,
        "trainable": f"tests.trainables:{trainable}",
        "metric": "val_accuracy",
        "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
        "scheduler": scheduler,
        "compute": compute or {},
        "tracking": {
            "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db",
            "optuna_storage": f"sqlite:///{tmp_path}/optuna.db",
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    new_database(tmp_path / "prefect.db")  # a used home's: the server does not migrate it
    here = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return here | {"PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path), **env}


def start(tmp_path: Path, command: str, env: dict[str, str], stderr: int) -> subprocess.Popen:
    """``elastune <command> job.yaml`` in a process group of its own, so that the test can
    clean up whatever happens."""
    return subprocess.Popen(
        [sys.executable, "-m", "elastune.flows.cli", command, str(tmp_path / "job.yaml")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


@contextlib.contextmanager
def training_run(
    tmp_path: Path, trainable: str, scheduler: dict, stderr: int, compute: dict | None = None
) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """``elastune run`` of ``tests.trainables:<trainable>`` (:func:`job_here`): yielded once
    it trains, with its ephemeral server's pids; its group is killed after, whatever
    happened."""
    log = tmp_path / "epochs.log"
    env = job_here(tmp_path, trainable, scheduler, compute, ELASTUNE_TEST_LOG=str(log))
    driver = start(tmp_path, "run", env, stderr)
    try:
        assert wait_for(lambda: log.exists() and log.read_text().strip(), 180), "never trained"
        servers = [pid for pid in children(driver.pid) if is_server(pid)]
        assert servers, "the run started no ephemeral server"
        yield driver, servers
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("how", "to_group", "seconds"),
    [
        # The driver alone: it cannot stop anything itself.
        pytest.param(signal.SIGKILL, False, 15, id="sigkill-driver"),
        # Its process group, as `timeout` and service managers do.
        pytest.param(signal.SIGTERM, True, 30, id="sigterm-group"),
    ],
)
def test_a_killed_run_leaves_no_prefect_server(
    tmp_path: Path, how: signal.Signals, to_group: bool, seconds: float
) -> None:
    endless = {"max_trials": None, "max_resource": 9}
    with training_run(tmp_path, "logged_quadratic", endless, subprocess.DEVNULL) as run:
        driver, servers = run
        if to_group:
            os.killpg(driver.pid, how)
        else:
            driver.send_signal(how)
        # A driver whose server went first would retry the API for minutes before it ended.
        driver.wait(seconds)
        assert wait_for(lambda: not any(alive(pid) for pid in servers), 15), "server left"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_killed_profile_leaves_no_calibration_run(tmp_path: Path, how: signal.Signals) -> None:
    """``elastune profile`` runs its calibration jobs as ``elastune run`` children: killed
    while one trains, it leaves neither that run nor the run's server; SIGTERM ends it as
    Ctrl-C does; either way, its throwaway folders are removed."""
    pids, scratch = tmp_path / "pids.log", tmp_path / "tmp"
    scratch.mkdir()
    sha = {"name": "sha", "eta": 3, "max_resource": 3}
    env = job_here(
        tmp_path, "pid_logged_quadratic", sha, ELASTUNE_TEST_PIDS=str(pids), TMPDIR=str(scratch)
    )
    profile = start(tmp_path, "profile", env, subprocess.DEVNULL)
    servers: list[int] = []

    def trained() -> set[int]:  # the workers that trained: the profile's own, then a run's
        lines = pids.read_text().splitlines() if pids.exists() else []
        return {int(line.split()[0]) for line in lines}

    def training() -> list[int]:  # the calibration run whose worker trains
        runs = [
            pid for pid in children(profile.pid) if b"elastune.flows.cli\x00run\x00" in cmdline(pid)
        ]
        return [run for run in runs if any(descends(pid, run) for pid in trained())]

    def folders() -> list[Path]:  # the calibration runs' throwaway folders (torch's cache aside)
        return [folder for folder in scratch.iterdir() if (folder / "job.yaml").exists()]

    try:
        assert wait_for(training, 180), "never calibrated"
        (tmp_path / "pids.log.hold").touch()  # the run holds its first epoch from now on
        (run,) = training()
        workers = [pid for pid in trained() if descends(pid, run)]
        servers = [pid for pid in children(run) if is_server(pid)]
        assert servers and alive(run) and folders()
        profile.send_signal(how)
        assert profile.wait(15) == (1 if how == signal.SIGTERM else -how)
        # SIGKILL: the run gets SIGTERM from its watchdog, and SIGKILL 5 s later.
        assert wait_for(lambda: not alive(run), 20), "calibration run left"
        assert wait_for(lambda: not any(alive(pid) for pid in workers), 15), "worker left"
        assert wait_for(lambda: not any(alive(pid) for pid in servers), 15), "server left"
        assert wait_for(lambda: not folders(), 15), "throwaway folder left"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(profile.pid, signal.SIGKILL)
        for pid in servers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_threads_a_trial_left_or_blocked_in_a_c_call_hold_up_neither_job_nor_exit(
    tmp_path: Path,
) -> None:
    """A trial's call blocked in C cannot be interrupted: its segment ends at its limit (the
    trial fails, its task run ends) and its worker is killed; the job goes on and ends.
    Threads a trial left running (not daemons) end with their workers, and the one the
    command's own call of the trainable leaves (to register the best model) does not hold up
    its exit: Python joins every non-daemon thread before the exit handlers that stop the
    command's server. No worker outlives the command."""
    short = {"name": "sha", "eta": 3, "max_resource": 3, "max_trials": 3}
    compute = {"workers": 2, "segment_timeout": "2s"}
    run = training_run(tmp_path, "leaves_a_thread", short, subprocess.PIPE, compute)
    with run as (driver, servers):
        _, err = driver.communicate(timeout=180)  # trial 0 sleeps an hour
        assert driver.returncode == 0, err
        assert "exiting without threads still running: left-by-a-trial\n" in err
        assert wait_for(lambda: not any(alive(pid) for pid in servers), 15), "server left"
        assert wait_for(lambda: not running(tmp_path / "job.yaml"), 15), "worker left"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("leaves_a_thread").experiment_id
    runs = client.search_runs([experiment], "tags.elastune.trial = '0'")
    assert [r.info.status for r in runs] == ["FAILED"]
    assert runs[0].data.tags["elastune.error"] == "timeout: segment ran over 2 s"
    trained = (tmp_path / "epochs.log").read_text().splitlines()
    assert trained and all(line.split()[0] != "0" for line in trained)
    with contextlib.closing(sqlite3.connect(tmp_path / "prefect.db")) as db:
        states = db.execute("SELECT name, state_name FROM task_run").fetchall()
    assert ("trial-0 0→1", "Completed") in states, states  # with its failed report


# A process that runs a flow on the early server, then looks at what Prefect was left with.
POINTED = """
import sys, threading
from prefect import flow
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL, get_current_settings
from elastune.flows.ephemeral import early_server

@flow
def one() -> int:
    return 1

seen = []
with early_server() as ready:
    ready()
    inside = PREFECT_API_URL.value()
    # A thread without a copied context reads the process-wide settings.
    thread = threading.Thread(target=lambda: seen.append(get_current_settings().api.url))
    thread.start(); thread.join()
    assert one() == 1
print(inside.startswith("http://127.0.0.1:"), seen == [inside])
print(PREFECT_API_URL.value(), len(EventsWorker._instances))
print("prefect.server.api.server" in sys.modules)
"""


def test_a_command_points_prefect_at_its_server_and_back(tmp_path: Path) -> None:
    """The command's flow runs on the early server through Prefect's settings, in every
    thread, without Prefect's server module (1.2-1.7 s to import) or a server of Prefect's
    own; afterwards its events worker is gone and the settings are back, so a later command
    of the process that names another server reaches that one."""
    stdout = run_script(POINTED, tmp_path)
    assert stdout.split("\n")[:3] == ["True True", "None 0", "False"], stdout


def run_script(script: str, home: Path, **settings: str) -> str:
    """The standard output of ``script`` run by a fresh Python with no Prefect server
    settings of this process, its Prefect home ``home`` (with a migrated database, as a
    user's is after the first run) and ``settings`` added."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PREFECT_API_URL" and not k.startswith("PREFECT_SERVER_SERVICES")
    }
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(home), **settings)
    new_database(home / "prefect.db")  # a used home's: the server does not migrate it
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# A process whose early server has answered before the command waits for it.
ANSWERED_FIRST = """
import os, sys
from pathlib import Path
import elastune.flows.ephemeral as ephemeral
from elastune.infra.server import wait_healthy

started = ephemeral.start_server

def answered_first():
    port, server, stop = started()
    wait_healthy(server, f"http://127.0.0.1:{port}/api/health", 120, Path(os.devnull))
    return port, server, stop

ephemeral.start_server = answered_first
before = [module in sys.modules for module in ephemeral.WARM]
with ephemeral.early_server() as ready:
    ready()
print(before, [module in sys.modules for module in ephemeral.WARM])
"""


def test_the_command_imports_what_the_job_imports_later_however_soon_the_server_answers(
    tmp_path: Path,
) -> None:
    """What every job imports later is imported before the job starts, also when the
    server has answered first: left to the job, it landed in the job's first segment or not
    by that race, and a job's wall moved by a second from one run to the next."""
    stdout = run_script(ANSWERED_FIRST, tmp_path)
    assert stdout.strip().splitlines()[-1] == "[False, False] [True, True]", stdout


# A process that runs a flow of task runs on the early server, then reads what it recorded.
RECORDED = """
import time
from prefect import flow, task
from prefect.client.orchestration import get_client
from elastune.flows.ephemeral import early_server

@task
def nothing() -> None:
    return None

@flow
def twenty() -> None:
    for _ in range(20):
        nothing.submit().result()

with early_server() as ready:
    ready()
    twenty()
    with get_client(sync_client=True) as client:
        recorder = client.request("GET", "/admin/settings").json()["server"]["services"][
            "task_run_recorder"
        ]
        deadline = time.monotonic() + 10
        while True:
            runs = client.read_task_runs()
            if sum(r.state_name == "Completed" for r in runs) == 20 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
print(recorder["batch_size"], recorder["flush_interval"], len(runs))
"""


@pytest.mark.parametrize(("users", "expected"), [(None, "100 1.0 20"), ("7", "7 1.0 20")])
def test_the_server_records_task_runs_in_batches_and_all_of_them(
    tmp_path: Path, users: str | None, expected: str
) -> None:
    """The command's server writes task-run states in batches (a second late at most), a
    user's own setting wins, and every task run of the flow is recorded."""
    ours = {} if users is None else {"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": users}
    stdout = run_script(RECORDED, tmp_path, **ours)
    assert stdout.strip().splitlines()[-1] == expected, stdout


# A process that starts the early server, reads its block types, then saves and loads a block.
BLOCKS = """
from prefect.client.orchestration import get_client
from prefect.filesystems import LocalFileSystem
from elastune.flows.ephemeral import early_server

with early_server() as ready:
    ready()
    with get_client(sync_client=True) as client:
        before = len(client.read_block_types())
    LocalFileSystem(basepath="/tmp").save("spool", overwrite=True)
    loaded = LocalFileSystem.load("spool").basepath
    with get_client(sync_client=True) as client:
        after = [t.slug for t in client.read_block_types()]
print(before, after, loaded)
"""


def test_the_server_registers_no_block_types_and_a_saved_block_still_works(
    tmp_path: Path,
) -> None:
    """The command's server starts without importing every Prefect collection to register
    its block types (about 1 s of its start); a block saved through it registers its own
    type, and loads back."""
    stdout = run_script(BLOCKS, tmp_path)
    assert stdout.strip().splitlines()[-1] == "0 ['local-file-system'] /tmp", stdout
