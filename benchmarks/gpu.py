"""Small trials packed on one GPU (Fluid): throughput of 1, 2, 4 and 8 concurrent segments.

Each segment trains ``examples/cnn.py``'s CNN (CIFAR-sized images made in memory) at a batch
size that leaves a large GPU mostly idle when it runs alone. ``k`` segments train at once on
the same device for a fixed window after a common warm-up, in three ways:

- ``processes``: one process per segment, as work-pool workers run them; without MPS the
  driver time-slices the GPU between their contexts;
- ``processes+mps``: the same under NVIDIA MPS (``nvidia-cuda-mps-control -d``, started and
  stopped here with a private pipe folder), whose clients' kernels run concurrently;
- ``threads``: one process, one thread per segment, as the local pool runs them.

Reported per (mode, k): trained samples per second summed over the segments and relative to
one segment alone (``speedup``), GPU memory (peak allocated per segment, and the device's
used memory from NVML), and mean GPU utilisation from NVML during the window.

Run (writes ``benchmarks/results/gpu.json``)::

    python benchmarks/gpu.py                 # on cuda:0
    python benchmarks/gpu.py --device cpu --seconds 2 --concurrency 1,2   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "gpu.json"
MODES = ("processes", "processes+mps", "threads")


def _segment(
    device: str, config: dict[str, Any], seconds: float, start: Any, out: Any, index: int
) -> None:
    """Warm up, wait for the others at ``start``, then train for ``seconds``; put the count."""
    import torch

    from examples.cnn import build, data, train_steps

    if device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True
    x, y, _, _ = data(config["samples"], device)
    model, optimizer = build(config, torch.device(device))
    generator = torch.Generator().manual_seed(index)
    batch = config["batch_size"]
    train_steps(model, optimizer, x[: 20 * batch], y[: 20 * batch], batch, generator)
    _sync(device)
    start.wait()
    began, samples = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        chunk = 10 * batch  # ten steps between clock reads
        train_steps(model, optimizer, x[:chunk], y[:chunk], batch, generator)
        _sync(device)
        samples += chunk
    elapsed = time.perf_counter() - began
    peak = torch.cuda.max_memory_allocated(device) if device.startswith("cuda") else 0
    out.put((index, samples, elapsed, peak))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _threads(device: str, config: dict[str, Any], seconds: float, k: int, out: Any) -> None:
    """``k`` segments as threads of one process (the local pool)."""
    import queue

    barrier = threading.Barrier(k)
    results: queue.Queue = queue.Queue()
    threads = [
        threading.Thread(target=_segment, args=(device, config, seconds, barrier, results, i))
        for i in range(k)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    while not results.empty():
        out.put(results.get())


def run_once(mode: str, k: int, device: str, config: dict[str, Any], seconds: float) -> dict:
    """``k`` concurrent segments in ``mode``; their summed throughput and the GPU's state."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if mode == "threads":
        processes = [ctx.Process(target=_threads, args=(device, config, seconds, k, out))]
    else:
        start = ctx.Barrier(k)
        processes = [
            ctx.Process(target=_segment, args=(device, config, seconds, start, out, i))
            for i in range(k)
        ]
    with gpu_sampler(device) as samples:
        for process in processes:
            process.start()
        results = [out.get(timeout=600) for _ in range(k)]
        for process in processes:
            process.join()
    throughput = sum(n / s for _, n, s, _ in results)
    row = {
        "mode": mode,
        "segments": k,
        "samples_per_s": round(throughput, 1),
        "peak_allocated_mib_per_segment": round(max(p for *_, p in results) / 2**20, 1),
    }
    if samples:
        busy = samples[len(samples) // 4 :]  # the warm-up and start-up are in the first quarter
        row["gpu_util_pct"] = round(statistics.fmean(u for u, _ in busy), 1)
        row["gpu_used_mib"] = round(max(m for _, m in samples), 1)
    return row


@contextlib.contextmanager
def gpu_sampler(device: str) -> Iterator[list[tuple[float, float]]]:
    """(utilisation %, used MiB) of the device every 0.2 s, from NVML; empty on the CPU."""
    samples: list[tuple[float, float]] = []
    if not device.startswith("cuda"):
        yield samples
        return
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(device.partition(":")[2] or 0))
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            samples.append((float(util), used))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        pynvml.nvmlShutdown()


@contextlib.contextmanager
def mps_daemon() -> Iterator[None]:
    """An MPS control daemon with private pipe and log folders, for this process's children."""
    folder = Path(tempfile.mkdtemp(prefix="elastune-mps-"))
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
    }
    for path in env.values():
        Path(path).mkdir()
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env={**os.environ, **env}, check=True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        subprocess.run(
            ["nvidia-cuda-mps-control"], input=b"quit\n", env={**os.environ, **env}, check=False
        )
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        time.sleep(1)
        shutil.rmtree(folder, ignore_errors=True)


def device_name(device: str) -> str:
    """The GPU as ``nvidia-smi`` names it (name, driver, memory), or the CPU."""
    if not device.startswith("cuda"):
        import platform

        return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[0]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    config = {
        "width": args.width,
        "batch_size": args.batch_size,
        "samples": args.samples,
        "lr": 0.05,
    }
    modes = [m for m in MODES if m != "processes+mps" or mps_available(args.device)]
    rows = []
    for mode in modes:
        with mps_daemon() if mode == "processes+mps" else contextlib.nullcontext():
            for k in args.concurrency:
                row = run_once(mode, k, args.device, config, args.seconds)
                print(json.dumps(row), flush=True)
                rows.append(row)
    alone = next(
        r["samples_per_s"] for r in rows if r["mode"] == "processes" and r["segments"] == 1
    )
    for row in rows:
        row["speedup"] = round(row["samples_per_s"] / alone, 2)
    return {
        "device": device_name(args.device),
        "config": config,
        "window_s": args.seconds,
        "baseline": "one segment alone in its own process (mode processes, 1 segment)",
        "rows": rows,
        "skipped": [] if "processes+mps" in modes else ["processes+mps: no MPS on this device"],
    }


def mps_available(device: str) -> bool:
    return device.startswith("cuda") and shutil.which("nvidia-cuda-mps-control") is not None


def print_table(result: dict[str, Any]) -> None:
    print(
        f"\n{result['device']}: CNN width {result['config']['width']}, "
        f"batch {result['config']['batch_size']}, {result['window_s']:g} s windows"
    )
    print(
        f"{'mode':<15}{'segments':>9}{'samples/s':>12}{'speedup':>9}{'util %':>8}"
        f"{'peak MiB/seg':>14}{'used MiB':>10}"
    )
    for r in result["rows"]:
        print(
            f"{r['mode']:<15}{r['segments']:>9}{r['samples_per_s']:>12.0f}{r['speedup']:>9.2f}"
            f"{r.get('gpu_util_pct', float('nan')):>8.1f}"
            f"{r['peak_allocated_mib_per_segment']:>14.1f}{r.get('gpu_used_mib', 0):>10.0f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument(
        "--concurrency", default="1,2,4,8", type=lambda s: [int(k) for k in s.split(",")]
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args(argv)
    result = measure(args)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
