"""The CUDA path, on a machine with an NVIDIA GPU (skipped elsewhere: CI has none).

A segment trains on ``cuda:0``; its checkpoint, written from CUDA tensors, resumes on the
CPU and back; a trial trained on a share of the GPU resumes at a whole GPU; concurrent
segments of a local job are handed the machine's devices; MPS is detected when its daemon
runs. Segments train in worker processes alike in local jobs and on warm nodes: forked
with no CUDA set up (``elastune run`` and a node fork themselves, even when a trainable's
module asks about CUDA at import); a segment that dies on the GPU (out of memory, a
device-side assert, a segfault) fails its trial alone, its worker replaced by a new one;
the devices a segment took are given back when it ends. Run on a GPU machine:
``pytest -m cuda``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import elastune.flows.pools
from elastune.planners.search import Segment
from elastune.planners.staging.devices import LocalDevices
from elastune.tasks.contract import JobRef
from elastune.tasks.gpus import mps_running
from elastune.tasks.tracking import Tracker
from elastune.tasks.train import run_segment
from elastune.tasks.worker_processes import NVML_CHECK
from tests.helpers.jobs import (
    POOL_JOB,
    ROOT,
    overlaps,
    run_device_job,
    run_four_segments,
    runs_by_trial,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


def trial_run(store: str, trainable: str, max_resource: float = 4) -> tuple[JobRef, Tracker, str]:
    job = JobRef("job", trainable, "val_accuracy", "max", max_resource, store, "cuda")
    tracker = Tracker(store, "cuda")
    parent = tracker.start_job(job.job_id, {}, {})
    return job, tracker, tracker.start_trial(job.job_id, parent, 0, {})


def test_a_checkpoint_written_on_cuda_resumes_on_cpu_and_back(store):
    job, tracker, run_id = trial_run(store, "tests.trainables:device_counter", 6)
    config = {"x": 0.5}
    legs = [(0, 2, "cuda:0"), (2, 4, "cpu"), (4, 6, "cuda:0")]
    for start, stop, device in legs:
        report = run_segment(job, Segment(0, start, stop, rung=0), config, run_id, device=device)
        assert report.error is None and not report.result.failed, report.error
        # The trial's state counts every epoch it ever trained: it resumed, not restarted.
        counted = tracker.metric_history(run_id, "epochs_trained")
        assert [v for s, v in sorted(counted) if s > start] == [
            float(s + 1) for s in range(start, stop)
        ]
        on_cuda = {v for s, v in tracker.metric_history(run_id, "on_cuda") if start < s <= stop}
        assert on_cuda == {1.0 if device.startswith("cuda") else 0.0}
    # The checkpoint holds the CUDA tensors as written; loading maps them where asked.
    loaded = tracker.load_checkpoint(run_id, lambda f: torch.load(f, weights_only=True))
    assert loaded is not None and loaded[0] == 6
    assert loaded[1]["state"]["model"]["bias"].is_cuda


def test_digits_trains_on_cuda_and_resumes_at_another_width(store):
    job, tracker, run_id = trial_run(store, "examples.digits:train")
    config = {"lr": 0.003, "width": 8, "dropout": 0.0, "optimizer": "adam", "batch_size": 128}
    shared = run_segment(job, Segment(0, 0, 2, rung=0, gpus=0.5), config, run_id)
    assert shared.error is None and [r for r, _ in shared.result.history] == [1, 2]
    tags = tracker.client.get_run(run_id).data.tags
    assert tags["elastune.gpus"] == "0.5"
    assert tags["elastune.gpu_sharing"] == ("mps" if mps_running() else "time-slicing")
    whole = run_segment(job, Segment(0, 2, 4, rung=1, gpus=1), config, run_id)
    assert whole.error is None and [r for r, _ in whole.result.history] == [3, 4]
    assert tracker.client.get_run(run_id).data.tags["elastune.gpus"] == "1"
    losses = [v for _, v in sorted(tracker.metric_history(run_id, "val_loss"))]
    assert losses[-1] < 0.8 * losses[0]  # it went on learning from where it stopped


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_local_job_hands_its_segments_the_machines_devices(tmp_path, stores, capsys, monkeypatch):
    log = tmp_path / "devices.log"
    monkeypatch.setenv("ELASTUNE_TEST_DEVICES", str(log))
    monkeypatch.setenv("ELASTUNE_TEST_EPOCH_SECONDS", "0.3")
    assert run_four_segments(tmp_path, stores, capsys, "device_counter") == 4
    rows = [line.split() for line in log.read_text().splitlines()]
    devices = torch.cuda.device_count()
    assert {device for _, device, _, _ in rows} <= {f"cuda:{d}" for d in range(devices)}
    spans = [(float(b), float(e), device) for _, device, b, e in rows]
    overlapping = overlaps(spans)
    assert overlapping, "no two segments trained at once"
    if devices > 1:  # with devices enough, concurrent segments never share one
        assert all(a[2] != b[2] for a, b in overlapping)


# Trials 0, 1 and 2 die on the GPU (tests.trainables.dies_on_the_gpu), 3 and 4 train.
FAULTS = "oom,assert,segfault"


def worker_rows(log: Path) -> list[tuple[int, int, int, str, str]]:
    """(trial, worker pid, CUDA set up before, device, server) of each segment, in order."""
    rows = [line.split() for line in log.read_text().splitlines()]
    return [(int(t), int(pid), int(cuda), device, server) for t, pid, cuda, device, server in rows]


def assert_replaced_after_each_fault(rows: list[tuple[int, int, int, str, str]]) -> None:
    """Each faulty trial's worker was retired: the next trial trained in a new worker, which
    had no CUDA set up; the healthy one was kept for trial 4, its CUDA context with it."""
    assert [t for t, *_ in rows] == [0, 1, 2, 3, 4]
    pids = [pid for _, pid, *_ in rows]
    assert len(set(pids[:4])) == 4 and pids[4] == pids[3], pids
    assert [cuda for _, _, cuda, _, _ in rows] == [0, 0, 0, 0, 1]
    assert all(device.startswith("cuda:") for *_, device, _ in rows)


def assert_gpu_faults(errors: list[str | None]) -> None:
    """The five trials' errors: one for each way trials 0-2 died, none for 3 and 4."""
    assert "out of memory" in errors[0].lower(), errors[0]
    assert "device-side assert triggered" in errors[1], errors[1]
    assert errors[2].endswith("was killed by SIGSEGV"), errors[2]
    assert errors[3:] == [None, None]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_segment_that_dies_on_the_gpu_fails_its_trial_alone_in_a_local_job(
    tmp_path, stores, capsys, monkeypatch
):
    log = tmp_path / "workers.log"
    monkeypatch.setenv("ELASTUNE_TEST_WORKERS", str(log))
    monkeypatch.setenv("ELASTUNE_TEST_GPU_FAULTS", FAULTS)
    made: list[LocalDevices] = []

    class Recorded(LocalDevices):
        def __init__(self, count: int) -> None:
            super().__init__(count)
            made.append(self)

    monkeypatch.setattr(elastune.flows.pools, "LocalDevices", Recorded)
    scheduler = {"name": "random", "max_resource": 2, "max_trials": 5}
    summary = run_device_job(tmp_path, stores, capsys, "dies_on_the_gpu", scheduler, 1)
    assert summary["trials"] == 5 and summary["best"]["trial"] in (3, 4)
    runs = runs_by_trial(tmp_path, summary)
    assert [runs[str(t)].info.status for t in range(5)] == ["FAILED"] * 3 + ["FINISHED"] * 2
    assert_gpu_faults([runs[str(t)].data.tags.get("elastune.error") for t in range(5)])
    rows = worker_rows(log)
    assert_replaced_after_each_fault(rows)
    assert {server for *_, server in rows} == {"started"}  # this process's own server
    # Every device a segment took was given back when it ended, the failed ones' too.
    assert made and all(devices.load == [0.0] * len(devices.load) for devices in made)


# A warm node (python -m elastune.flows.segment) up to its serve(), which here sets up the
# node as serve() does and sends it five segments, one at a time, instead of serving a pool.
NODE = """
import json, sys, time
import elastune.flows.segment as node
from elastune.planners.search import Segment
from elastune.planners.staging.devices import LocalDevices
from elastune.tasks.contract import JobRef, report_name
from elastune.tasks.fence import token
from elastune.tasks.gpus import cuda_devices
from elastune.tasks.tracking import Tracker
from elastune.tasks.worker_processes import WorkerProcesses

async def five_segments(pool, me, storage, threads=None):
    node._devices, node._gate = LocalDevices(cuda_devices()), node.GpuGate(me.gpus)
    node._workers = WorkerProcesses(1)
    store = sys.argv[1]
    job = JobRef("job", "tests.trainables:dies_on_the_gpu", "val_accuracy", "max", 2, store, "w")
    tracker = Tracker(store, "w")
    parent = tracker.start_job("job", {}, {})
    for trial in range(5):
        run_id = tracker.start_trial("job", parent, trial, {"x": 0.5})
        segment = Segment(trial, 0, 2, rung=0)
        fence = token(0, int(time.time() * 1000), 1)
        node.warm_segment.fn(job, segment, {"x": 0.5}, run_id, fence)
        error = tracker.load_report(run_id, report_name(segment))["error"]
        seen = {"error": error, "load": node._devices.load, "free": node._gate.free}
        print(json.dumps(seen), flush=True)
    node._workers.close()

node.serve = five_segments
node.main(["--pool", "warm", "--node", "node-0", "--gpus", "1", "--storage", "unused"])
"""


def run_fresh(argv: list[str], cwd: Path, **env: str) -> str:
    """``argv`` in a fresh process, the repository importable and ``env`` added, as a user
    starts it: without the NVML check, which the command sets itself; its stdout."""
    environ = {k: v for k, v in os.environ.items() if k != NVML_CHECK}
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        env={**environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_a_segment_that_dies_on_the_gpu_fails_its_trial_alone_on_a_warm_node(tmp_path):
    log = tmp_path / "workers.log"
    store = f"sqlite:///{tmp_path}/mlflow.db"
    out = run_fresh(
        ["-c", NODE, store],
        ROOT,
        ELASTUNE_TEST_WORKERS=str(log),
        ELASTUNE_TEST_GPU_FAULTS=FAULTS,
    )
    seen = [json.loads(line) for line in out.splitlines()]
    assert_gpu_faults([s["error"] for s in seen])
    # Each segment gave back its devices and its share of the node's GPUs as it ended.
    assert all(s["free"] == 1.0 and s["load"] == [0.0] * len(s["load"]) for s in seen)
    rows = worker_rows(log)
    assert_replaced_after_each_fault(rows)
    assert {server for *_, server in rows} == {"forked"}  # a fork of the node itself


# A trainable's module that asks about CUDA when it is imported, before `elastune run` forks.
ASKS_AT_IMPORT = """
import torch
from tests.trainables import dies_on_the_gpu as train
CUDA = torch.cuda.is_available()
"""


@pytest.mark.slow
def test_elastune_run_forks_its_workers_before_cuda_is_set_up(tmp_path, prefect_api):
    (tmp_path / "asks_at_import.py").write_text(ASKS_AT_IMPORT)
    log = tmp_path / "workers.log"
    job = {
        **POOL_JOB,
        "trainable": "asks_at_import:train",
        "scheduler": {"name": "random", "max_resource": 2, "max_trials": 2},
        "compute": {"workers": 1},
        "tracking": {"mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    command = ["-m", "elastune.flows.cli", "run", "job.yaml", "--json"]
    out = run_fresh(command, tmp_path, PREFECT_API_URL=prefect_api, ELASTUNE_TEST_WORKERS=str(log))
    summary = json.loads(out)
    runs = runs_by_trial(tmp_path, summary)
    assert [runs[t].info.status for t in "01"] == ["FINISHED", "FINISHED"]
    assert all(runs[t].data.metrics["on_cuda"] == 1.0 for t in "01")
    # One worker, a fork of the command made before anything set CUDA up: the first
    # segment set it up, and the second found it there.
    rows = worker_rows(log)
    assert [(t, cuda, server) for t, _, cuda, _, server in rows] == [
        (0, 0, "forked"),
        (1, 1, "forked"),
    ]
    assert rows[0][1] == rows[1][1] and rows[0][3].startswith("cuda:")


CHILD = """
import sys, torch
from elastune.planners.search import Segment
from elastune.tasks.tracking import Tracker
from elastune.tasks.contract import JobRef
from elastune.tasks.train import run_segment
store = sys.argv[1]
job = JobRef("job", "tests.trainables:device_counter", "val_accuracy", "max", 2, store, "mps")
tracker = Tracker(store, "mps")
run_id = tracker.start_trial("job", tracker.start_job("job", {}, {}), 0, {})
report = run_segment(job, Segment(0, 0, 2, rung=0, gpus=0.5), {"x": 0.5}, run_id)
assert report.error is None, report.error
print(tracker.client.get_run(run_id).data.tags["elastune.gpu_sharing"])
"""


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="no MPS here")
def test_mps_is_detected_when_its_daemon_runs(tmp_path, monkeypatch):
    pipes, logs = tmp_path / "pipe", tmp_path / "log"
    pipes.mkdir()
    logs.mkdir()
    env = {
        **os.environ,
        "CUDA_MPS_PIPE_DIRECTORY": str(pipes),
        "CUDA_MPS_LOG_DIRECTORY": str(logs),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipes))
    assert not mps_running()
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    try:
        deadline = time.monotonic() + 10
        while not mps_running() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mps_running()
        # A segment on a GPU share, in a process that is an MPS client, trains and says so.
        store = f"sqlite:///{tmp_path}/mlflow.db"
        child = subprocess.run(
            [sys.executable, "-c", CHILD, store], env=env, capture_output=True, text=True
        )
        assert child.returncode == 0, child.stderr[-2000:]
        assert child.stdout.strip().splitlines()[-1] == "mps"
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env)
    deadline = time.monotonic() + 10
    while mps_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not mps_running()


def test_cuda_checkpoint_bytes_load_on_a_cpu_only_reader():
    """What a CPU-only driver does with a checkpoint a GPU worker wrote."""
    state = torch.nn.Linear(2, 2).to("cuda:0").state_dict()
    buffer = io.BytesIO()
    torch.save({"resource": 1, "state": {"model": state}}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cpu", weights_only=True)
    assert not loaded["state"]["model"]["weight"].is_cuda
