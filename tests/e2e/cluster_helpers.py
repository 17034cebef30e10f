"""Helpers of the cluster e2e tests: real ``kvstored master`` / ``kvstored node`` processes
on port-0 loopback addresses, the ``workdir`` / ``procs`` fixtures, polls with a deadline, and
faults on a network namespace's link.

:class:`MasterProcess` and :class:`NodeProcess` wrap the daemons (the master reports its
epoch, gRPC and, with ``metrics_listen``, /metrics address on stdout). :func:`_wait` polls a
condition until ``WAIT_S``; :func:`wait_healthy` polls the master's node table.

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
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import READY_TIMEOUT_S, ServeProcess, value_for
from thread_helpers import wait_until

from kvstored import Client
from kvstored.client.master import MasterClient
from kvstored.errors import DeadlineExceeded, NotLeader, Unavailable
from kvstored.types import Tier

LEASE_S = 4.0
WAIT_S = 45.0

_counter = itertools.count(1)


class MasterProcess:
    """``python -m kvstored.cli.main master`` on a port-0 loopback address.

    Args:
        workdir: holds ``master.log`` and the master's data dir.
        metrics_listen: also serve /metrics on a port-0 loopback address (``self.metrics``,
            ``HOST:PORT``).
    """

    def __init__(self, workdir: Path, *, metrics_listen: bool = False) -> None:
        self.log_path = workdir / "master.log"
        self.args = [sys.executable, "-m", "kvstored.cli.main", "master",
                     "--listen", "127.0.0.1:0", "--data-dir", str(workdir / "master"),
                     "--node-lease-s", str(LEASE_S)]
        if metrics_listen:
            self.args += ["--metrics-listen", "127.0.0.1:0"]
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.metrics = ""
        self.events = ""  # "listening events" / "events-replay" (with --events-endpoint)
        self.events_replay = ""
        self.epoch = 0

    def start(self) -> MasterProcess:
        """Start the master; returns when it printed ``ready``.

        Raises:
            AssertionError: not ready within ``READY_TIMEOUT_S`` (the log's tail attached).
        """
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=log, text=True)
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                parts = line.split()
                if line.startswith("kvstored master epoch "):
                    self.epoch = int(parts[3])
                elif line.startswith("listening grpc "):
                    self.address = parts[2]
                elif line.startswith("listening events "):
                    self.events = parts[2]
                elif line.startswith("listening events-replay "):
                    self.events_replay = parts[2]
                elif line.startswith("listening metrics "):
                    self.metrics = parts[2].removeprefix("http://").removesuffix("/metrics")
                elif line.strip() == "ready":
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(READY_TIMEOUT_S):
            self.kill()
            raise AssertionError("kvstored master did not become ready:\n"
                                 + self.log_path.read_text()[-3000:])
        return self

    def kill(self) -> None:
        """SIGKILL the master if it runs, and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


class NodeProcess(ServeProcess):
    """``kvstored node --master ADDR`` with the same flags as the serve helper."""

    def __init__(self, workdir: Path, master: str, node_id: str, *, dram_size: str = "4MiB",
                 ssd_size: str = "64MiB") -> None:
        workdir.mkdir(exist_ok=True)
        super().__init__(workdir, node_id=node_id, dram_size=dram_size, ssd_size=ssd_size)
        self.args[self.args.index("serve")] = "node"
        self.args += ["--master", master, "--metrics-address", ""]


def _ctl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstored.cli.kvstorectl", "--address", address, *args],
        capture_output=True, text=True, timeout=60,
    )


def _nodes(master: str) -> dict[str, dict[str, Any]]:
    out = _ctl(master, "nodes", "--output", "json")
    assert out.returncode == 0, out.stderr
    return {n["node_id"]: n for n in json.loads(out.stdout)["nodes"]}


def _wait(what: str, cond: Callable[[], Any]) -> Any:
    """``cond()``'s first truthy value, polled every 0.2 s for up to ``WAIT_S``."""
    return wait_until(cond, WAIT_S, what, interval_s=0.2)


def _where(m: MasterClient, keys: list[bytes]) -> dict[bytes, tuple[str, Tier]]:
    """Per key (each looked up alone): the node and tier of its best replica, if any."""
    out = {}
    for k in keys:
        got, _ = m.lookup_prefix(b"", [k])
        if got:
            out[k] = (got[0].node_id, got[0].tier)
    return out


def _keys(n: int) -> list[bytes]:
    """``n`` random 16-byte keys."""
    return [os.urandom(16) for _ in range(n)]


def _put(node: NodeProcess, keys: list[bytes]) -> None:
    """Put ``value_for(k)`` of every key through ``node``; asserts every one is stored."""
    with Client(node.unix_address) as c:
        assert all(r.stored for r in c.put(keys, [value_for(k) for k in keys]))


def _indexed(m: MasterClient, keys: list[bytes], node_id: str) -> bool:
    """The master names ``node_id`` for every key when asked from that node."""
    got, _ = m.lookup_prefix(b"", keys, local_node_id=node_id)
    return len(got) == len(keys) and {r.node_id for r in got} == {node_id}


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


def start_master(workdir: Path, procs: list[Any], *, lease_s: float | None = None,
                 listen_host: str = "127.0.0.1", metrics_listen: bool = False) -> MasterProcess:
    """A started :class:`MasterProcess` (added to ``procs``) with ``lease_s`` (None:
    ``LEASE_S``) listening on ``listen_host``."""
    master = MasterProcess(workdir, metrics_listen=metrics_listen)
    if lease_s is not None:
        master.args[master.args.index("--node-lease-s") + 1] = str(lease_s)
    master.args[master.args.index("--listen") + 1] = f"{listen_host}:0"
    procs.append(master)
    return master.start()


def start_each(nodes: list[NodeProcess], procs: list[Any]) -> None:
    """Start ``nodes`` one after the other (each added to ``procs`` first)."""
    for n in nodes:
        procs.append(n)
        n.start()


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


def ha_master(workdir: Path, name: str, etcd_url: str, *, prefix: str,
              election_lease_s: int = 3, lease_s: float = LEASE_S) -> MasterProcess:
    """A :class:`MasterProcess` (not started) electing through ``etcd_url`` under ``prefix``
    (its files in ``workdir/name``); several with one prefix: one leads."""
    d = workdir / name
    d.mkdir()
    m = MasterProcess(d)
    m.args[m.args.index("--node-lease-s") + 1] = str(lease_s)
    m.args += ["--etcd", etcd_url, "--election-prefix", prefix,
               "--election-lease-s", str(election_lease_s)]
    return m


def leader_of(addresses: str) -> tuple[str, int]:
    """The leader's address and term, as a client given every master finds it (("", 0):
    none of them leads right now)."""
    with MasterClient(addresses, timeout_s=2) as m:
        try:
            m.list_nodes()
        except (NotLeader, Unavailable, DeadlineExceeded):
            return "", 0
        return m.address, m.fence.term
