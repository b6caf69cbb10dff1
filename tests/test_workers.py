"""Worker processes (tasks/worker_processes.py): calls cross, a dead or stuck worker is named and
replaced, workers see their driver as it is now, and none outlives its driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastune.tasks.worker_processes import WorkerDied, WorkerProcesses, fork_server_here

ROOT = Path(__file__).resolve().parent.parent


def test_a_worker_answers_raises_and_is_kept_warm() -> None:
    with WorkerProcesses(threads=1) as workers:
        with workers.worker() as worker:
            first = worker.call(os.getpid)
            assert first != os.getpid() and worker.call(divmod, 7, 2) == (3, 1)
            with pytest.raises(ValueError, match="invalid literal"):
                worker.call(int, "x")
        with workers.worker() as again:  # an error raised by the call is the caller's
            assert again.call(os.getpid) == first
            again.retire()
        with workers.worker() as fresh:
            assert fresh.call(os.getpid) != first


@pytest.mark.parametrize(
    ("fn", "args", "how"),
    [
        (os._exit, (3,), "exited with code 3"),
        (os.kill, (None, signal.SIGSEGV), "was killed by SIGSEGV"),
        (time.sleep, (60,), "gave no answer in 1 s; killed"),
    ],
    ids=["exit", "segfault", "stuck"],
)
def test_a_worker_that_dies_or_hangs_is_named_and_replaced(fn, args, how) -> None:
    with WorkerProcesses(threads=1) as workers:
        with workers.worker() as worker:
            pid = worker.call(os.getpid)
            args = tuple(pid if a is None else a for a in args)
            with pytest.raises(WorkerDied, match=f"worker process {pid} {how}"):
                worker.call(fn, *args, timeout=1.0)
            assert worker.retired
        with workers.worker() as next_one:
            assert next_one.call(os.getpid) != pid


def test_a_worker_sees_its_driver_as_it_is_now(tmp_path, monkeypatch) -> None:
    """The fork server started before this test; the worker gets the environment, folder
    and import path of the driver when it starts, not the server's."""
    monkeypatch.setenv("ELASTUNE_TEST_SEEN", "now")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "seen_here.py").write_text("VALUE = 5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with WorkerProcesses(threads=1) as workers, workers.worker() as worker:
        assert worker.call(os.getenv, "ELASTUNE_TEST_SEEN") == "now"
        assert worker.call(os.getcwd) == str(tmp_path)
        assert worker.call(eval, "__import__('seen_here').VALUE") == 5


# A script without `if __name__ == "__main__"`: a worker never runs it again.
FORKED = """
import os, threading
from elastune.tasks.worker_processes import WorkerProcesses, fork_server_here
IMPORTED_BEFORE_THE_FORK = 7
def seen():
    return IMPORTED_BEFORE_THE_FORK
print(fork_server_here(), flush=True)
workers = WorkerProcesses(threads=1)
with workers.worker() as worker:
    print(worker.call(os.getpid), flush=True)
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    print(fork_server_here(), flush=True)  # already has one
    print(worker.call(seen), flush=True)
    print("training", flush=True)
    worker.call(__import__("time").sleep, 3600)
"""


def test_a_fork_of_the_command_serves_its_workers_and_ends_with_it() -> None:
    """``elastune run`` forks its server once its imports are done: the workers start with
    what it imported; killed with SIGKILL, it leaves neither server nor worker."""
    command = subprocess.Popen(
        [sys.executable, "-c", FORKED],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [command.stdout.readline().strip() for _ in range(5)]
        assert lines[0] == "True" and lines[2] == "False" and lines[3] == "7", lines
        worker = int(lines[1])
        server = parent_of(worker)
        assert parent_of(server) == command.pid and lines[4] == "training"
        command.kill()
        command.wait(10)
        assert gone([server, worker], 10), "the fork server or its worker outlived the command"
    finally:
        command.kill()
        command.communicate()


def test_a_process_with_threads_forks_no_server() -> None:
    # pytest's own process runs threads (and has its server already).
    assert not fork_server_here()


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def gone(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2] != "Z":
                alive.append(pid)
        if not alive:
            return True
        time.sleep(0.1)
    return False
