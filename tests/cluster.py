"""Hosts on one machine, for tests of what crosses a network: each host is a Linux network namespace with an
interface of its own on a private subnet, joined by a veth pair to a bridge that lives in a namespace of its
own (the switch). Nothing is added to the machine's own namespace, and no address leaves the subnet.

    with Cluster(["buffer", "actor"]) as cluster:
        proc = procs.start("buffer", cluster["buffer"].command([sys.executable, ...]))
        cluster["actor"].address            # 10.77.0.2
        cluster.cut("actor"); cluster.restore("actor")   # the host's link down and up again (a partition)

Every namespace the cluster made is deleted when the block ends, also when the test fails; deleting a
namespace deletes its end of each veth pair, and with it the pair. Processes started in a host are the test's
to stop (by PID: turnstream.launch.processes.ProcessGroup). Needs root and iproute2: `cluster_unavailable()` says why
a cluster cannot be made here, for the tests to skip with.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from itertools import count

SUBNET = "10.77.0"  # private; each cluster has its own switch, so clusters never share it
_clusters = count()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def cluster_unavailable() -> str | None:
    """Why no cluster can be made on this machine, or None when one can."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on this machine"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"tsprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot make a network namespace here: {exc.stderr.strip()}"
    _ip("netns", "delete", probe)
    return None


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str
    port: str  # its veth end on the switch

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host (`ip netns exec` execs it, so its PID is the command's own)."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def get(self, url: str) -> str:
        """GET `url` from inside this host (a test's own process lives outside every host); a ConnectionError
        (tests.helpers.poll_until's "not yet") when it does not answer."""
        code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
        done = subprocess.run(self.command([sys.executable, "-c", code]), capture_output=True, text=True,
                              timeout=60)
        if done.returncode != 0:
            raise ConnectionError(f"GET {url} from {self.name}: {done.stderr.strip().splitlines()[-1:]}")
        return done.stdout


class Cluster:
    def __init__(self, names: list[str]):
        tag = f"ts{os.getpid()}x{next(_clusters)}"
        self.switch = f"{tag}-switch"
        self.hosts = {name: Host(name, f"{tag}-{name}", f"{SUBNET}.{i + 1}", f"p{i}")
                      for i, name in enumerate(names)}
        self._made: list[str] = []

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> Cluster:
        try:
            self._add_namespace(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for host in self.hosts.values():
                self._add_namespace(host.namespace)
                # both ends are created inside their namespaces: the machine's own never sees them
                _ip("link", "add", "eth0", "netns", host.namespace, "type", "veth",
                    "peer", "name", host.port, "netns", self.switch)
                _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
                _ip("-n", host.namespace, "link", "set", "eth0", "up")
                _ip("-n", host.namespace, "link", "set", "lo", "up")
                _ip("-n", self.switch, "link", "set", host.port, "master", "br0", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        for namespace in reversed(self._made):
            subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
        self._made.clear()

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)

    def cut(self, name: str) -> None:
        """The host's link goes silent: its port on the switch is down, so packets vanish without a reset."""
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "down")

    def restore(self, name: str) -> None:
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "up")

    def namespaces(self) -> list[str]:
        return list(self._made)
