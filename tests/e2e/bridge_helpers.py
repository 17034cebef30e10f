"""Several network namespaces on one Linux bridge, for the whole-system test (root only).

A :class:`BridgeNet` owns a bridge ``kvs<uid>br`` in the root namespace with the /24
``10.214.X.0`` (``X.1`` on the bridge: masters and etcd listen there), and, per
:meth:`BridgeNet.add_namespace`, a namespace ``kvs<uid>n<i>`` joined to the bridge by a veth
(``kvs<uid>n<i>a`` on the bridge, ``kvs<uid>n<i>b`` inside with ``X.<i+1>``). Every
namespace reaches the root end and every other namespace directly (one L2 segment: no
forwarding, no routes), and nothing else: traffic stays between the namespaces the test
made and the root namespace's bridge address. Names carry the test process id and a
counter, so parallel runs never collide; ``X`` is chosen among the /24s no interface of
the root namespace uses. :meth:`BridgeNet.close` deletes everything and is safe to call
twice or after a failed :meth:`BridgeNet.create`.

A namespace keeps the root's filesystem, so an engine in a namespace still reaches its
node's unix socket and shared-memory arena; only TCP is confined to the bridge.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from dataclasses import dataclass

import pytest

_counter = itertools.count(1)


def _run(args: list[str]) -> None:
    out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")


@dataclass(frozen=True, slots=True)
class BridgedNamespace:
    """One namespace on a :class:`BridgeNet`: its name and its address on the bridge."""

    name: str
    ip: str

    def exec_args(self, *args: str) -> list[str]:
        """``args`` run inside the namespace (``ip netns exec`` execs them: same pid)."""
        return ["ip", "netns", "exec", self.name, *args]


class BridgeNet:
    """A bridge in the root namespace and the namespaces attached to it."""

    def __init__(self) -> None:
        uid = f"{os.getpid() % 100000}{next(_counter)}"
        self.prefix = f"kvs{uid}"
        self.bridge = f"{self.prefix}br"
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                              timeout=30, check=True).stdout
        third = next(x for x in range(1, 255) if f"10.214.{x}." not in used)
        self.subnet = f"10.214.{third}"
        self.root_ip = f"{self.subnet}.1"
        self.namespaces: list[BridgedNamespace] = []
        self._created = False

    def create(self) -> BridgeNet:
        """Create the bridge; ``pytest.skip`` if namespaces or bridges are not available."""
        probe = subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"],
                               capture_output=True, text=True, timeout=30, check=False)
        if probe.returncode != 0:
            pytest.skip(f"cannot create a bridge (`ip link add ... type bridge` failed: "
                        f"{probe.stderr.strip()}); this test needs root and netns support")
        self._created = True
        _run(["ip", "addr", "add", f"{self.root_ip}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        return self

    def add_namespace(self) -> BridgedNamespace:
        """A new namespace on the bridge (``pytest.skip`` if ``ip netns add`` fails)."""
        i = len(self.namespaces) + 1
        ns = BridgedNamespace(f"{self.prefix}n{i}", f"{self.subnet}.{i + 1}")
        outer, inner = f"{ns.name}a", f"{ns.name}b"
        probe = subprocess.run(["ip", "netns", "add", ns.name], capture_output=True, text=True,
                               timeout=30, check=False)
        if probe.returncode != 0:
            pytest.skip(f"network namespaces unavailable (`ip netns add` failed: "
                        f"{probe.stderr.strip()}); this test needs root and netns support")
        self.namespaces.append(ns)
        for cmd in (
            ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
            ["ip", "link", "set", inner, "netns", ns.name],
            ["ip", "link", "set", outer, "master", self.bridge],
            ["ip", "link", "set", outer, "up"],
            ns.exec_args("ip", "addr", "add", f"{ns.ip}/24", "dev", inner),
            ns.exec_args("ip", "link", "set", inner, "up"),
            ns.exec_args("ip", "link", "set", "lo", "up"),
        ):
            _run(cmd)
        return ns

    def close(self) -> None:
        """Delete the namespaces, their veths and the bridge (idempotent)."""
        for ns in self.namespaces:
            subprocess.run(["ip", "link", "del", f"{ns.name}a"], capture_output=True,
                           timeout=30, check=False)
            subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=30,
                           check=False)
        self.namespaces = []
        if self._created:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30,
                           check=False)
            self._created = False
