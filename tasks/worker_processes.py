"""Worker processes: where a local job's segments train, one segment at a time each.

A segment of width 1 or less trains in a worker process, not in a thread of the driver, so

- no segment waits on an interpreter lock held by another segment or by the driver
  (docs/benchmarks.md, "Useful work");
- a trainable that takes its process down (a segfault, the out-of-memory killer,
  ``os._exit``) fails its trial, not the job;
- on a GPU, small trials packed onto one device overlap their CPU-side work, which threads
  of one process serialise (docs/gpu.md).

Workers are forked by a fork server, so a new one starts in milliseconds with torch and
elastune imported. ``elastune run`` makes a fork of itself that server
(:func:`fork_server_here`), once its imports are done, the trainable's among them, and
before it starts a thread: nothing is imported twice, and the job's first segment starts as
soon as it would in a thread. Elsewhere (a deployment's flow run, a test) the first job
starts a server that imports torch and elastune (:func:`fork_server`), once per process,
and each worker imports the trainable. Unlike multiprocessing's, a worker never imports the
driver's ``__main__`` again: a script that runs a job needs no ``if __name__ ==
"__main__"`` guard.

CUDA: a fork of a process that has set CUDA up cannot use it, so neither server may. Both
ask torch whether there is a GPU through NVML (``PYTORCH_NVML_BASED_CUDA_CHECK``), which sets
nothing up, so a trainable's module may ask at import; one that puts a tensor on a GPU at
import leaves ``elastune run`` without its own fork, and the started server never imports
it.

A worker is kept warm for the next segment: its imports, the data its trainable caches,
its CUDA context. One whose segment failed is retired and the next segment gets a new one,
so that a trainable's broken state (a CUDA error poisons its process's context) never
reaches another trial. The fork server ends when the process that made it does, however
that one ends (SIGKILL included), and every worker with it. Workers ignore SIGINT and
SIGTERM, which reach a terminal's or a service's whole process group: the driver decides
how its job stops (flows/signals.py).

Example:
    >>> with WorkerProcesses(threads=1) as workers, workers.worker() as worker:
    ...     worker.call(divmod, 7, 2)
    (3, 1)
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from multiprocessing import process as mp_process
from multiprocessing import util as mp_util
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

import torch

# What a fork server that imports for itself imports first, so that no worker does: what
# a segment runs (elastune.tasks.train), the store its tracker builds, and torch's compiler, which
# every torch.optim optimizer imports when it is made (0.8-1.9 s; flows/ephemeral.py
# imports the same into `elastune run` before it forks its server).
PRELOAD = ("elastune.tasks.train", "mlflow.store.tracking.sqlalchemy_store", "torch._dynamo")
# A worker's pid, and its exit code (negative: the signal that ended it), as sent.
_NUMBER = struct.Struct("q")
# Set, torch asks NVML whether there is a GPU, which leaves the process fit to fork.
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


class WorkerDied(RuntimeError):
    """A worker process ended while it had a call to answer; the message says how."""


def exit_reason(code: int | None) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it).

    >>> exit_reason(-9), exit_reason(3), exit_reason(None)
    ('was killed by SIGKILL', 'exited with code 3', 'ended (its exit code is unknown)')
    """
    if code is None:
        return "ended (its exit code is unknown)"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


# --- the fork server ----------------------------------------------------------------------


class ForkServer:
    """A process that forks workers on request. ``process``: the server when it was
    started as a program (None: a fork of this process, ``pid``)."""

    def __init__(self, control: socket.socket, pid: int, process: subprocess.Popen | None):
        self._control = control
        self.pid = pid
        self._process = process
        self._lock = threading.Lock()

    def alive(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        with contextlib.suppress(ChildProcessError):
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        return False

    def start(self) -> tuple[int, socket.socket, int]:
        """A new worker: its pid, the socket to it, and the pipe its exit code arrives on."""
        with self._lock:
            try:
                self._control.sendall(b"w")
                data, fds, _, _ = socket.recv_fds(self._control, _NUMBER.size, 2)
            except OSError as exc:
                raise WorkerDied(f"the fork server (pid {self.pid}) is gone: {exc}") from None
        if len(fds) != 2:
            raise WorkerDied(f"the fork server (pid {self.pid}) is gone")
        (pid,) = _NUMBER.unpack(data)
        return pid, socket.socket(fileno=fds[0]), fds[1]


_server: ForkServer | None = None
_server_lock = threading.Lock()


def fork_server_here() -> bool:
    """Make a fork of this process, as it is now, the server its workers fork from, so
    none imports anything again. Only on Linux, only while this process runs one thread (a
    fork copies the calling thread alone, and a lock another thread held would stay held in
    the copy), and only if it has not set CUDA up (each worker sets up its own); otherwise
    :func:`fork_server` starts one when a job first needs it. True when it forked."""
    global _server
    if sys.platform != "linux" or threading.active_count() > 1 or torch.cuda.is_initialized():
        return False
    with _server_lock:
        if _server is not None and _server.alive():
            return False
        control, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            control.close()
            _serve_forks(theirs)
        theirs.close()
        _server = ForkServer(control, pid, None)
    return True


def fork_server() -> ForkServer:
    """This process's fork server; if it has none (or it died), one started now as a fresh
    interpreter that imports :data:`PRELOAD` with this process's ``sys.path``. Its first
    worker waits for those imports (a few seconds)."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive():
            control, theirs = socket.socketpair()
            code = "import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
            code += "from elastune.tasks.worker_processes import serve_forks; "
            code += "serve_forks(int(sys.argv[2]))"
            argv = [sys.executable, "-c", code, json.dumps(sys.path), str(theirs.fileno())]
            env = {NVML_CHECK: "1", **os.environ}
            process = subprocess.Popen(argv, env=env, pass_fds=[theirs.fileno()])
            theirs.close()
            _server = ForkServer(control, process.pid, process)
        return _server


def serve_forks(control_fd: int) -> NoReturn:
    """A started fork server's life: import :data:`PRELOAD`, then fork workers until its
    maker is gone."""
    for module in PRELOAD:
        __import__(module)
    gc.freeze()  # what it imported is left out of every worker's collections
    _serve_forks(socket.socket(fileno=control_fd))


def _serve_forks(control: socket.socket) -> NoReturn:
    """Fork a worker for each request on ``control``, tell each worker's exit code on the
    pipe sent with it, and end, with every worker, when ``control`` closes."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # Held by this process alone: its end of file tells every worker it is gone.
        watch_r, watch_w = os.pipe()
        wake_r, wake_w = os.pipe()  # a child's exit wakes the loop below
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        exits: dict[int, int] = {}  # worker pid -> the pipe its exit code goes to
        own = (watch_w, wake_r, wake_w)
        while True:
            ready, _, _ = select.select([control, wake_r], [], [])
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                _reap(exits)
            if control in ready:
                if not control.recv(1):
                    return  # its maker is gone
                _fork_worker(control, watch_r, [*own, *exits.values()], exits)
    finally:
        os._exit(0)


def _reap(exits: dict[int, int]) -> None:
    """Collect ended workers and send each one's exit code."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = exits.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, _NUMBER.pack(os.waitstatus_to_exitcode(status)))
            os.close(fd)


def _fork_worker(
    control: socket.socket, watch_r: int, inherited: list[int], exits: dict[int, int]
) -> None:
    mine, theirs = socket.socketpair()
    exit_r, exit_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (*inherited, exit_r, exit_w):
                os.close(fd)
            control.close()
            theirs.close()
            # As multiprocessing's own children do: none of the server's finalizers or
            # children are the worker's, and its own (the temporary folder of a forkserver
            # its segments started, tasks/distributed.py) go when it ends.
            mp_util._finalizer_registry.clear()
            mp_process._children.clear()
            code = _serve(mine, watch_r)
            mp_util._exit_function()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    mine.close()
    exits[pid] = exit_w
    socket.send_fds(control, [_NUMBER.pack(pid)], [theirs.fileno(), exit_r])
    theirs.close()
    os.close(exit_r)


# --- a worker -------------------------------------------------------------------------------


def _serve(sock: socket.socket, watch_r: int) -> int:
    """A worker's life: set up as its driver says, then answer calls until the driver
    closes the connection; it ends at once if the fork server does."""
    threading.Thread(target=_exit_when_closed, args=(watch_r,), daemon=True).start()
    conn = Connection(sock.detach())
    threads, environ, cwd, path = conn.recv()
    # The driver's environment, folder and imports now, not the fork server's.
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    sys.path[:] = path
    torch.set_num_threads(threads)
    gc.freeze()  # what the server imported is left out of every collection (flows/gc_freeze.py)
    gc.enable()
    while True:
        try:
            fn, args, kwargs = conn.recv()
        except (EOFError, ConnectionError):  # the driver closed it, or died
            return 0
        try:
            reply = ("ok", fn(*args, **kwargs))
        except BaseException as exc:  # the caller's to raise
            reply = ("raised", exc)
        try:
            conn.send(reply)
        except ConnectionError:  # the driver died meanwhile
            return 0
        except Exception as exc:  # a value or an error that does not pickle
            conn.send(("raised", RuntimeError(f"{reply[0]} {reply[1]!r}: cannot send it: {exc}")))


def _exit_when_closed(fd: int) -> None:
    """End this worker when the pipe's only writer, its fork server, is gone."""
    with contextlib.suppress(OSError):
        os.read(fd, 1)
    os._exit(1)


class WorkerProcess:
    """One worker process, answering one call at a time."""

    def __init__(self, server: ForkServer, threads: int):
        self.pid, sock, self._exit = server.start()
        self.conn = Connection(sock.detach())
        self.conn.send((threads, dict(os.environ), os.getcwd(), list(sys.path)))
        self.retired = False

    def call(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """``fn(*args, **kwargs)`` in the worker (``fn`` a module-level function): its value,
        or what it raised, raised here. :class:`WorkerDied` when the process ends first, or
        when ``timeout`` seconds pass (it is then killed)."""
        if self.retired:
            raise WorkerDied(f"worker process {self.pid} was retired")
        self.conn.send((fn, args, kwargs))
        ready = wait([self.conn, self._exit], timeout)
        reply = None
        if self.conn in ready:
            with contextlib.suppress(EOFError):  # it died before it answered: below
                reply = self.conn.recv()
        if reply is not None:
            status, value = reply
            if status == "raised":
                raise value
            return value
        code = self.retire()
        if not ready:
            raise WorkerDied(f"worker process {self.pid} gave no answer in {timeout:g} s; killed")
        raise WorkerDied(f"worker process {self.pid} {exit_reason(code)}")

    def retire(self) -> int | None:
        """End the process at once (whatever it still runs is abandoned); its exit code."""
        if self.retired:
            return None
        self.retired = True
        self.conn.close()
        if not wait([self._exit], 0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        return self.join(timeout=None)

    def join(self, timeout: float | None) -> int | None:
        """Wait up to ``timeout`` seconds for the process to end; its exit code, None if it
        still runs (or its fork server went first)."""
        if self._exit < 0 or not wait([self._exit], timeout):
            return None
        data = os.read(self._exit, _NUMBER.size)
        os.close(self._exit)
        self._exit = -1
        return _NUMBER.unpack(data)[0] if len(data) == _NUMBER.size else None


class WorkerProcesses:
    """The worker processes of one job: an idle one for each segment that starts, a new
    one when none is idle.

    Args:
        threads: torch's threads in each worker (the cores shared by the job's slots).
    """

    def __init__(self, threads: int):
        self.threads = threads
        self._idle: list[WorkerProcess] = []
        self._every: list[WorkerProcess] = []
        self._lock = threading.Lock()

    def __enter__(self) -> WorkerProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def worker(self) -> Iterator[WorkerProcess]:
        """An idle worker (or a new one) for the block, idle again after it unless it was
        retired or the block raised."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = WorkerProcess(fork_server(), self.threads)
            with self._lock:
                self._every.append(worker)
        try:
            yield worker
        except BaseException:
            worker.retire()
            raise
        finally:
            with self._lock:
                if worker in self._every:  # not closed meanwhile
                    if worker.retired:
                        self._every.remove(worker)
                    else:
                        self._idle.append(worker)

    def close(self) -> None:
        """End every worker (call it once none is busy): each leaves its loop at the end of
        its connection, or is killed 5 s later."""
        with self._lock:
            every, self._every, self._idle = self._every, [], []
        for worker in every:
            worker.conn.close()
        for worker in every:
            if worker.join(timeout=5.0) is None:
                worker.retire()


def warm_fork_server() -> None:
    """Start this process's fork server now and wait for its imports (its first worker
    answers once they are done), so that no job's clock counts them: a test session, a
    benchmark's timing."""
    with WorkerProcesses(threads=1) as workers, workers.worker() as worker:
        worker.call(os.getpid)
