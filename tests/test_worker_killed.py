"""Killed processes in work-pool mode: the process training a segment dies (SIGKILL)
mid-segment, the segment is retried from the trial's last checkpoint and the job completes.

A real `prefect server` and a warm pool of two nodes (`elastune.infra.local_cluster.warm_nodes`):
each segment is a background task run in a node's warm worker, which is the process killed
here, as a preempted instance would be; the other node (or the node's restarted worker)
retries it. A segment killed after its last checkpoint but before its report is retried and
recovers its metrics from MLflow. A driver killed while a segment runs on the pool resumes
without running that segment again: the resumed driver records the report the segment
saved, or, resumed while the segment still trains, waits for that same run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from elastune.flows.cli import main
from elastune.planners.search import Segment
from elastune.tasks.contract import JobRef, report_name
from elastune.tasks.tracking import Tracker
from elastune.tasks.train import run_segment
from tests.helpers.prefect_server import segment_runs, warm_nodes

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent

POOL = "preemptible"
EPOCH_SECONDS = 2.0  # long enough to kill the process while it trains epoch 2
JOB = {
    "name": "killed-worker",
    "trainable": "tests.trainables:pid_logged_quadratic",
    "metric": "val_accuracy",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 3},
    # One trial trained straight to 3 epochs: one segment 0 -> 3, checkpointed every epoch.
    "scheduler": {"name": "random", "max_resource": 3, "max_trials": 1},
    "compute": {"workers": 1, "pool": POOL},
}


def lines(path: Path) -> list[tuple[int, int, int]]:
    """(pid, trial, epoch) of every epoch a training process began."""
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


def kill_when_epoch_starts(log: Path, epoch: int, timeout: float = 240, node: bool = False) -> int:
    """SIGKILL the process that begins ``epoch`` (after checkpointing the one before), or
    with ``node`` the warm node worker it trains for (its segments' worker processes end
    with it); the pid that began ``epoch``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = [pid for pid, _, e in lines(log) if e == epoch]
        if started:
            os.kill(node_of(started[0]) if node else started[0], signal.SIGKILL)
            return started[0]
        time.sleep(0.05)
    raise AssertionError(f"no process began epoch {epoch} within {timeout} s")


def node_of(pid: int) -> int:
    """The warm node worker above worker process ``pid``: its farthest ancestor that runs
    ``elastune.flows.segment`` (the node's fork server is a copy of it)."""
    found = pid
    while True:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if parent <= 1:
            return found
        if b"elastune.flows.segment" in Path(f"/proc/{parent}/cmdline").read_bytes():
            found = parent
        pid = parent


@pytest.fixture(scope="module")
def worker_log(prefect_api, tmp_path_factory) -> Iterator[Path]:
    """A warm pool of two 1-slot nodes for the module; the file its training processes log
    ``pid trial epoch`` to."""
    home = tmp_path_factory.mktemp("preemptible")
    log = home / "epochs.log"
    with pytest.MonkeyPatch.context() as env:
        # The node workers inherit this environment.
        env.setenv("ELASTUNE_TEST_PIDS", str(log))
        env.setenv("ELASTUNE_TEST_EPOCH_SECONDS", str(EPOCH_SECONDS))
        with warm_nodes(prefect_api, home / "cluster", nodes=2, gpus_per_node=1, pool=POOL):
            yield log


def run_and_kill(
    tmp_path: Path, stores: list[str], capsys, log: Path, epoch: int, **changes
) -> tuple[dict, int]:
    """Run the job on the pool, killing the process that begins ``epoch`` (0: the one that
    finished training); returns the summary and the killed pid."""
    log.write_text("")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**JOB, **changes}))
    killed: list[int] = []
    killer = threading.Thread(
        target=lambda: killed.append(kill_when_epoch_starts(log, epoch, node=True))
    )
    killer.start()
    code = main(["run", str(path), "--json", *stores])
    killer.join()
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), killed[0]


def test_killed_worker_process_is_retried_from_the_checkpoint(
    tmp_path, stores, capsys, worker_log
) -> None:
    summary, victim = run_and_kill(tmp_path, stores, capsys, worker_log, epoch=2)
    assert summary["segments"] == 1 and summary["best"] is not None

    # Two processes trained the segment: the killed one got through epoch 1 and began 2;
    # the retry began at epoch 2, from the checkpoint of epoch 1, not from scratch.
    began = lines(worker_log)
    assert [e for pid, _, e in began if pid == victim] == [1, 2]
    retry = {pid for pid, _, _ in began} - {victim}
    assert len(retry) == 1
    assert [e for pid, _, e in began if pid in retry] == [2, 3]

    # MLflow holds each epoch once, and the restored state had counted epoch 1.
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name(JOB["name"]).experiment_id
    (run,) = client.search_runs([experiment], "tags.`elastune.trial` = '0'")
    history = client.get_metric_history(run.info.run_id, "epochs_trained")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert run.data.tags["elastune.status"] == "complete"

    # Prefect saw it: the segment's first warm run crashed, and the run launched again on a
    # live node (same name: the same segment) completed.
    ours = segment_runs(summary["job_id"], warm=True)
    assert sorted(r.state_name for r in ours) == ["Completed", "Crashed"]
    assert len({r.name for r in ours}) == 1


SEGMENT = """
import json, sys
from elastune.planners.search import Segment
from elastune.tasks.contract import JobRef
from elastune.tasks.train import run_segment
job, segment, run_id = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
run_segment(JobRef(**job), Segment(**segment), {"x": 0.5}, run_id)
"""


def test_segment_killed_after_its_last_checkpoint_reports_when_retried(
    tmp_path, monkeypatch
) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "linger")
    parent = tracker.start_job("linger-job", {}, {})
    run_id = tracker.start_trial("linger-job", parent, 0, {"x": 0.5})
    job = JobRef(
        "linger-job",
        "tests.trainables:lingering_quadratic",
        "val_accuracy",
        "max",
        3,
        tracker.uri,
        "linger",
    )
    segment = Segment(trial=0, start=0, stop=3, rung=0)
    log = tmp_path / "pids.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ELASTUNE_TEST_PIDS": str(log),
        "ELASTUNE_TEST_LINGER_SECONDS": "60",
    }
    args = [json.dumps(asdict(job)), json.dumps(asdict(segment)), run_id]
    process = subprocess.Popen([sys.executable, "-c", SEGMENT, *args], env=env)
    try:
        # Its training is saved (the checkpoint at 3 is the last thing the trainable writes).
        assert kill_when_epoch_starts(log, epoch=3, timeout=120) == process.pid
    finally:
        process.kill()
        process.wait()
    assert [level for level, _ in tracker.checkpoints(run_id)] == [3, 2, 1]
    assert tracker.load_report(run_id, report_name(segment)) is None

    # The segment launched again (on a live node, or by a resumed driver) resumes at 3.
    monkeypatch.setenv("ELASTUNE_TEST_PIDS", str(log))
    report = run_segment(job, segment, {"x": 0.5}, run_id)
    assert not report.result.failed, report
    assert report.result.resource == 3 and "val_accuracy" in report.metrics_seen


def elastune(api: str, *args: str) -> subprocess.Popen:
    """The CLI in its own process group (a driver the test can kill), printing JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api}
    return subprocess.Popen(
        [sys.executable, "-m", "elastune.flows.cli", *args, "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def await_line(process: subprocess.Popen, prefix: str, timeout: float) -> bool:
    """Read ``process``'s stderr until a line starts with ``prefix``; False past ``timeout``
    (the rest stays in the pipe for ``communicate``)."""
    found = threading.Event()

    def read() -> None:
        for line in process.stderr:
            if line.startswith(prefix):
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return found.wait(timeout)


def test_driver_killed_while_a_pool_segment_runs_resumes_without_rerunning_it(
    prefect_api, tmp_path, stores, worker_log
) -> None:
    worker_log.write_text("")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    driver = elastune(prefect_api, "run", str(path), *stores)
    job_id = driver.stderr.readline().split()[-1]
    # The driver dies while the worker's process trains epoch 2 of the only segment.
    deadline = time.monotonic() + 240
    while not any(e == 2 for _, _, e in lines(worker_log)) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.communicate()

    # The segment goes on without its driver and finishes, saving its report.
    def states() -> list[str]:
        return [r.state_name for r in segment_runs(job_id, warm=True)]

    while time.monotonic() < deadline and states() != ["Completed"]:
        time.sleep(0.5)
    assert states() == ["Completed"]

    resumed = elastune(
        prefect_api, "resume", job_id, "--storage", f"sqlite:///{tmp_path}/optuna.db"
    )
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    summary = json.loads(out)
    assert summary["segments"] == 1 and summary["best"] is not None
    assert len(segment_runs(job_id, warm=True)) == 1, "the finished segment ran again"


def test_driver_resumed_while_its_pool_segment_still_runs_waits_for_it(
    prefect_api, tmp_path, stores, worker_log
) -> None:
    worker_log.write_text("")
    hold = Path(f"{worker_log}.hold")
    hold.touch()  # the segment's process stays in epoch 1 until the file goes
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))

    try:
        driver = elastune(prefect_api, "run", str(path), *stores)
        job_id = driver.stderr.readline().split()[-1]
        deadline = time.monotonic() + 240
        while not lines(worker_log) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.communicate()

        # Resumed while the segment still trains: the new driver starts driving (its mode
        # line) and launches the segment again...
        resumed = elastune(
            prefect_api, "resume", job_id, "--storage", f"sqlite:///{tmp_path}/optuna.db"
        )
        if not await_line(resumed, "mode:", timeout=180):
            resumed.kill()
            raise AssertionError(resumed.communicate()[1][-4000:])
        time.sleep(3)  # ...and had it created a twin, the worker would have started it by now
        runs = segment_runs(job_id, warm=True)
        assert [r.state_name for r in runs] == ["Running"], "the segment was started twice"
    finally:
        hold.unlink()
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    summary = json.loads(out)
    assert summary["segments"] == 1 and summary["best"] is not None
    assert [r.state_name for r in segment_runs(job_id, warm=True)] == ["Completed"]
    # One process trained it, start to end.
    assert len({pid for pid, _, _ in lines(worker_log)}) == 1
