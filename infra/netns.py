"""Hosts as Linux network namespaces, joined by a bridge that lives in a namespace too.

Each host of a cluster is a namespace ``<cluster>-<host>`` with one interface, ``eth0``,
addressed in the cluster's private /24 and nothing else: no default route, so a packet for
any address outside the /24 has nowhere to go (``connect`` fails at once with "Network is
unreachable", nothing is sent). The other end of each host's veth pair is a port of the bridge
``br0`` in the namespace ``<cluster>-switch``; both ends are created inside the namespaces
(``ip -n``), so no interface, address or route of the cluster ever exists in the root
namespace, and the root namespace cannot reach the cluster nor the cluster it. A host's link
is cut and mended at its switch port, inside the switch's namespace.

Example (the names a cluster uses):
    >>> Net("elastune").namespace("node-0"), Net("elastune").port("node-0")
    ('elastune-node-0', 'v-node-0')
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

SWITCH = "switch"
BRIDGE = "br0"
HOST_LINK = "eth0"


class NetnsError(RuntimeError):
    """A namespace could not be made or used; the message says why, in one line."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; a failure raises :class:`NetnsError` with ip's own message."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def can_make_namespaces() -> str | None:
    """Why this process cannot make namespaces (not root, no ``ip``); None when it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces): run it as root"
    if shutil.which("ip") is None:
        return "needs the ip command (Debian: apt-get install iproute2)"
    return None


def namespaces() -> set[str]:
    """The named network namespaces of this machine."""
    listed = ip("netns", "list").stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


@dataclass(frozen=True)
class Net:
    """The network of cluster ``name``: host ``h`` is namespace ``<name>-h``."""

    name: str

    def namespace(self, host: str) -> str:
        return f"{self.name}-{host}"

    def port(self, host: str) -> str:
        """The host's port on the bridge, in the switch's namespace (at most 15 characters)."""
        return f"v-{host}"[:15]

    def existing(self) -> set[str]:
        """The namespaces of this cluster that exist now."""
        prefix = f"{self.name}-"
        return {ns for ns in namespaces() if ns.startswith(prefix)}

    def make_switch(self) -> None:
        switch = self.namespace(SWITCH)
        ip("netns", "add", switch)
        ip("-n", switch, "link", "add", BRIDGE, "type", "bridge")
        ip("-n", switch, "link", "set", BRIDGE, "up")

    def add_host(self, host: str, address: str, prefix: int) -> None:
        """Namespace ``host`` with ``address/prefix`` on eth0, plugged into the bridge; its
        only routes are loopback and the cluster's own subnet."""
        ns, switch, port = self.namespace(host), self.namespace(SWITCH), self.port(host)
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        # Both ends are made where they live: the pair never appears in the root namespace.
        ip(
            "-n",
            switch,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            HOST_LINK,
            "netns",
            ns,
        )
        ip("-n", switch, "link", "set", port, "master", BRIDGE)
        ip("-n", switch, "link", "set", port, "up")
        ip("-n", ns, "addr", "add", f"{address}/{prefix}", "dev", HOST_LINK)
        ip("-n", ns, "link", "set", HOST_LINK, "up")
        routes = ip("-n", ns, "route", "show").stdout
        if "default" in routes:  # nothing adds one; refuse to go on if something did
            raise NetnsError(f"{ns} has a default route: {routes.strip()}")

    def cut(self, host: str) -> None:
        """Cut ``host``'s link: its switch port goes down, inside the switch's namespace."""
        ip("-n", self.namespace(SWITCH), "link", "set", self.port(host), "down")

    def mend(self, host: str) -> None:
        ip("-n", self.namespace(SWITCH), "link", "set", self.port(host), "up")

    def pids(self, host: str) -> list[int]:
        """The processes running in ``host``'s namespace."""
        done = ip("netns", "pids", self.namespace(host), check=False)
        return [int(pid) for pid in done.stdout.split()]

    def remove(self, hosts: Iterable[str]) -> None:
        """Kill every process left in the hosts' namespaces, then delete them (and so their
        links, the bridge with the switch's); what does not exist is skipped."""
        there = self.existing()
        for host in [*hosts, SWITCH]:
            ns = self.namespace(host)
            if ns not in there:
                continue
            kill_all(lambda host=host: self.pids(host))
            ip("netns", "del", ns, check=False)


def kill_all(listed: Callable[[], list[int]], timeout: float = 10.0) -> None:
    """SIGKILL the processes ``listed()`` returns until it returns none (bounded)."""
    deadline = time.monotonic() + timeout
    while (pids := listed()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
