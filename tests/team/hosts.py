"""Second hosts on one machine for the team tests: Linux network namespaces on a bridge, each with
its own address, hostname (a UTS namespace per process) and hosts file (``/etc/netns/<ns>/hosts``,
which ``ip netns exec`` mounts over ``/etc/hosts``). The root namespace holds the bridge's address
(``server``), where the stack, the git daemon and torchrun's rendezvous host listen.

Names carry the creating process's PID, so concurrent test processes never collide and the
leftovers of a killed one (its PID gone) are removed by the next ``Network`` that starts. Needs
root and iproute2 (``ip netns``) and util-linux (``unshare``); ``unavailable()`` says why not.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "tt"                                   # every namespace and link this module makes
_NAMESPACE = re.compile(rf"^{PREFIX}ns(\d+)k\d+h\d+$")
_LINK = re.compile(rf"^{PREFIX}[bv](\d+)k\d+(h\d+)?$")
NETNS_ETC = Path("/etc/netns")
_counter = itertools.count()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str:
    """Why network namespaces cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for program in ("ip", "unshare"):
        if shutil.which(program) is None:
            return f"{program} is not installed (iproute2, util-linux)"
    probe = f"{PREFIX}ns{os.getpid()}k999h9"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Delete the namespaces, links and hosts files of test processes that no longer run."""
    removed = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        match = _NAMESPACE.match(name)
        if match and not _alive(int(match.group(1))):
            _ip("netns", "delete", name, check=False)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
            removed.append(name)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        match = _LINK.match(name)
        if match and not _alive(int(match.group(1))):
            _ip("link", "delete", name, check=False)
            removed.append(name)
    return removed


def _free_subnet() -> ipaddress.IPv4Network:
    used = [ipaddress.ip_interface(word).network for line in _ip("-4", "-o", "addr").stdout.splitlines()
            for word in line.split() if "/" in word and word[0].isdigit()]
    for _ in range(500):
        subnet = ipaddress.ip_network(f"10.{random.randint(150, 199)}.{random.randint(0, 255)}.0/24")
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise RuntimeError("no free 10.150-199.x.0/24 subnet for the test network")


@dataclass
class Host:
    """One namespace: ``name`` is its hostname, resolvable from every host of the network."""

    name: str
    namespace: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run in this host's network namespace with its own hostname. The program ends up
        as the process itself (each wrapper execs), so its PID is the one to signal."""
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.name, *argv]

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **kwargs)


@dataclass
class Network:
    """A bridge in the root namespace (address ``server_address``, hostname ``server_name``) and one
    namespace per name in ``host_names``, each on a veth pair into the bridge."""

    host_names: tuple[str, ...]
    server_name: str = "team-server"
    hosts: dict[str, Host] = field(default_factory=dict)
    server_address: str = ""
    _links: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = f"{os.getpid()}k{next(_counter)}"

    def start(self) -> Network:
        remove_leftovers()
        subnet = _free_subnet()
        addresses = [str(a) for a in itertools.islice(subnet.hosts(), len(self.host_names) + 1)]
        bridge = f"{PREFIX}b{self.key}"
        try:
            _ip("link", "add", bridge, "type", "bridge")
            self._links.append(bridge)
            _ip("addr", "add", f"{addresses[0]}/{subnet.prefixlen}", "dev", bridge)
            _ip("link", "set", bridge, "up")
            self.server_address = addresses[0]
            for index, (name, address) in enumerate(zip(self.host_names, addresses[1:])):
                namespace, veth = f"{PREFIX}ns{self.key}h{index}", f"{PREFIX}v{self.key}h{index}"
                _ip("netns", "add", namespace)
                self.hosts[name] = Host(name, namespace, address)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
                self._links.append(veth)
                _ip("link", "set", veth, "master", bridge, "up")
                _ip("-n", namespace, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", "eth0")
                _ip("-n", namespace, "link", "set", "eth0", "up")
                _ip("-n", namespace, "link", "set", "lo", "up")
            table = "".join(f"{h.address}\t{h.name}\n" for h in self.hosts.values())
            table += f"{self.server_address}\t{self.server_name}\n"
            for host in self.hosts.values():
                etc = NETNS_ETC / host.namespace
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text("127.0.0.1\tlocalhost\n" + table)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for host in self.hosts.values():
            _ip("netns", "delete", host.namespace, check=False)   # takes its veth end, and so the pair
            shutil.rmtree(NETNS_ETC / host.namespace, ignore_errors=True)
        for link in reversed(self._links):
            _ip("link", "delete", link, check=False)
        self.hosts.clear()
        self._links.clear()

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
