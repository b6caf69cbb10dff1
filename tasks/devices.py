"""The GPUs of this machine as a segment sees them: how many CUDA devices, and whether
NVIDIA's MPS daemon shares them (tasks/train.py tags a shared segment's run with it)."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def cuda_devices() -> int | None:
    """CUDA devices on this machine; None without CUDA (data-parallel ranks are then CPU
    processes, as many as asked for)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else None


def mps_running() -> bool:
    """Is an NVIDIA MPS control daemon serving this machine? While it runs, its pid is in
    ``nvidia-cuda-mps-control.pid`` in ``$CUDA_MPS_PIPE_DIRECTORY`` (default
    ``/tmp/nvidia-mps``). Its ``control`` socket outlives a daemon that quit, and the pid
    file one that was killed, so the pid must also be a live process."""
    pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    try:
        pid = int(Path(pipes, "nvidia-cuda-mps-control.pid").read_text())
        os.kill(pid, 0)  # signal 0: does the process exist?
    except PermissionError:  # it exists, run by another user
        return True
    except (OSError, ValueError):
        return False
    return True
