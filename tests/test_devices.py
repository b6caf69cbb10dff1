"""Local segments on a machine with several GPUs each train on devices of their own."""

from __future__ import annotations

import subprocess
import sys

import pytest

import elastune.flows.pools
import elastune.tasks.train
import elastune.tasks.worker_processes
from elastune.planners.staging import LocalDevices
from tests.helpers.jobs import overlaps, run_device_job, run_four_segments, two_devices_recorded


def test_segments_get_the_least_loaded_devices() -> None:
    devices = LocalDevices(4)
    assert devices.take(0, 1.0) == (0,)
    assert devices.take(1, 2.0) == (1, 2)
    assert devices.take(2, 1.0) == (3,)
    devices.release(1)
    assert devices.take(3, 4.0) == (0, 1, 2, 3)  # as wide as the machine: every device
    devices.release(3)
    # Shares spread over the idle devices before they double up.
    assert [devices.take(t, g) for t, g in [(4, 0.25), (5, 0.25), (6, 0.5), (7, 0.25)]] == [
        (1,),
        (2,),
        (1,),
        (2,),
    ]
    assert devices.load == [1.0, 0.75, 0.5, 1.0]


def test_more_segments_than_devices_share_them_evenly() -> None:
    devices = LocalDevices(2)
    assert [devices.take(t, 1.0) for t in range(4)] == [(0,), (1,), (0,), (1,)]
    assert devices.load == [2.0, 2.0]
    for trial in range(4):
        devices.release(trial)
    assert devices.load == [0.0, 0.0]


def test_bad_use_is_refused() -> None:
    with pytest.raises(ValueError, match="count must be >= 1, got 0"):
        LocalDevices(0)
    devices = LocalDevices(1)
    devices.take(3, 1.0)
    with pytest.raises(ValueError, match=r"trial 3 already holds devices \(0,\)"):
        devices.take(3, 1.0)
    with pytest.raises(KeyError):
        devices.release(4)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_local_job_gives_concurrent_segments_different_devices(
    tmp_path, stores, capsys, monkeypatch
) -> None:
    calls = two_devices_recorded(monkeypatch)
    monkeypatch.setenv("ELASTUNE_TEST_PIDS", str(tmp_path / "pids.log"))
    monkeypatch.setenv("ELASTUNE_TEST_EPOCH_SECONDS", "0.3")
    assert run_four_segments(tmp_path, stores, capsys, "pid_logged_quadratic") == 4
    assert len(calls) == 4
    assert {ids for _, _, ids, _, _ in calls} == {(0,), (1,)}
    overlapping = overlaps(calls)
    assert overlapping, "no two segments ran at once"
    assert all(a[2] != b[2] for a, b in overlapping)


@pytest.mark.usefixtures("prefect_api")
def test_a_trainable_left_in_a_c_call_ends_with_its_worker_and_frees_its_device(
    tmp_path, stores, capsys, monkeypatch
) -> None:
    """Trial 0's segment ends at its limit while its trainable stays blocked in C, holding
    what it put on its device: its worker is killed, so the device is free again for the
    next trial, which trains in a new worker."""
    calls = two_devices_recorded(monkeypatch)
    scheduler = {"name": "random", "max_resource": 1, "max_trials": 3}
    summary = run_device_job(
        tmp_path, stores, capsys, "blocked_in_trial_0", scheduler, 1, segment_timeout="1s"
    )
    assert summary["trials"] == 3
    assert {trial: ids for _, _, ids, trial, _ in calls} == {0: (0,), 1: (0,), 2: (0,)}
    workers = [pid for *_, pid in calls]
    assert workers[1] != workers[0] and workers[2] == workers[1]  # retired, then kept warm


def test_mps_is_running_only_while_its_daemon_lives(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    (tmp_path / "control").touch()  # the socket file outlives the daemon
    assert not elastune.tasks.gpus.mps_running()
    pid_file = tmp_path / "nvidia-cuda-mps-control.pid"
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file.write_text(str(daemon.pid))
        assert elastune.tasks.gpus.mps_running()
    finally:
        daemon.kill()
        daemon.wait()
    assert not elastune.tasks.gpus.mps_running()  # killed: its pid file stayed behind
