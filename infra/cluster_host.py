"""One host's supervisor: it starts the host's programs, in order, each once the one before
answers, and starts again any that exits, as systemd's ``Restart=always`` or an ECS service
would. It runs inside the host's namespace (``python -m elastune.infra.netns_cluster up``
starts one per host, ``ip netns exec``), so everything it starts has the host's network
and nothing else.

``python -m elastune.infra.cluster_host SPEC`` reads the host's :class:`HostSpec` (JSON) and
its secrets file (``KEY=VALUE`` lines, mode 0600: secrets reach programs by environment,
never by their command line), writes the host's status (``status.json`` in its folder: ready
or not, each program's pid and starts) and on SIGTERM stops its programs in reverse order.
Its programs get SIGTERM if it dies, however it dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from elastune.infra.server import die_with_parent

# How long a program has to answer before the host gives up on starting (a Prefect
# server's first start on a new PostgreSQL database migrates it: tens of seconds here).
START_TIMEOUT = 240.0
RESTART_DELAY = 1.0  # a program that exits is started again this much later


@dataclass
class Program:
    """A program of a host. ``health``: ``http://...`` (any HTTP answer: it serves) or
    ``tcp://HOST:PORT`` (it accepts connections); ``once``: run to its end (exit 0) before
    the next starts, never again; ``user``: the account it runs as."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health: str | None = None
    once: bool = False
    user: str | None = None
    stop_signal: str = "SIGTERM"


@dataclass
class HostSpec:
    host: str
    folder: str
    programs: list[Program]
    env: dict[str, str] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> HostSpec:
        data = json.loads(path.read_text())
        data["programs"] = [Program(**p) for p in data["programs"]]
        return cls(**data)


def read_secrets(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of a secrets file (refused unless only its owner may read it)."""
    if not path.exists():
        return {}
    if path.stat().st_mode & 0o077:
        raise SystemExit(f"{path}: a secrets file must be mode 0600")
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}


def secrets_text(secrets: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in secrets.items())


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner alone from the first byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def answers(health: str) -> bool:
    """Does the endpoint ``health`` answer now?"""
    if health.startswith("tcp://"):
        host, port = health.removeprefix("tcp://").rsplit(":", 1)
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1.0):
            return True
        return False
    try:
        with urllib.request.urlopen(health, timeout=2.0):
            return True
    except urllib.error.HTTPError:  # it answered, if only to say no
        return True
    except (urllib.error.URLError, OSError):
        return False


def _as_user(user: str | None) -> Any:
    """``preexec_fn``: drop to ``user`` (if any), then die with the supervisor (a changed
    user clears the parent-death signal, so it is set after)."""
    account = pwd.getpwnam(user) if user else None

    def preexec() -> None:
        if account is not None:
            os.setgid(account.pw_gid)
            os.initgroups(account.pw_name, account.pw_gid)
            os.setuid(account.pw_uid)
        die_with_parent()

    return preexec


class Supervisor:
    """Runs a host's programs and restarts them until it is told to stop."""

    def __init__(self, spec: HostSpec, secrets: dict[str, str]):
        self.spec = spec
        self.folder = Path(spec.folder)
        self.env = {**os.environ, **spec.env, **secrets}
        self.running: dict[str, subprocess.Popen] = {}
        self.starts: dict[str, int] = {}
        self.ready = False
        self.stopping = threading.Event()

    def start(self, program: Program) -> subprocess.Popen:
        log = (self.folder / f"{program.name}.log").open("a")
        process = subprocess.Popen(
            program.argv,
            env={**self.env, **program.env},
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_as_user(program.user),
        )
        log.close()
        self.running[program.name] = process
        self.starts[program.name] = self.starts.get(program.name, 0) + 1
        self.write_status()
        return process

    def bring_up(self) -> None:
        """Start every program in order. One that serves is waited for (until it answers)
        only before the next one-off step and at the end, so servers that do not need each
        other start side by side (Prefect's and MLflow's each migrate their database)."""
        pending: list[tuple[Program, subprocess.Popen]] = []
        for program in self.spec.programs:
            if program.once:
                self.await_health(pending)
            process = self.start(program)
            if not program.once:
                pending.append((program, process))
                continue
            code = process.wait(START_TIMEOUT)
            if code != 0:
                raise SystemExit(f"{program.name} exited with {code}: {self.tail(program)}")
            del self.running[program.name]
        self.await_health(pending)
        self.ready = True
        self.write_status()

    def await_health(self, pending: list[tuple[Program, subprocess.Popen]]) -> None:
        """Wait until each of ``pending`` answers at its health endpoint (then forget it)."""
        deadline = time.monotonic() + START_TIMEOUT
        for program, process in pending:
            while program.health and not answers(program.health):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{program.name} did not start: {self.tail(program)}")
                if self.stopping.wait(0.2):
                    raise SystemExit("stopped while starting")
        pending.clear()

    def tail(self, program: Program) -> str:
        """The last line of ``program``'s log."""
        text = (self.folder / f"{program.name}.log").read_text(errors="replace")
        lines = [line for line in text.splitlines() if line.strip()]
        return lines[-1].strip() if lines else "(its log is empty)"

    def watch(self) -> None:
        """Start again, after a moment, every program that exits."""
        lasting = [p for p in self.spec.programs if not p.once]
        while not self.stopping.wait(0.2):
            for program in lasting:
                process = self.running.get(program.name)
                if process is not None and process.poll() is not None:
                    if self.stopping.wait(RESTART_DELAY):
                        return
                    self.start(program)

    def stop(self) -> None:
        """Stop every program, the last started first; SIGKILL what lingers 10 s."""
        for program in reversed(self.spec.programs):
            process = self.running.pop(program.name, None)
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.Signals[program.stop_signal])
            try:
                process.wait(10.0)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(5.0)

    def write_status(self) -> None:
        status = {
            "ready": self.ready,
            "programs": {
                name: {"pid": process.pid, "starts": self.starts[name]}
                for name, process in self.running.items()
            },
        }
        path = self.folder / "status.json"
        path.with_suffix(".tmp").write_text(json.dumps(status))
        path.with_suffix(".tmp").replace(path)


def main(argv: list[str] | None = None) -> None:
    spec_path = Path((argv or sys.argv[1:])[0])
    spec = HostSpec.load(spec_path)
    supervisor = Supervisor(spec, read_secrets(spec_path.parent / "secrets.env"))
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: supervisor.stopping.set())
    try:
        supervisor.bring_up()
        supervisor.watch()
    finally:
        supervisor.stop()


if __name__ == "__main__":
    main()
