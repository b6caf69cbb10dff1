"""The CUDA path, on a machine with an NVIDIA GPU (skipped elsewhere: CI has none).

A segment trains on ``cuda:0``; its checkpoint, written from CUDA tensors, resumes on the
CPU and back; a trial trained on a share of the GPU resumes at a whole GPU; concurrent
segments of a local job are handed the machine's devices; MPS is detected when its daemon
runs. Run on a GPU machine: ``pytest -m cuda``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from elastune.planners.search import Segment
from elastune.tasks.contract import JobRef
from elastune.tasks.gpus import mps_running
from elastune.tasks.tracking import Tracker
from elastune.tasks.train import run_segment
from tests.helpers.jobs import overlaps, run_four_segments

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
