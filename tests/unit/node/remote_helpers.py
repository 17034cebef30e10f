"""Helpers of the RemoteReads unit tests (test_remote_reads*.py, test_remote_generations.py,
test_fill_spares_pool.py): in-process node cores, a master the test controls, and a source
whose pinned blocks carry chosen generations.

The master is a dict (key -> the replica it names): :class:`FakeMaster` answers the longest
present prefix and records the peer reports. :class:`DataPlanes` serves source cores and
stops them at teardown. :func:`with_generations` makes a source's data
plane send the generations the test sets (``{}``: 0 for every block, an older node that does
not know them).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from helpers import key

from kvstored.config import NodeConfig
from kvstored.node.core import NodeCore
from kvstored.node.remote import RemoteReads
from kvstored.tiers.tiered import TieredStore
from kvstored.transport.master_rpc import ClusterReplica
from kvstored.transport.tcp_server import DataPlaneServer
from kvstored.types import PinnedBlock


def make_core(node_id: str, *, block_bytes: int, dram_bytes: int = 4 << 20,
              ssd_dir: pathlib.Path | None = None) -> NodeCore:
    """A :class:`NodeCore` on a DRAM-only store (or DRAM + 4 MiB of SSD under ``ssd_dir``)
    whose largest block is ``block_bytes``; epoch 7."""
    cfg = NodeConfig(node_id=node_id, dram_size_bytes=dram_bytes, ssd_size_bytes=0,
                     max_block_bytes=block_bytes, max_batch_keys=64)
    store = TieredStore(dram_size_bytes=dram_bytes, arena_dir=None, max_block_bytes=block_bytes,
                        ssd_dir=ssd_dir, ssd_size_bytes=4 << 20 if ssd_dir else 0)
    return NodeCore(store, cfg, epoch=7)


class FakeMaster:
    """Names one replica per key; ``lookup`` answers the longest present prefix.

    Attributes:
        replicas: key -> the replica the master names.
        reports: every ``(peer, epoch, ok)`` the reads reported, in order.
        lookups: how many lookups were asked.
    """

    def __init__(self) -> None:
        self.replicas: dict[bytes, ClusterReplica] = {}
        self.reports: list[tuple[str, int, bool]] = []
        self.lookups = 0

    def lookup(self, namespace_id: bytes, keys: Sequence[bytes], local: str, timeout_s: float
               ) -> list[ClusterReplica]:
        self.lookups += 1
        out = []
        for k in keys:
            if k not in self.replicas:
                break
            out.append(self.replicas[k])
        return out

    def report(self, peer: str, epoch: int, ok: bool, timeout_s: float) -> None:
        self.reports.append((peer, epoch, ok))


class PerKeyMaster(FakeMaster):
    """Also answers per key (``lookup_each``), or None like an older master (``old``).

    A named replica's ``alternates`` are answered up to the lookup's ``max_alternates``
    (a test sets them on ``replicas``); ``avoids`` records each lookup's avoid list.
    """

    def __init__(self, *, old: bool = False) -> None:
        super().__init__()
        self.old = old
        self.each_lookups = 0
        self.avoids: list[list[str]] = []

    def lookup_each(self, namespace_id: bytes, keys: Sequence[bytes], local: str,
                    timeout_s: float, avoid: Sequence[str] = (), max_alternates: int = 0,
                    ) -> dict[int, ClusterReplica] | None:
        self.each_lookups += 1
        self.avoids.append(list(avoid))
        if self.old:
            return None
        return {i: dataclasses.replace(self.replicas[k],
                                       alternates=self.replicas[k].alternates[:max_alternates])
                for i, k in enumerate(keys) if k in self.replicas}


def with_generations(core: NodeCore, generations: dict[bytes, int],
                      exported: list[bytes] | None = None) -> None:
    """Make what ``core``'s data plane sends carry ``generations`` (absent: 0, unknown), for an
    engine GET (pinned_chunks) and a peer's GET (read_for_export) alike; the keys a peer's GET
    read are appended to ``exported`` when given."""
    inner_fn = core.pinned_chunks

    def pinned_chunks(keys: Sequence[bytes], namespace_id: bytes, *, chunk_keys: int = 64
                      ) -> Iterator[tuple[int, list[Any]]]:
        inner = inner_fn(keys, namespace_id, chunk_keys=chunk_keys)
        try:
            for start, got in inner:
                yield start, [dataclasses.replace(b, generation=generations.get(b.key, 0))
                              if isinstance(b, PinnedBlock) else b for b in got]
        finally:
            inner.close()

    core.pinned_chunks = pinned_chunks  # type: ignore[method-assign]
    inner_export = core.store.read_for_export  # a peer's GET (GET_FLAG_PEER_EXPORT)

    def read_for_export(keys: Sequence[bytes], *, namespace_id: bytes = b"") -> list[Any]:
        if exported is not None:
            exported.extend(keys)
        return [dataclasses.replace(b, generation=generations.get(b.key, 0)) if b is not None else None
                for b in inner_export(keys, namespace_id=namespace_id)]

    core.store.read_for_export = read_for_export  # type: ignore[method-assign]


class DataPlanes:
    """Source nodes' data planes started by a test; :meth:`close` stops them and closes
    their stores."""

    def __init__(self) -> None:
        self._made: list[tuple[DataPlaneServer, NodeCore]] = []

    def serve(self, core: NodeCore) -> str:
        """Start ``core``'s data plane on a port-0 loopback address; returns HOST:PORT."""
        server = DataPlaneServer(core, "127.0.0.1:0")
        self._made.append((server, core))
        return server.start()

    def close(self) -> None:
        for server, core in self._made:
            server.stop(0.0)
            core.store.close()
        self._made.clear()


def make_reads(local: NodeCore, master: FakeMaster, **kw: object) -> RemoteReads:
    """``local``'s RemoteReads (node ``dst``) asking ``master``; ``kw`` go to RemoteReads."""
    return RemoteReads(local, node_id="dst", lookup=master.lookup, report=master.report, **kw)  # type: ignore[arg-type]


def local_bytes(core: NodeCore, ids: list[int]) -> list[bytes | None]:
    """What ``core`` holds locally for blocks ``ids`` (None: absent)."""
    out = core.get_inline([key(i) for i in ids], b"", budget_bytes=1 << 30)
    return [o.value if o.found else None for o in out]


def local_fixture(block_bytes: int) -> Any:
    """A ``local`` fixture: node ``dst`` (:func:`make_core`), its store closed afterwards."""

    @pytest.fixture
    def local() -> Iterator[NodeCore]:
        core = make_core("dst", block_bytes=block_bytes)
        yield core
        core.store.close()

    return local
