"""Helpers of the cluster fault tests: a network namespace joined to the root one by a veth
pair, faults on that link (partition, a blackholed port), and cluster set-up.

A :class:`Netns` owns ``kvf<uid>`` (namespace) and ``kvf<uid>a``/``kvf<uid>b`` (the veth's root
and namespace ends) with the /30 ``10.213.X.0``: ``X.1`` on the root end, ``X.2`` in the
namespace. Names carry the test process id and a counter, so parallel runs never collide;
``X`` is chosen among the /30s no interface of the root namespace uses. :meth:`Netns.close`
deletes everything (the namespace's veth end goes with the namespace) and is safe to call
twice or after a failed :meth:`Netns.create`.

Faults are ``tc`` on the veth's ends: :meth:`Netns.partition` makes both ends' egress
qdisc a ``blackhole`` (interfaces stay up, so addresses stay bound and nothing sees a link
event: the peer just goes silent); :meth:`Netns.blackhole_port` drops, on the root end's
egress, the packets to one TCP port in the namespace (the SYNs of a connect, so a peer's
data plane hangs while its heartbeats flow).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import READY_TIMEOUT_S
from test_e2e_cluster import MasterProcess, NodeProcess, _nodes, _wait

_counter = itertools.count(1)


def _checked(args: list[str]) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


class Netns:
    """One network namespace, a veth pair into it and faults on that link (root only)."""

    def __init__(self) -> None:
        uid = f"{os.getpid() % 100000}{next(_counter)}"
        self.name = f"kvf{uid}"
        self.root_if = f"kvf{uid}a"
        self.ns_if = f"kvf{uid}b"
        used = _checked(["ip", "-4", "-o", "addr"]).stdout
        third = next(x for x in range(1, 255) if f"10.213.{x}." not in used)
        self.root_ip = f"10.213.{third}.1"
        self.ns_ip = f"10.213.{third}.2"
        self._created = False

    def create(self) -> Netns:
        """Create the namespace and link; ``pytest.skip`` if namespaces are not available."""
        probe = subprocess.run(["ip", "netns", "add", self.name], capture_output=True, text=True,
                               timeout=30, check=False)
        if probe.returncode != 0:
            pytest.skip(f"network namespaces unavailable (`ip netns add` failed: "
                        f"{probe.stderr.strip()}); these tests need root and netns support")
        self._created = True
        for cmd in (
            ["ip", "link", "add", self.root_if, "type", "veth", "peer", "name", self.ns_if],
            ["ip", "link", "set", self.ns_if, "netns", self.name],
            ["ip", "addr", "add", f"{self.root_ip}/30", "dev", self.root_if],
            ["ip", "link", "set", self.root_if, "up"],
            self.exec_args("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if),
            self.exec_args("ip", "link", "set", self.ns_if, "up"),
            self.exec_args("ip", "link", "set", "lo", "up"),
        ):
            _checked(cmd)
        return self

    def exec_args(self, *args: str) -> list[str]:
        """``args`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *args]

    def partition(self) -> None:
        """Drop every packet both ways on the link (no link event: the peer goes silent)."""
        _checked(["tc", "qdisc", "add", "dev", self.root_if, "root", "blackhole"])
        _checked(self.exec_args("tc", "qdisc", "add", "dev", self.ns_if, "root", "blackhole"))

    def heal(self) -> None:
        """Undo :meth:`partition` / :meth:`blackhole_port`."""
        _checked(["tc", "qdisc", "del", "dev", self.root_if, "root"])
        subprocess.run(self.exec_args("tc", "qdisc", "del", "dev", self.ns_if, "root"),
                       capture_output=True, timeout=30, check=False)

    def blackhole_port(self, port: int) -> None:
        """Drop the packets the root namespace sends to TCP ``port`` in the namespace.

        An htb root whose default class passes everything, and a class whose qdisc is a
        ``blackhole`` that a u32 filter on the destination port sends to (this kernel has
        no tc actions or netem, so no ``action drop``).
        """
        dev = ["dev", self.root_if]
        _checked(["tc", "qdisc", "add", *dev, "root", "handle", "1:", "htb", "default", "10"])
        for cls in ("1:10", "1:20"):
            _checked(["tc", "class", "add", *dev, "parent", "1:", "classid", cls, "htb",
                      "rate", "10gbit", "quantum", "60000"])
        _checked(["tc", "qdisc", "add", *dev, "parent", "1:20", "handle", "20:", "blackhole"])
        _checked(["tc", "filter", "add", *dev, "parent", "1:", "protocol", "ip", "prio", "1",
                  "u32", "match", "ip", "dst", f"{self.ns_ip}/32",
                  "match", "ip", "dport", str(port), "0xffff", "flowid", "1:20"])

    def close(self) -> None:
        """Delete the veth pair and the namespace (idempotent)."""
        if not self._created:
            return
        subprocess.run(["ip", "link", "del", self.root_if], capture_output=True, timeout=30,
                       check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30,
                       check=False)
        self._created = False


def node_in_netns(ns: Netns, workdir: Path, master: str, node_id: str) -> NodeProcess:
    """A :class:`NodeProcess` run inside ``ns``, listening on the namespace's address."""
    n = NodeProcess(workdir, master, node_id)
    n.args = ns.exec_args(*[a.replace("127.0.0.1:", f"{ns.ns_ip}:") for a in n.args])
    return n


def start_master(workdir: Path, procs: list[Any], *, lease_s: float,
                 listen_host: str = "127.0.0.1") -> MasterProcess:
    """A started :class:`MasterProcess` with ``lease_s`` listening on ``listen_host``."""
    master = MasterProcess(workdir)
    master.args[master.args.index("--node-lease-s") + 1] = str(lease_s)
    master.args[master.args.index("--listen") + 1] = f"{listen_host}:0"
    procs.append(master)
    return master.start()


def start_nodes(nodes: list[NodeProcess], procs: list[Any], env: dict[str, str]) -> None:
    """Start ``nodes`` all at once (one thread each) with ``env`` added to theirs; returns
    when every one is ready.

    Raises:
        AssertionError: a node did not become ready (the first such error).
    """
    errors: list[BaseException] = []

    def start(n: NodeProcess) -> None:
        try:
            n.start()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    for n in nodes:
        n.env.update(env)
        procs.append(n)
    threads = [threading.Thread(target=start, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(READY_TIMEOUT_S + 30)
    if errors:
        raise errors[0]


def wait_healthy(master: str, names: set[str]) -> dict[str, dict[str, Any]]:
    """Poll until exactly ``names`` are members and healthy; returns the node table."""
    return _wait(f"{sorted(names)} healthy", lambda: (
        (n := _nodes(master)) and {k for k, v in n.items() if v["health"] == "healthy"} == names
        and set(n) == names and n))
